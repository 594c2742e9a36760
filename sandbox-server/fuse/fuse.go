// Package fuse is the sandbox's trust path: the one-shot init (sFuse), the data-socket gate,
// and the data plane's transport credentials. With the packages below it is the trust core, all
// a reviewer needs to read to check that only the agent holding the pinned key can command a
// sandbox and that the init endpoint works exactly once:
//
//   - sandbox-server/fuse: fuse.go (the Init service and the fuse), gate.go (the data
//     listener's gate), data.go (DataCredentials, the only credentials the data plane serves
//     with) and bufconn.go (its read buffer below TLS);
//   - internal/tlspin: tlspin.go (the pinned TLS 1.3 configurations and certificates);
//   - internal/coalesce: coalesce.go (the write coalescing below TLS);
//   - internal/sfuse: sfuse.go (the manager's side: one InitializeTLS call);
//   - internal/endpoint: the addresses and the host's dials that follow no link.
//
// The core imports nothing of the latency accelerators (internal/fastpath and below;
// hack/verify.sh checks it with go list -deps -test). What it guarantees:
//
//   - Before the fuse blows the data listener serves nothing: no byte is read or written on a
//     connection to it (each is closed as soon as it is accepted).
//   - The first valid InitializeTLS pins the agent's key, builds the data plane's TLS 1.3
//     configuration (tlspin.ServerConfigCert: a client certificate whose key equals the
//     pinned one, nothing else) and its credentials (DataCredentials), has Start begin the
//     data plane on them, opens the gate, and closes the init listener before the response is
//     written: once the manager has the answer, nobody can connect to the init endpoint
//     again, and no code path reopens it.
//   - A malformed request (bad key, or one Start refuses) gets INVALID_ARGUMENT and leaves
//     the fuse intact; every call after the one that blew it gets FAILED_PRECONDITION.
//   - If nobody blows the fuse within the idle TTL, Serve returns ErrIdleTimeout.
package fuse

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

var (
	// ErrIdleTimeout is Serve's error when no InitializeTLS succeeded within the idle TTL.
	ErrIdleTimeout = errors.New("not initialised within the idle TTL")
	// ErrBlown refuses every InitializeTLS after the one that blew the fuse.
	ErrBlown = errors.New("sandbox already initialised: the init fuse is blown")
	// ErrInvalid marks a malformed request; Start wraps it to refuse one.
	ErrInvalid = errors.New("invalid InitializeTLS request")
)

// Start begins the data plane when the fuse is about to blow. creds are the data plane's
// transport credentials (DataCredentials with the TLS configuration pinning the agent's key
// and Options.Data), the only ones it may serve with. Start returns serve, which the fuse runs
// on the data listener once the gate is open. An error leaves the fuse intact and must leave
// nothing started.
type Start func(ctx context.Context, req *sandboxv1.InitializeTLSRequest, creds credentials.TransportCredentials) (serve func(net.Listener), err error)

// Options configure a Fuse. Identity, IdleTTL and Start are required.
type Options struct {
	// Identity is the sandbox's certificate (tlspin.Certificate), made before the sandbox
	// joins the pool so that InitializeTLS generates no key.
	Identity tls.Certificate
	IdleTTL  time.Duration
	Start    Start
	// Data is what the data plane's credentials do beside the pinned handshake.
	Data   DataOptions
	Logger *slog.Logger
}

// Fuse is one sandbox's one-shot init and data gate.
type Fuse struct {
	o    Options
	pub  []byte
	gate *gate

	mu     sync.Mutex // guards blown and initLn
	blown  bool
	initLn net.Listener
	health *health.Server
	done   chan struct{} // closed when the fuse blows
}

// New returns a Fuse that gates dataLn. dataLn serves nothing until the fuse blows.
func New(dataLn net.Listener, o Options) (*Fuse, error) {
	switch {
	case len(o.Identity.Certificate) == 0 || o.Identity.PrivateKey == nil:
		return nil, errors.New("fuse: the sandbox's identity is required")
	case o.IdleTTL <= 0:
		return nil, errors.New("fuse: an idle TTL is required (a sandbox nobody initialises must exit)")
	case o.Start == nil:
		return nil, errors.New("fuse: a Start function is required")
	}
	signer, ok := o.Identity.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("fuse: the identity's key cannot give its public key")
	}
	pub, err := tlspin.MarshalPublicKey(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("fuse: identity: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Fuse{o: o, pub: pub, gate: newGate(dataLn), health: health.NewServer(),
		done: make(chan struct{})}, nil
}

// Serve serves the Init service (and the gRPC health service the manager pings) on initLn
// until the fuse blows, then returns nil: by then initLn is closed and the data plane is
// served on the open gate. It returns ErrIdleTimeout when nobody initialises the sandbox
// within the idle TTL, or ctx's error; either way initLn and the data listener are closed.
func (f *Fuse) Serve(ctx context.Context, initLn net.Listener) error {
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 10))
	sandboxv1.RegisterInitServer(srv, initService{f: f})
	healthpb.RegisterHealthServer(srv, f.health)
	f.mu.Lock()
	f.initLn = &closeOnce{Listener: initLn}
	f.mu.Unlock()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(f.initLn) }()

	idle := time.NewTimer(f.o.IdleTTL)
	defer idle.Stop()
	var err error
	select {
	case <-f.done:
		go f.drain(srv)
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-idle.C:
		err = ErrIdleTimeout
	case e := <-served:
		err = fmt.Errorf("serving init: %w", e)
	}
	f.mu.Lock()
	blown := f.blown
	f.blown = true // refuse a late InitializeTLS racing the exit
	f.mu.Unlock()
	if blown {
		// The fuse blew as this returned (closing initLn ends srv.Serve too).
		go f.drain(srv)
		return nil
	}
	srv.Stop()
	f.gate.Close()
	return err
}

// drain stops the init server once the fuse has blown: the listener is closed already; the
// InitializeTLS response and the open connections drain in the background.
func (f *Fuse) drain(srv *grpc.Server) { srv.GracefulStop() }

// Close closes the data listener (the data plane's own Stop closes it too).
func (f *Fuse) Close() error { return f.gate.Close() }

// blow is the one initialisation (see the package comment).
func (f *Fuse) blow(ctx context.Context, req *sandboxv1.InitializeTLSRequest) (*sandboxv1.InitializeTLSResponse, error) {
	agentKey, err := tlspin.ParsePublicKey(req.GetAgentPublicKey())
	if err != nil {
		return nil, fmt.Errorf("%w: agent public key: %w", ErrInvalid, err)
	}
	cfg, err := tlspin.ServerConfigCert(f.o.Identity, agentKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blown {
		return nil, ErrBlown
	}
	serve, err := f.o.Start(ctx, req, DataCredentials(cfg, f.o.Data))
	if err != nil {
		return nil, err
	}
	f.blown = true
	f.health.Shutdown() // NOT_SERVING on the connections that remain until they drain
	if err := f.initLn.Close(); err != nil {
		f.o.Logger.Warn("closing the init listener", "err", err)
	}
	f.gate.open()
	go serve(f.gate)
	close(f.done)
	f.o.Logger.Info("sandbox initialised; init listener closed")
	// The certificate is public (the data listener presents it to anyone who connects); it
	// goes with the key for clients that pin through a root certificate.
	return &sandboxv1.InitializeTLSResponse{SandboxPublicKey: f.pub,
		SandboxCertificate: f.o.Identity.Certificate[0]}, nil
}

type initService struct {
	sandboxv1.UnimplementedInitServer
	f *Fuse
}

// InitializeTLS blows the fuse; its errors become gRPC codes here only.
func (i initService) InitializeTLS(ctx context.Context, req *sandboxv1.InitializeTLSRequest) (*sandboxv1.InitializeTLSResponse, error) {
	resp, err := i.f.blow(ctx, req)
	if err == nil {
		return resp, nil
	}
	i.f.o.Logger.Warn("InitializeTLS refused", "err", err)
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrBlown):
		code = codes.FailedPrecondition
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return nil, status.Error(code, err.Error())
}

// closeOnce is a listener whose Close runs once (the fuse and gRPC's Stop both close it).
type closeOnce struct {
	net.Listener
	once sync.Once
	err  error
}

func (c *closeOnce) Close() error {
	c.once.Do(func() { c.err = c.Listener.Close() })
	return c.err
}
