package client

import (
	"crypto"
	"crypto/tls"
	"fmt"
	"sync"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// Key is an agent's keypair. The private half lives only in this process's memory.
type Key struct {
	signer crypto.Signer
	pub    []byte
	// cert is the key's self-signed certificate, made on the first dial and reused.
	cert func() (tls.Certificate, error)
}

// NewKey generates an Ed25519 keypair.
func NewKey() (*Key, error) {
	s, err := tlspin.GenerateKey()
	if err != nil {
		return nil, err
	}
	return KeyFromSigner(s)
}

// KeyFromSigner wraps an existing ECDSA P-256 or Ed25519 private key.
func KeyFromSigner(s crypto.Signer) (*Key, error) {
	pub, err := tlspin.MarshalPublicKey(s.Public())
	if err != nil {
		return nil, fmt.Errorf("agent key: %w", err)
	}
	return &Key{signer: s, pub: pub, cert: sync.OnceValues(func() (tls.Certificate, error) { return tlspin.Certificate(s) })}, nil
}

// PublicKey returns the DER SubjectPublicKeyInfo to send with an allocation.
func (k *Key) PublicKey() []byte { return append([]byte(nil), k.pub...) }

// Signer returns the private key, for callers that build their own TLS configuration.
func (k *Key) Signer() crypto.Signer { return k.signer }
