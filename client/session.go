package client

import (
	"bytes"
	"context"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// SessionVersion names the session document format this package writes and reads.
const SessionVersion = "fusebox.session/v1"

// Seal names how a session document carries the agent's private key.
const (
	// SealAESGCM: the PKCS#8 key sealed with AES-256-GCM under a 32-byte key the caller
	// supplies, bound to the document's sandbox (see Session.aad).
	SealAESGCM = "aes-256-gcm"
	// SealNone: the PKCS#8 key in the clear. The file's permissions are its only protection.
	SealNone = "none"
)

// SealKeySize is the length of the key that seals a session's agent key.
const SealKeySize = 32

// ErrSessionKey reports a session whose agent key cannot be opened or does not belong to it:
// a wrong seal key, a document altered after it was written, or a Key that is not the one the
// sandbox was allocated for.
var ErrSessionKey = errors.New("session: wrong key")

// ErrLeaseNotHeld reports a session whose lease the manager no longer holds: released,
// expired, or another lease token.
var ErrLeaseNotHeld = errors.New("session: the sandbox's lease is no longer held")

// Session is what another process needs to talk to an allocated sandbox directly, renew its
// lease and release it: the sandbox's address and pinned key, the lease token, and the agent
// key (sealed, in the clear, or left out for the caller's own secret store). It grants exactly
// what the allocating agent had, to whoever holds it (and, when the key is sealed, the seal
// key): keep it as secret as the agent key itself. The manager never sees it: connecting
// dials the sandbox directly, and only Renew and Release reach the manager, with the lease
// token, as they do for the allocating agent.
//
// The JSON encoding (Marshal, ParseSession) is shared with the Python SDK.
type Session struct {
	Version   string `json:"version"`
	SandboxID string `json:"sandbox_id"`
	// Endpoint is the sandbox's data-plane address, unix:///path or tcp://host:port.
	Endpoint string `json:"endpoint"`
	// SandboxPublicKey is the key the sandbox's TLS must present (DER SubjectPublicKeyInfo);
	// SandboxCertificate its self-signed certificate, for TLS stacks that pin through a root.
	SandboxPublicKey   []byte `json:"sandbox_public_key"`
	SandboxCertificate []byte `json:"sandbox_certificate,omitempty"`
	// Manager is the manager's address, where Renew and Release go. The connecting process
	// brings its own credentials for it (ConnectOptions).
	Manager    string `json:"manager"`
	LeaseToken string `json:"lease_token"`
	// AgentPublicKey is the agent key's public half (DER SubjectPublicKeyInfo): a key opened
	// from AgentKey, or given to Connect, must match it.
	AgentPublicKey []byte `json:"agent_public_key"`
	// AgentKey is the agent's private key; nil when the caller keeps it elsewhere.
	AgentKey *SessionKey `json:"agent_key,omitempty"`
}

// SessionKey is a session's agent key: Data is the PKCS#8 private key, sealed as Seal says
// (with Nonce for SealAESGCM).
type SessionKey struct {
	Seal  string `json:"seal"`
	Nonce []byte `json:"nonce,omitempty"`
	Data  []byte `json:"data"`
}

// ExportOptions say how ExportSession carries the agent key. With neither field set the key
// is left out, and the connecting process must bring it (ConnectOptions.Key).
type ExportOptions struct {
	// SealKey, SealKeySize random bytes, seals the agent key with AES-256-GCM.
	SealKey []byte
	// Plain puts the agent key in the document in the clear.
	Plain bool
}

// ExportSession returns a's session document, for Connect in another process. The manager is
// not called.
func (a *Allocation) ExportSession(o ExportOptions) (*Session, error) {
	if a.session == nil {
		return nil, errors.New("exporting session: this allocation has no session (made by an older path)")
	}
	s := *a.session
	switch {
	case o.SealKey != nil && o.Plain:
		return nil, errors.New("exporting session: SealKey and Plain both set: choose one")
	case o.SealKey != nil, o.Plain:
		der, err := x509.MarshalPKCS8PrivateKey(a.key.Signer())
		if err != nil {
			return nil, fmt.Errorf("exporting session: the agent key cannot be exported (%v): export without it and give the key to Connect", err)
		}
		if o.Plain {
			s.AgentKey = &SessionKey{Seal: SealNone, Data: der}
			break
		}
		k, err := seal(o.SealKey, s.aad(), der)
		if err != nil {
			return nil, fmt.Errorf("exporting session: %w", err)
		}
		s.AgentKey = k
	}
	return &s, nil
}

// aad is the additional data a sealed agent key is bound to: the format, the sandbox and its
// key, so that a sealed key moved into another document does not open.
func (s *Session) aad() []byte {
	var b bytes.Buffer
	b.WriteString(SessionVersion)
	b.WriteByte(0)
	b.WriteString(s.SandboxID)
	b.WriteByte(0)
	b.Write(s.SandboxPublicKey)
	return b.Bytes()
}

func aead(key []byte) (cipher.AEAD, error) {
	if len(key) != SealKeySize {
		return nil, fmt.Errorf("seal key: %d bytes, want %d", len(key), SealKeySize)
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

func seal(key, aad, plain []byte) (*SessionKey, error) {
	g, err := aead(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, g.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return &SessionKey{Seal: SealAESGCM, Nonce: nonce, Data: g.Seal(nil, nonce, plain, aad)}, nil
}

// Marshal encodes s as indented JSON.
func (s *Session) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding session: %w", err)
	}
	return append(b, '\n'), nil
}

// ParseSession decodes and checks a session document.
func ParseSession(b []byte) (*Session, error) {
	var s Session
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		return nil, fmt.Errorf("reading session: %w", err)
	}
	if s.Version != SessionVersion {
		return nil, fmt.Errorf("reading session: version %q, this client reads %q", s.Version, SessionVersion)
	}
	for _, f := range []struct {
		name    string
		missing bool
	}{
		{"sandbox_id", s.SandboxID == ""}, {"endpoint", s.Endpoint == ""}, {"sandbox_public_key", len(s.SandboxPublicKey) == 0},
		{"manager", s.Manager == ""}, {"lease_token", s.LeaseToken == ""}, {"agent_public_key", len(s.AgentPublicKey) == 0},
	} {
		if f.missing {
			return nil, fmt.Errorf("reading session: %s is missing", f.name)
		}
	}
	if k := s.AgentKey; k != nil && k.Seal != SealAESGCM && k.Seal != SealNone {
		return nil, fmt.Errorf("reading session: agent key sealed with %q, want %q or %q", k.Seal, SealAESGCM, SealNone)
	}
	return &s, nil
}

// ReadSessionFile reads and checks the session document at path.
func ReadSessionFile(path string) (*Session, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading session: %w", err)
	}
	s, err := ParseSession(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// WriteSessionFile writes s to path, readable by its owner only, replacing any file there
// whole (a temporary file renamed into place, so a reader never sees half of it).
func WriteSessionFile(path string, s *Session) error {
	b, err := s.Marshal()
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing session: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("writing session: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing session: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing session: %w", err)
	}
	return nil
}

// Key opens the session's agent key: with sealKey for a sealed one, none for one in the
// clear. A session without a key, or a key that does not open or does not match
// AgentPublicKey, is an error (ErrSessionKey for the latter two).
func (s *Session) Key(sealKey []byte) (*Key, error) {
	k := s.AgentKey
	if k == nil {
		return nil, errors.New("session: it carries no agent key: give the key (ConnectOptions.Key)")
	}
	der := k.Data
	if k.Seal == SealAESGCM {
		if sealKey == nil {
			return nil, errors.New("session: the agent key is sealed: give the seal key")
		}
		g, err := aead(sealKey)
		if err != nil {
			return nil, fmt.Errorf("session: %w", err)
		}
		if len(k.Nonce) != g.NonceSize() {
			return nil, fmt.Errorf("%w: the sealed agent key's nonce is %d bytes, not %d (the document was altered)", ErrSessionKey, len(k.Nonce), g.NonceSize())
		}
		if der, err = g.Open(nil, k.Nonce, k.Data, s.aad()); err != nil {
			return nil, fmt.Errorf("%w: the agent key does not open with this seal key (or the document was altered)", ErrSessionKey)
		}
	}
	priv, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("session: agent key: %w", err)
	}
	signer, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("session: agent key: %T is not a signing key", priv)
	}
	key, err := KeyFromSigner(signer)
	if err != nil {
		return nil, fmt.Errorf("session: agent key: %w", err)
	}
	if err := s.checkKey(key); err != nil {
		return nil, err
	}
	return key, nil
}

// checkKey returns ErrSessionKey unless key is the session's agent key.
func (s *Session) checkKey(key *Key) error {
	if !bytes.Equal(key.PublicKey(), s.AgentPublicKey) {
		return fmt.Errorf("%w: this agent key is not the one sandbox %s was allocated for", ErrSessionKey, s.SandboxID)
	}
	return nil
}

// ConnectOptions say how Connect opens a session's key and reaches its manager.
type ConnectOptions struct {
	// SealKey opens a sealed agent key.
	SealKey []byte
	// Key is the agent key, for a session that carries none.
	Key *Key
	// TokenFile, CAFile and ServerName reach a tcp:// manager (see AllocateOptions); a
	// unix:// one needs none.
	TokenFile, CAFile, ServerName string
	// Sandbox tunes the data-plane connection.
	Sandbox Options
}

// Connect talks to the sandbox of session s from this process: it opens the agent key,
// checks with the manager that the lease is still held (renewing it once), and dials the
// sandbox directly with the pinned keys. The Allocation renews the lease in the background,
// as Allocate's does; Close releases the sandbox, Detach leaves it to the lease's other
// holders. The manager learns nothing new: sFuse ran once, at the allocation.
//
// A wrong seal key or agent key is ErrSessionKey; a lease the manager no longer holds
// (released, expired) is ErrLeaseNotHeld; both are checked before the sandbox is dialed.
func Connect(ctx context.Context, s *Session, o ConnectOptions) (*Allocation, error) {
	key := o.Key
	if key == nil {
		var err error
		if key, err = s.Key(o.SealKey); err != nil {
			return nil, err
		}
	} else if err := s.checkKey(key); err != nil {
		return nil, err
	}
	m, err := NewManager(s.Manager, nil, WithTokenFile(o.TokenFile), WithCAFile(o.CAFile), WithServerName(o.ServerName))
	if err != nil {
		return nil, fmt.Errorf("connecting session: %w", err)
	}
	resp, err := m.rpc.Renew(ctx, &managerv1.RenewRequest{SandboxId: s.SandboxID, LeaseToken: s.LeaseToken})
	if err != nil {
		m.Close()
		if leaseEnded(err) {
			return nil, fmt.Errorf("%w: sandbox %s: %w", ErrLeaseNotHeld, s.SandboxID, err)
		}
		return nil, fmt.Errorf("connecting session: renewing the lease of %s: %w", s.SandboxID, err)
	}
	sb, err := Dial(s.Endpoint, s.SandboxPublicKey, key, o.Sandbox)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("connecting session: %w", err)
	}
	a := &Allocation{Sandbox: sb, ID: s.SandboxID, Endpoint: s.Endpoint, mgr: m.rpc, owned: m.conn, token: s.LeaseToken,
		stop: make(chan struct{}), done: make(chan struct{}), expires: resp.GetLeaseExpires().AsTime(),
		key: key, session: s.withoutKey()}
	go a.renew(max(time.Until(a.expires)/3, 100*time.Millisecond))
	return a, nil
}

// withoutKey returns a copy of s without its agent key.
func (s *Session) withoutKey() *Session {
	c := *s
	c.AgentKey = nil
	return &c
}

// newSession is the session of an allocation made by m with resp and key.
func newSession(managerAddr string, resp *managerv1.AllocateResponse, key *Key) *Session {
	return &Session{Version: SessionVersion, SandboxID: resp.GetSandboxId(), Endpoint: resp.GetEndpoint(),
		SandboxPublicKey: resp.GetSandboxPublicKey(), SandboxCertificate: resp.GetSandboxCertificate(),
		Manager: managerAddr, LeaseToken: resp.GetLeaseToken(), AgentPublicKey: key.PublicKey()}
}
