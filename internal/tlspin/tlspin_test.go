package tlspin

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
)

func TestParsePublicKey(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 1024)
	der := func(k any) []byte {
		b, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"p256", der(&p256.PublicKey), true},
		{"ed25519", der(edPub), true},
		{"p384 refused", der(&p384.PublicKey), false},
		{"rsa refused", der(&rsaKey.PublicKey), false},
		{"empty", nil, false},
		{"garbage", []byte("not a key"), false},
		{"truncated", der(&p256.PublicKey)[:20], false},
		{"huge", make([]byte, 4096), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePublicKey(tc.in)
			if tc.ok && err != nil {
				t.Fatalf("ParsePublicKey: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrBadKey) {
				t.Fatalf("ParsePublicKey error = %v, want ErrBadKey", err)
			}
		})
	}
}

// handshake runs one TLS handshake over a real unix socket and returns the client's and
// server's errors.
func handshake(t *testing.T, srv, cli *tls.Config) (cliErr, srvErr error) {
	t.Helper()
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		a, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		s := tls.Server(a, srv)
		err = s.Handshake()
		if err == nil {
			// A TLS 1.3 client finishes before the server has checked its certificate;
			// write once so that a rejection reaches the client.
			_, err = s.Write([]byte("x"))
		}
		s.Close()
		done <- err
	}()
	b, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(b, cli)
	cliErr = c.Handshake()
	if cliErr == nil {
		buf := make([]byte, 1)
		_, cliErr = c.Read(buf)
	}
	c.Close()
	return cliErr, <-done
}

func TestPinning(t *testing.T) {
	agent, _ := GenerateKey()
	sandbox, _ := GenerateKey()
	stranger, _ := GenerateKey()
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)

	srv, err := ServerConfig(sandbox, agent.Public())
	if err != nil {
		t.Fatal(err)
	}
	good, _ := ClientConfig(agent, sandbox.Public())
	if cerr, serr := handshake(t, srv, good); cerr != nil || serr != nil {
		t.Fatalf("pinned peers: client %v, server %v", cerr, serr)
	}

	wrongClient, _ := ClientConfig(stranger, sandbox.Public())
	if _, serr := handshake(t, srv, wrongClient); !errors.Is(serr, ErrPinMismatch) {
		t.Fatalf("wrong client key: server error %v, want ErrPinMismatch", serr)
	}

	edClient, _ := ClientConfig(edKey, sandbox.Public())
	if _, serr := handshake(t, srv, edClient); !errors.Is(serr, ErrPinMismatch) {
		t.Fatalf("ed25519 stranger: server error %v, want ErrPinMismatch", serr)
	}

	noCert := good.Clone()
	noCert.Certificates, noCert.GetClientCertificate = nil, nil
	if _, serr := handshake(t, srv, noCert); serr == nil {
		t.Fatal("client without certificate was accepted")
	}

	wrongServer, _ := ClientConfig(agent, stranger.Public())
	if cerr, _ := handshake(t, srv, wrongServer); !errors.Is(cerr, ErrPinMismatch) {
		t.Fatalf("impostor server: client error %v, want ErrPinMismatch", cerr)
	}

	tls12 := good.Clone()
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if _, serr := handshake(t, srv, tls12); serr == nil {
		t.Fatal("TLS 1.2 client was accepted")
	}
}

func TestEd25519Pair(t *testing.T) {
	_, a, _ := ed25519.GenerateKey(rand.Reader)
	_, s, _ := ed25519.GenerateKey(rand.Reader)
	srv, err := ServerConfig(s, a.Public())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ClientConfig(a, s.Public())
	if err != nil {
		t.Fatal(err)
	}
	if cerr, serr := handshake(t, srv, cli); cerr != nil || serr != nil {
		t.Fatalf("ed25519 peers: client %v, server %v", cerr, serr)
	}
}

// A certificate verifies as its own only root for ServerName, as a client whose TLS stack pins
// through a root certificate (Python's grpcio) checks it, for both key types.
func TestCertificateVerifiesAsItsOwnRoot(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	for name, key := range map[string]crypto.Signer{"p256": p256, "ed25519": ed} {
		t.Run(name, func(t *testing.T) {
			c, err := Certificate(key)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := x509.ParseCertificate(c.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(cert)
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: ServerName}); err != nil {
				t.Fatalf("verifying against itself for %s: %v", ServerName, err)
			}
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "other.invalid"}); err == nil {
				t.Fatal("verified for a name it does not carry")
			}
		})
	}
}
