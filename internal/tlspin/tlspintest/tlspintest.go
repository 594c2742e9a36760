// Package tlspintest holds the table of clients that tests of a pinned data plane run: the
// pinned agent, which must be served, and the clients that must be refused; and a real
// ClientHello, for tests of requests that carry one; and a pin for hand-built TLS clients.
package tlspintest

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// Case is one client of a data plane that pins the agent's key and presents the sandbox's.
type Case struct {
	Name   string
	Config *tls.Config
	// OK says whether the call must succeed; otherwise the handshake must fail.
	OK bool
}

// Cases returns the client configurations for a data plane that pins agent's key and
// presents sandbox: the pinned agent (OK), and, all to be refused, another agent key, a
// client pinning another sandbox key, a client with no certificate, and TLS 1.2.
func Cases(t testing.TB, agent tls.Certificate, sandbox crypto.PublicKey) []Case {
	t.Helper()
	other, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	otherCert, err := tlspin.Certificate(other)
	if err != nil {
		t.Fatal(err)
	}
	config := func(cert tls.Certificate, pinned crypto.PublicKey) *tls.Config {
		cfg, err := tlspin.ClientConfigCert(cert, pinned)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	good := config(agent, sandbox)
	noCert := good.Clone()
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	tls12 := good.Clone()
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	return []Case{
		{"pinned agent", good, true},
		{"wrong agent key", config(otherCert, sandbox), false},
		{"wrong sandbox key", config(agent, other.Public()), false},
		{"no client certificate", noCert, false},
		{"TLS 1.2", tls12, false},
	}
}

// ClientHello returns the first TLS record a client with cfg sends: its ClientHello, as an
// agent of an earlier release sent it in Allocate and a manager of one in InitializeTLS.
func ClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, cfg).Handshake() // fails when s closes
		c.Close()
	}()
	header := make([]byte, 5)
	if _, err := io.ReadFull(s, header); err != nil {
		t.Fatal(err)
	}
	record := make([]byte, 5+int(binary.BigEndian.Uint16(header[3:])))
	copy(record, header)
	if _, err := io.ReadFull(s, record[5:]); err != nil {
		t.Fatal(err)
	}
	if record[0] != 0x16 || record[5] != 1 {
		t.Fatalf("first record %x...: not a ClientHello", record[:6])
	}
	return record
}

// PinServer is a tls.Config.VerifyPeerCertificate for a hand-built TLS client: it accepts
// only a server whose certificate carries exactly sandboxKey (DER SubjectPublicKeyInfo).
func PinServer(sandboxKey []byte) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no server certificate")
		}
		cert, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		if !bytes.Equal(cert.RawSubjectPublicKeyInfo, sandboxKey) {
			return errors.New("server key is not the pinned one")
		}
		return nil
	}
}
