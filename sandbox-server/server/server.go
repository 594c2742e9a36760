package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/fusebox-dev/fusebox/internal/tlsflight"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/envstate"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
)

// initCloseDelay bounds how long the init listener outlives the fuse when the agent makes no
// data-plane call (see Serve).
const initCloseDelay = 250 * time.Millisecond

// afterFirstCall is how long after the first data-plane call returns Serve waits before it
// closes the init listener and restores GOMAXPROCS: long enough for the call's response to be
// written (by another goroutine, after the call returns), so that this work does not delay it.
const afterFirstCall = 2 * time.Millisecond

// ErrIdleTimeout is returned by Serve when no InitializeTLS succeeded within the idle TTL.
var ErrIdleTimeout = errors.New("not initialised within the idle TTL")

var errAlreadyInitialised = errors.New("sandbox already initialised: the init fuse is blown")

// Limits bound what one request may cost.
type Limits struct {
	// MaxOutputBytes is the most stdout+stderr one Exec streams; the rest is discarded and
	// the exit event says so.
	MaxOutputBytes int64
	// DefaultTimeout applies to an Exec without a timeout; MaxTimeout caps any timeout.
	DefaultTimeout, MaxTimeout time.Duration
	// MaxMessageBytes is the largest gRPC message accepted (a WriteFiles batch plus framing).
	MaxMessageBytes int
}

// Options configure a Server. Workspace, Reaper and IdleTTL are required.
type Options struct {
	Workspace *workspace.Workspace
	// WorkspaceDir is the workspace's absolute path as commands see it: their first working
	// directory.
	WorkspaceDir string
	Reaper       *procs.Reaper
	// CommandUser, if set, is who commands run as (see package privsep); nil runs them as
	// this process's user.
	CommandUser *procs.User
	// IdleTTL is how long the server waits for InitializeTLS before giving up.
	IdleTTL time.Duration
	// BaseEnv is the environment of the first task group.
	BaseEnv map[string]string
	// StartEgress, if set, is called once, when the fuse blows, with the allocation's egress
	// allowlist if it is non-empty (InitializeTLSRequest.egress): it starts the sandbox's way
	// out (the egress relay) and returns the variables commands then get (the proxy
	// variables), added to BaseEnv where it does not set them. Without an allowlist it is not
	// called: no relay runs and commands get no proxy variables. An error fails the
	// InitializeTLS and leaves the fuse intact.
	StartEgress func(allow []string) (map[string]string, error)
	Limits      Limits
	Logger      *slog.Logger
	// PoolProcs, if positive, is the process's GOMAXPROCS from Serve until the agent's first
	// data-plane call has been answered; the previous value is restored then. Under gVisor a
	// goroutine hand-off between threads is a futex system call through the sentry on each
	// side, and an allocation is a chain of such hand-offs (request, TLS, handler, response)
	// in a sandbox that was idle: with one P they stay on one thread (the allocation's
	// sandbox-side steps measured 0.5 ms shorter, fusebox-bench allocate). The agent's bulk
	// work after that gets every P. It is process-wide: set it only in a process that serves
	// one sandbox.
	PoolProcs int
}

// Server is one sandbox's server. It serves one agent once.
type Server struct {
	opts  Options
	log   *slog.Logger
	state *envstate.State
	exec  *executor

	// The sandbox's identity, made before initialisation so that InitializeTLS does no key
	// generation: nothing untrusted runs in the sandbox before the fuse blows.
	cert tls.Certificate
	pub  []byte

	dataLn *gate // set by Serve before the init listener is served

	mu      sync.Mutex // guards blown, data and pending
	blown   bool
	data    *grpc.Server
	pending *tlsflight.Pending // the relayed handshake the agent's first connection continues
	blownCh chan struct{}      // closed once the fuse has blown

	firstCall     chan struct{} // closed when the first data-plane call has returned
	firstCallOnce sync.Once
	timeline      timeline
	dataErr       chan error
}

// New checks opts and returns a Server.
func New(opts Options) (*Server, error) {
	switch {
	case opts.Workspace == nil:
		return nil, errors.New("server: a workspace is required")
	case opts.Reaper == nil:
		return nil, errors.New("server: a reaper is required")
	case opts.IdleTTL <= 0:
		return nil, errors.New("server: an idle TTL is required (a sandbox nobody initialises must exit)")
	case opts.WorkspaceDir == "":
		return nil, errors.New("server: the workspace directory is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l := &opts.Limits
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = 16 << 20
	}
	if l.DefaultTimeout <= 0 {
		l.DefaultTimeout = 10 * time.Minute
	}
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = 24 * time.Hour
	}
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = 8 << 20
	}
	s := &Server{
		opts:      opts,
		log:       opts.Logger,
		state:     envstate.New(opts.BaseEnv, opts.WorkspaceDir),
		blownCh:   make(chan struct{}),
		firstCall: make(chan struct{}),
		dataErr:   make(chan error, 1),
	}
	s.exec = newExecutor(opts.Reaper, s.state, opts.Limits, opts.Logger)
	s.exec.user = opts.CommandUser
	key, err := tlspin.GenerateKey()
	if err != nil {
		return nil, err
	}
	if s.cert, err = tlspin.Certificate(key); err != nil {
		return nil, err
	}
	if s.pub, err = tlspin.MarshalPublicKey(key.Public()); err != nil {
		return nil, err
	}
	return s, nil
}

// Serve serves Init on initLn until the fuse blows, then the data plane on dataLn until ctx
// ends. dataLn is bound by the caller before the init listener, so that a sandbox whose init
// socket exists has its data socket too, but it serves nothing before initialisation: until
// the fuse blows every connection to it is closed unserved (see gate). Serve closes both
// listeners. It returns ErrIdleTimeout if nobody initialises the sandbox in time.
func (s *Server) Serve(ctx context.Context, initLn, dataLn net.Listener) error {
	restoreProcs := func() {}
	if s.opts.PoolProcs > 0 {
		prev := runtime.GOMAXPROCS(s.opts.PoolProcs)
		var once sync.Once
		restoreProcs = func() { once.Do(func() { runtime.GOMAXPROCS(prev) }) }
	}
	defer restoreProcs()
	s.dataLn = newGate(dataLn)
	defer s.dataLn.Close() // the data server's Stop closes it too; Close is idempotent
	initSrv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 10))
	sandboxv1.RegisterInitServer(initSrv, &initService{s: s})
	// The manager pings the unit its next allocation will take, to find a dead one early.
	healthpb.RegisterHealthServer(initSrv, health.NewServer())
	initErr := make(chan error, 1)
	go func() { initErr <- initSrv.Serve(initLn) }()

	idle := time.NewTimer(s.opts.IdleTTL)
	defer idle.Stop()
	select {
	case <-ctx.Done():
		initSrv.Stop()
		return ctx.Err()
	case <-idle.C:
		s.mu.Lock()
		blown := s.blown
		if !blown {
			s.blown = true // refuse a late InitializeTLS racing the exit
		}
		s.mu.Unlock()
		if !blown {
			initSrv.Stop()
			return ErrIdleTimeout
		}
		<-s.blownCh
	case err := <-initErr:
		return fmt.Errorf("serving init: %w", err)
	case <-s.blownCh:
	}
	// The fuse has blown: initialize refuses every later call whatever the listener's state.
	// Closing the listener (an unlink on the host, through the gofer) and the manager's
	// connection is work for this sandbox's few cores, so it waits until the agent's first
	// data-plane call has been answered (or a short while has passed) instead of competing
	// with the agent's TLS handshake. GracefulStop lets the InitializeTLS response reach the
	// manager, then closes the listener (and unlinks its socket) for good.
	select {
	case <-s.firstCall:
		time.Sleep(afterFirstCall)
		s.timeline.log(s.log)
	case <-time.After(initCloseDelay):
	case <-ctx.Done():
	}
	restoreProcs()
	initSrv.GracefulStop()
	s.log.Info("sandbox initialised; init listener closed")
	// A relayed handshake nobody continued (the agent fell back to a full one, or never
	// came) is dropped once the agent has made a call, or after a while.
	defer s.abandonPending()
	go func() {
		select {
		case <-s.firstCall:
		case <-time.After(pendingTTL):
		case <-ctx.Done():
			return // the deferred call drops it
		}
		s.abandonPending()
	}()

	select {
	case <-ctx.Done():
		s.mu.Lock()
		s.data.Stop()
		s.mu.Unlock()
		return ctx.Err()
	case err := <-s.dataErr:
		return fmt.Errorf("serving data plane: %w", err)
	}
}

// initialize performs the one initialisation: it pins agentKey, answers the agent's relayed
// ClientHello if there is one, opens the data listener's gate and starts the data plane. It
// returns the sandbox's public key and its TLS flight. A bad key or ClientHello leaves the
// fuse intact.
func (s *Server) initialize(ctx context.Context, agentDER, hello []byte, allow []string) (pub, flight []byte, err error) {
	agentKey, err := tlspin.ParsePublicKey(agentDER)
	if err != nil {
		return nil, nil, fmt.Errorf("agent public key: %w", err)
	}
	cfg, err := tlspin.ServerConfigCert(s.cert, agentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("building TLS config: %w", err)
	}
	var pending *tlsflight.Pending
	if len(hello) > 0 {
		if flight, pending, err = tlsflight.Answer(ctx, cfg, hello); err != nil {
			return nil, nil, errors.Join(errInvalid, fmt.Errorf("TLS ClientHello: %w", err))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blown {
		if pending != nil {
			pending.Abort()
		}
		return nil, nil, errAlreadyInitialised
	}
	if len(allow) > 0 && s.opts.StartEgress != nil {
		// Before the data plane opens: the agent's first command already has its way out.
		env, err := s.opts.StartEgress(allow)
		if err != nil {
			if pending != nil {
				pending.Abort()
			}
			return nil, nil, fmt.Errorf("starting egress: %w", err)
		}
		s.state.AddBase(env)
	}
	creds := timedCreds{tlsflight.ServerCredentials(cfg, s.takePending), &s.timeline}
	data := s.newDataServer(creds, func(before bool) {
		if before {
			mark(&s.timeline.firstCallStart)
			return
		}
		mark(&s.timeline.firstCallEnded)
		s.firstCallOnce.Do(func() { close(s.firstCall) })
	})
	s.dataLn.Open()
	s.blown, s.data, s.pending = true, data, pending
	go func() { s.dataErr <- data.Serve(bufferedListener{s.dataLn}) }()
	close(s.blownCh)
	return s.pub, flight, nil
}

// pendingTTL bounds how long a relayed handshake waits for the agent's connection.
const pendingTTL = 30 * time.Second

// takePending hands the relayed handshake to the first connection that continues one.
func (s *Server) takePending() *tlsflight.Pending {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending
	s.pending = nil
	return p
}

func (s *Server) abandonPending() {
	if p := s.takePending(); p != nil {
		p.Abort()
	}
}

// newDataServer builds the data plane's gRPC server with creds, to serve on a
// bufferedListener. around, if set, runs before (true) and after (false) every call.
func (s *Server) newDataServer(creds credentials.TransportCredentials, around func(before bool)) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.Creds(creds),
		grpc.MaxRecvMsgSize(s.opts.Limits.MaxMessageBytes),
		grpc.MaxSendMsgSize(s.opts.Limits.MaxMessageBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Large windows: a 3.5 MiB batch should not wait for flow-control round trips.
		grpc.InitialWindowSize(8 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		grpc.ReadBufferSize(32 << 10),
		grpc.WriteBufferSize(32 << 10),
	}
	if around != nil {
		opts = append(opts,
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				around(true)
				defer around(false)
				return h(ctx, req)
			}),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				around(true)
				defer around(false)
				return h(srv, ss)
			}))
	}
	srv := grpc.NewServer(opts...)
	sandboxv1.RegisterSandboxServer(srv, &dataService{ws: s.opts.Workspace, exec: s.exec})
	return srv
}

type initService struct {
	sandboxv1.UnimplementedInitServer
	s *Server
}

func (i *initService) InitializeTLS(ctx context.Context, req *sandboxv1.InitializeTLSRequest) (*sandboxv1.InitializeTLSResponse, error) {
	received := time.Now().UnixNano()
	pub, flight, err := i.s.initialize(ctx, req.GetAgentPublicKey(), req.GetTlsClientHello(), req.GetEgress())
	if err != nil {
		i.s.log.Warn("InitializeTLS refused", "err", err)
		return nil, toStatus(err)
	}
	i.s.timeline.initReceived.Store(received) // only one call succeeds
	mark(&i.s.timeline.initAnswered)
	// The certificate is public (the data listener presents it to anyone who connects); it
	// goes with the key for clients that pin through a root certificate.
	return &sandboxv1.InitializeTLSResponse{SandboxPublicKey: pub, TlsServerFlight: flight,
		SandboxCertificate: i.s.cert.Certificate[0]}, nil
}

// devNull is shared as the standard input of commands that get none.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })
