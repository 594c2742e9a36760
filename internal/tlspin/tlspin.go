// Package tlspin builds TLS 1.3 configurations in which each peer is authenticated by exact
// public-key pinning instead of a certificate authority.
//
// Each side generates its keypair in memory and wraps the key in a throwaway self-signed
// certificate only because TLS carries keys in certificates: nothing about the certificate but
// its SubjectPublicKeyInfo is trusted. A peer is accepted when the public key in the first
// certificate it presents equals the pinned key; names, dates and chains are never consulted.
package tlspin

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"sync/atomic"
	"time"
)

// ErrBadKey reports a public key that is not a DER SubjectPublicKeyInfo of a supported type
// (ECDSA P-256 or Ed25519).
var ErrBadKey = errors.New("unsupported or malformed public key")

// ErrPinMismatch reports a peer whose certificate key is not the pinned key.
var ErrPinMismatch = errors.New("peer public key does not match the pinned key")

// ServerName is the DNS name every certificate made by Certificate carries (as a subject
// alternative name). Clients whose TLS stack pins only through a root certificate (Python's
// grpcio) verify the sandbox's certificate, used as their only root, against this name; the
// .invalid top-level domain can never resolve, so the name means nothing but "the pinned
// sandbox".
const ServerName = "sandbox.fusebox.invalid"

// GenerateKey returns a new Ed25519 private key, the default for agents and sandboxes (its
// signatures and their checks are the cheapest of the supported kinds, and a handshake makes
// one of each on both sides).
func GenerateKey() (crypto.Signer, error) {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating Ed25519 key: %w", err)
	}
	return k, nil
}

// MarshalPublicKey returns the DER SubjectPublicKeyInfo of a supported public key.
func MarshalPublicKey(pub crypto.PublicKey) ([]byte, error) {
	if err := checkType(pub); err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshalling public key: %w", err)
	}
	return der, nil
}

// ParsePublicKey parses a DER SubjectPublicKeyInfo and accepts only ECDSA P-256 and Ed25519
// keys. Any other input fails with an error wrapping ErrBadKey.
func ParsePublicKey(der []byte) (crypto.PublicKey, error) {
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrBadKey)
	}
	if len(der) > 1024 {
		return nil, fmt.Errorf("%w: %d bytes is too long for a P-256 or Ed25519 key", ErrBadKey, len(der))
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	if err := checkType(pub); err != nil {
		return nil, err
	}
	return pub, nil
}

func checkType(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return fmt.Errorf("%w: ECDSA curve %s (want P-256)", ErrBadKey, k.Curve.Params().Name)
		}
		return nil
	case ed25519.PublicKey:
		return nil
	default:
		return fmt.Errorf("%w: type %T (want ECDSA P-256 or Ed25519)", ErrBadKey, pub)
	}
}

// Certificate wraps key in a self-signed certificate for use in a tls.Config. Only its public
// key matters to a pinning peer; it names ServerName for peers that verify it as a root.
func Certificate(key crypto.Signer) (tls.Certificate, error) {
	if err := checkType(key.Public()); err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "fusebox pinned key"},
		DNSNames:     []string{ServerName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signing certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// ServerConfig returns a TLS 1.3 server configuration presenting key and accepting only clients
// whose certificate carries exactly the pinned public key.
func ServerConfig(key crypto.Signer, pinnedClient crypto.PublicKey) (*tls.Config, error) {
	cert, err := Certificate(key)
	if err != nil {
		return nil, err
	}
	return ServerConfigCert(cert, pinnedClient)
}

// ServerConfigCert is ServerConfig with a certificate made earlier by Certificate.
func ServerConfigCert(cert tls.Certificate, pinnedClient crypto.PublicKey) (*tls.Config, error) {
	if err := checkType(pinnedClient); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Chains are not verified: the pin is the whole trust decision.
		ClientAuth:       tls.RequireAnyClientCert,
		VerifyConnection: verifier(pinnedClient),
		NextProtos:       []string{"h2"},
		// Full-size records from the first byte: fewer writes, and so fewer rounds through
		// gVisor, for bulk transfers.
		DynamicRecordSizingDisabled: true,
		// A sandbox serves one agent once: a resumption ticket could never be used, and
		// sending one is a write on the handshake's critical path.
		SessionTicketsDisabled: true,
	}, nil
}

// ClientConfig returns a TLS 1.3 client configuration presenting key and accepting only a server
// whose certificate carries exactly the pinned public key.
func ClientConfig(key crypto.Signer, pinnedServer crypto.PublicKey) (*tls.Config, error) {
	cert, err := Certificate(key)
	if err != nil {
		return nil, err
	}
	return ClientConfigCert(cert, pinnedServer)
}

// ClientConfigCert is ClientConfig with a certificate made earlier by Certificate (self-signing
// one costs a signature and its check, worth keeping off every dial).
func ClientConfigCert(cert tls.Certificate, pinnedServer crypto.PublicKey) (*tls.Config, error) {
	pin := &Pin{}
	if err := pin.Set(pinnedServer); err != nil {
		return nil, err
	}
	return ClientConfigPin(func() (tls.Certificate, error) { return cert, nil }, pin), nil
}

// Pin is a pinned public key that is set after the configuration checking it is made: an
// agent makes its data-plane configuration before the allocation's answer brings the
// sandbox's key.
// A peer is refused while the pin is unset. It is safe for concurrent use.
type Pin struct{ key atomic.Pointer[pinnedKey] }

type pinnedKey struct{ equaler }

// Set pins pub, which must be an ECDSA P-256 or Ed25519 key. A pin is set once; a second Set
// fails.
func (p *Pin) Set(pub crypto.PublicKey) error {
	if err := checkType(pub); err != nil {
		return err
	}
	if !p.key.CompareAndSwap(nil, &pinnedKey{pub.(equaler)}) {
		return errors.New("tlspin: pin already set")
	}
	return nil
}

// ClientConfigPin is ClientConfigCert for a server key set later through pin, with the client
// certificate made by cert when the server asks for it (so that making it overlaps the first
// round trip).
func ClientConfigPin(cert func() (tls.Certificate, error), pin *Pin) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := cert()
			if err != nil {
				return nil, err
			}
			return &c, nil
		},
		// Names and chains are not verified (the sandbox has no name a CA could vouch for);
		// VerifyConnection enforces the pin instead and always runs.
		InsecureSkipVerify: true,
		VerifyConnection: verify(func() equaler {
			if k := pin.key.Load(); k != nil {
				return k.equaler
			}
			return nil
		}),
		NextProtos: []string{"h2"},
		// Full-size records from the first byte: fewer writes, and so fewer rounds through
		// gVisor, for bulk transfers.
		DynamicRecordSizingDisabled: true,
	}
}

type equaler interface{ Equal(crypto.PublicKey) bool }

func verifier(pinned crypto.PublicKey) func(tls.ConnectionState) error {
	want := pinned.(equaler) // checkType admitted only key types with Equal.
	return verify(func() equaler { return want })
}

// verify checks the peer's first certificate against the key pinned() returns; nil refuses
// every peer. It runs as VerifyConnection, on the certificates crypto/tls has already parsed.
func verify(pinned func() equaler) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		want := pinned()
		if want == nil {
			return fmt.Errorf("%w: no key pinned yet", ErrPinMismatch)
		}
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: no certificate presented", ErrPinMismatch)
		}
		if !want.Equal(cs.PeerCertificates[0].PublicKey) {
			return ErrPinMismatch
		}
		return nil
	}
}
