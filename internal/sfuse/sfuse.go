// Package sfuse is the manager's side of the sFuse handshake: one InitializeTLS call on a
// sandbox's init listener, which pins the agent's key and returns the sandbox's. It is part of
// the trust core (see sandbox-server/fuse); the prepared connections a pool keeps to its
// units' init listeners are the latency wing's (internal/fastpath/initconns).
package sfuse

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
	// Env and Cwd are the allocation's environment variables and working directory for the
	// commands (package cmdenv checks them); empty: the sandbox's own.
	Env map[string]string
	Cwd string
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
	conn, err := Dial(initAddr)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	return InitializeOn(ctx, conn, initAddr, req)
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

// Dial makes a (lazy) connection to the init listener at initAddr. The init channel is not
// encrypted (see Initialize).
func Dial(initAddr string) (*grpc.ClientConn, error) {
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

// InitializeOn is Initialize over conn, a connection Dial made to the init listener at addr
// (which names it in errors). It leaves conn open.
func InitializeOn(ctx context.Context, conn *grpc.ClientConn, addr string, req Request) (Result, error) {
	resp, err := sandboxv1.NewInitClient(conn).InitializeTLS(ctx,
		&sandboxv1.InitializeTLSRequest{AgentPublicKey: req.AgentKey, Egress: req.Egress, Env: req.Env, Cwd: req.Cwd})
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
