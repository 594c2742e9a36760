// Package sfuse is the manager's side of the sFuse handshake: one InitializeTLS call on a
// sandbox's init listener, which pins the agent's key and returns the sandbox's.
package sfuse

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Request is what sFuse sends a sandbox.
type Request struct {
	// AgentKey is the agent's public key, DER SubjectPublicKeyInfo.
	AgentKey []byte
	// Egress is the allocation's egress allowlist, for the sandbox's set-up (its relay and
	// proxy variables start only with a non-empty one); the sandbox enforces nothing.
	Egress []string
}

// Result is the sandbox's answer.
type Result struct {
	// SandboxKey is the sandbox's public key, DER SubjectPublicKeyInfo.
	SandboxKey []byte
	// SandboxCertificate is the sandbox's self-signed certificate (DER), relayed for agents
	// that pin through a root certificate; they check that its key is SandboxKey. Empty from
	// a sandbox that sends none.
	SandboxCertificate []byte
}

// Initialize calls InitializeTLS on the sandbox's init listener at initAddr and returns the
// sandbox's answer. The init channel carries no secrets (public keys and the clear or
// encrypted messages of a TLS handshake only) and is reachable only by the manager, so it is
// not encrypted. Nothing is kept: the caller hands the result to the agent.
func Initialize(ctx context.Context, initAddr string, req Request) (Result, error) {
	conn, err := dial(initAddr)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	return initialize(ctx, conn, initAddr, req)
}

// ErrRefused reports an InitializeTLS the sandbox refused as malformed (INVALID_ARGUMENT):
// the request's fault, which another sandbox would refuse too. The fuse is intact.
var ErrRefused = errors.New("the sandbox refused the request")

// ErrBlown reports a sandbox initialised already (FAILED_PRECONDITION): its fuse was blown
// by an earlier InitializeTLS, which may have been another manager replica's.
var ErrBlown = errors.New("the sandbox was initialised already")

// refused is the sandbox's INVALID_ARGUMENT or FAILED_PRECONDITION: it matches is
// (ErrRefused or ErrBlown) and unwraps to the status.
type refused struct {
	error
	is error
}

func (r refused) Is(target error) bool { return target == r.is }
func (r refused) Unwrap() error        { return r.error }

// MaxCertificateBytes bounds the sandbox certificate relayed to the agent: a self-signed
// P-256 or Ed25519 certificate is a few hundred bytes.
const MaxCertificateBytes = 4 << 10

// initBufferBytes sizes the init connection's read and write buffers; a larger message
// passes through in several reads or writes.
const initBufferBytes = 8 << 10

// dial makes a (lazy) connection to the init listener at initAddr. The init channel is not
// encrypted (see Initialize).
func dial(initAddr string) (*grpc.ClientConn, error) {
	a, err := endpoint.Parse(initAddr)
	if err != nil {
		return nil, fmt.Errorf("init address: %w", err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Its messages are a few hundred bytes (keys, a certificate): gRPC's 32 KiB buffers
		// would be most of the garbage of the connection the manager makes per unit.
		grpc.WithReadBufferSize(initBufferBytes), grpc.WithWriteBufferSize(initBufferBytes)}
	if a.Network == "unix" {
		// Never through a link the sandbox may have put at its socket's name.
		opts = append(opts, grpc.WithContextDialer(a.DialContext))
	}
	conn, err := grpc.NewClient(a.GRPCTarget(), opts...)
	if err != nil {
		return nil, fmt.Errorf("dialing init listener %s: %w", a, err)
	}
	return conn, nil
}

func initialize(ctx context.Context, conn *grpc.ClientConn, addr string, req Request) (Result, error) {
	resp, err := sandboxv1.NewInitClient(conn).InitializeTLS(ctx,
		&sandboxv1.InitializeTLSRequest{AgentPublicKey: req.AgentKey, Egress: req.Egress})
	switch status.Code(err) {
	case codes.InvalidArgument:
		err = refused{err, ErrRefused}
	case codes.FailedPrecondition:
		err = refused{err, ErrBlown}
	}
	if err != nil {
		return Result{}, fmt.Errorf("InitializeTLS on %s: %w", addr, err)
	}
	if _, err := tlspin.ParsePublicKey(resp.GetSandboxPublicKey()); err != nil {
		return Result{}, fmt.Errorf("InitializeTLS on %s returned a bad key: %w", addr, err)
	}
	if n := len(resp.GetSandboxCertificate()); n > MaxCertificateBytes {
		return Result{}, fmt.Errorf("InitializeTLS on %s returned a certificate of %d bytes (at most %d)", addr, n, MaxCertificateBytes)
	}
	return Result{SandboxKey: resp.GetSandboxPublicKey(),
		SandboxCertificate: resp.GetSandboxCertificate()}, nil
}

// Conns prepares the connection to a unit's init listener while the unit waits in the warm
// pool, so that an allocation does not pay for connection setup: on the allocation path only
// the InitializeTLS call itself remains. It is safe for concurrent use.
type Conns struct {
	mu sync.Mutex // guards m
	m  map[string]*grpc.ClientConn
}

// Prepare starts connecting to initAddr in the background.
func (c *Conns) Prepare(initAddr string) {
	conn, err := dial(initAddr)
	if err != nil {
		return // Initialize reports it
	}
	conn.Connect()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*grpc.ClientConn{}
	}
	if old := c.m[initAddr]; old != nil {
		old.Close()
	}
	c.m[initAddr] = conn
}

// Forget closes the prepared connection to initAddr, if any.
func (c *Conns) Forget(initAddr string) {
	c.mu.Lock()
	conn := c.m[initAddr]
	delete(c.m, initAddr)
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// closeDelay is how long a prepared connection stays open after its InitializeTLS.
const closeDelay = 500 * time.Millisecond

// Initialize is Initialize over the prepared connection when there is one.
func (c *Conns) Initialize(ctx context.Context, initAddr string, req Request) (Result, error) {
	c.mu.Lock()
	conn := c.m[initAddr]
	delete(c.m, initAddr)
	c.mu.Unlock()
	if conn == nil {
		return Initialize(ctx, initAddr, req)
	}
	// Closed a little later, off the allocation path: the sandbox drains its end as soon as
	// it has answered (its init listener is closed by then), and a close from this side now
	// would be more work for the sandbox during the agent's handshake.
	defer time.AfterFunc(closeDelay, func() { conn.Close() })
	return initialize(ctx, conn, initAddr, req)
}

// conn returns the prepared connection to initAddr, kept after use, or else a connection made
// for this use; done closes the latter.
func (c *Conns) conn(initAddr string) (conn *grpc.ClientConn, done func(), err error) {
	c.mu.Lock()
	conn = c.m[initAddr]
	c.mu.Unlock()
	if conn != nil {
		return conn, func() {}, nil
	}
	if conn, err = dial(initAddr); err != nil {
		return nil, nil, err
	}
	return conn, func() { conn.Close() }, nil
}

// Identity is a sandbox's public identity: what InitializeTLS will return of it.
type Identity struct {
	// SandboxKey is the sandbox's public key, DER SubjectPublicKeyInfo.
	SandboxKey []byte
	// SandboxCertificate is its self-signed certificate (DER), whose key is SandboxKey.
	SandboxCertificate []byte
}

// Identify asks the sandbox at initAddr for its identity without initialising it (the Init
// service's Identity call), over the prepared connection when there is one. It checks that
// the certificate carries the key, so that what the manager names to an agent before sFuse
// is consistent; the agent checks it again, and the answer after sFuse must match it.
func (c *Conns) Identify(ctx context.Context, initAddr string) (Identity, error) {
	conn, done, err := c.conn(initAddr)
	if err != nil {
		return Identity{}, err
	}
	defer done()
	resp, err := sandboxv1.NewInitClient(conn).Identity(ctx, &sandboxv1.IdentityRequest{})
	if err != nil {
		return Identity{}, fmt.Errorf("asking %s for its identity: %w", initAddr, err)
	}
	id := Identity{SandboxKey: resp.GetSandboxPublicKey(), SandboxCertificate: resp.GetSandboxCertificate()}
	if err := id.check(); err != nil {
		return Identity{}, fmt.Errorf("identity of %s: %w", initAddr, err)
	}
	return id, nil
}

// check reports whether the key is one the agent can pin and the certificate carries it.
func (id Identity) check() error {
	if _, err := tlspin.ParsePublicKey(id.SandboxKey); err != nil {
		return fmt.Errorf("bad key: %w", err)
	}
	if n := len(id.SandboxCertificate); n == 0 || n > MaxCertificateBytes {
		return fmt.Errorf("a certificate of %d bytes (want 1 to %d)", n, MaxCertificateBytes)
	}
	cert, err := x509.ParseCertificate(id.SandboxCertificate)
	if err != nil {
		return fmt.Errorf("certificate: %w", err)
	}
	if !bytes.Equal(cert.RawSubjectPublicKeyInfo, id.SandboxKey) {
		return errors.New("the certificate does not carry the sandbox's key")
	}
	return nil
}

// Ping checks that the init listener at initAddr answers (the gRPC health service, which a
// sandbox serves there until its fuse blows), over the prepared connection when there is one.
// The manager pings the unit its next allocation will take, to find a dead one before an
// agent does.
func (c *Conns) Ping(ctx context.Context, initAddr string) error {
	conn, done, err := c.conn(initAddr)
	if err != nil {
		return err
	}
	defer done()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("pinging %s: %w", initAddr, err)
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("pinging %s: %v", initAddr, s)
	}
	return nil
}
