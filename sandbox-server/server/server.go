package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/fusebox-dev/fusebox/internal/bulk"
	"github.com/fusebox-dev/fusebox/internal/cmdenv"
	"github.com/fusebox-dev/fusebox/internal/portfwd"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/envstate"
	"github.com/fusebox-dev/fusebox/sandbox-server/fuse"
	"github.com/fusebox-dev/fusebox/sandbox-server/process"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
	"github.com/fusebox-dev/fusebox/sandbox-server/watch"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
)

// afterFirstCall is how long after the first data-plane call returns Serve waits before it
// logs the allocation's timeline: long enough for the call's response to be written (by
// another goroutine, after the call returns), so that this work does not delay it.
const afterFirstCall = 2 * time.Millisecond

// ErrIdleTimeout is returned by Serve when no InitializeTLS succeeded within the idle TTL.
var ErrIdleTimeout = fuse.ErrIdleTimeout

// Limits bound what one request may cost.
type Limits struct {
	// MaxOutputBytes is the most stdout+stderr one Exec streams; the rest is discarded and
	// the exit event says so.
	MaxOutputBytes int64
	// DefaultTimeout applies to an Exec without a timeout; MaxTimeout caps any timeout.
	DefaultTimeout, MaxTimeout time.Duration
	// MaxMessageBytes is the largest gRPC message accepted (a WriteFiles batch plus framing).
	MaxMessageBytes int
	// MaxProcesses bounds the long-lived processes running at once (package process; default
	// 64), and ProcessBufferBytes the output kept of each (default 1 MiB).
	MaxProcesses       int
	ProcessBufferBytes int
	// MaxWatches bounds the watches (Watch calls) open at once (default watch.DefaultMaxWatches),
	// and MaxWatchQueue the changes one may hold for its client (default watch.DefaultMaxQueue).
	MaxWatches    int
	MaxWatchQueue int
}

// Options configure a Server. Workspace, Reaper and IdleTTL are required.
type Options struct {
	Workspace *workspace.Workspace
	// WorkspaceDir is the workspace's absolute path as commands see it: their first working
	// directory. The server sees it at the same path (Watch opens it).
	WorkspaceDir string
	Reaper       *procs.Reaper
	// CommandUser, if set, is who commands run as (see package privsep); nil runs them as
	// this process's user.
	CommandUser *procs.User
	// IdleTTL is how long the server waits for InitializeTLS before giving up.
	IdleTTL time.Duration
	// BaseEnv is the environment of the first task group.
	BaseEnv map[string]string
	// WarmUpCommands are the template's warm-up commands: WarmUp runs them, in order, as any
	// command runs, before the sandbox waits in the pool; one that fails (a non-zero exit)
	// fails the server's start. What they leave in the workspace and the environment the
	// agent finds. WarmUpTimeout bounds them together (default 5 minutes).
	WarmUpCommands []Command
	WarmUpTimeout  time.Duration
	// BaseCwd, if set, is its working directory (absolute, or relative to the workspace);
	// empty: the workspace.
	BaseCwd string
	// StartEgress, if set, is called once, when the fuse blows, with the allocation's egress
	// allowlist if it is non-empty (InitializeTLSRequest.egress): it starts the sandbox's way
	// out (the egress relay) and returns the variables commands then get (the proxy
	// variables), added to BaseEnv where it does not set them. Without an allowlist it is not
	// called: no relay runs and commands get no proxy variables. An error fails the
	// InitializeTLS and leaves the fuse intact.
	StartEgress func(allow []string) (map[string]string, error)
	Limits      Limits
	Logger      *slog.Logger
	// NoBulk, if set, refuses bulk connections (internal/bulk): the TLS handshake offers only
	// HTTP/2, and clients move large files with WriteFileStream and ReadFileStream.
	NoBulk bool
	// NoPortForward, if set, refuses port forwarding (internal/portfwd): the TLS handshake
	// does not offer it, and nothing on the sandbox's loopback can be reached from outside.
	NoPortForward bool
}

// Server is one sandbox's server. It serves one agent once.
type Server struct {
	opts  Options
	log   *slog.Logger
	state *envstate.State
	exec  *executor
	procs *process.Registry
	watch *watch.Root

	// The sandbox's identity, made before initialisation so that InitializeTLS does no key
	// generation: nothing untrusted runs in the sandbox before the fuse blows.
	cert tls.Certificate
	pub  []byte

	mu   sync.Mutex   // guards data
	data *grpc.Server // set by start when the fuse blows

	firstCall     chan struct{} // closed when the first data-plane call has returned
	firstCallOnce sync.Once
	timeline      timeline
	dataErr       chan error
	life          context.Context // Serve's: bulk connections end with it
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
	if err := cmdenv.Check(nil, opts.BaseCwd); err != nil {
		return nil, err
	}
	s := &Server{
		opts:      opts,
		log:       opts.Logger,
		state:     envstate.New(opts.BaseEnv, opts.WorkspaceDir),
		firstCall: make(chan struct{}),
		dataErr:   make(chan error, 1),
	}
	s.state.Override(nil, opts.BaseCwd)
	s.exec = newExecutor(opts.Reaper, s.state, opts.Limits, opts.Logger)
	s.exec.user = opts.CommandUser
	reg, err := process.NewRegistry(process.Options{Launch: s.exec.launch, MaxProcesses: opts.Limits.MaxProcesses,
		BufferBytes: opts.Limits.ProcessBufferBytes, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	s.procs = reg
	if s.watch, err = watch.New(watch.Options{Dir: opts.WorkspaceDir, Resolve: opts.Workspace.Resolve, Escape: workspace.ErrEscape, TempPrefix: workspace.TempPrefix,
		MaxWatches: opts.Limits.MaxWatches, MaxQueue: opts.Limits.MaxWatchQueue}); err != nil {
		return nil, err
	}
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
// ends (see package fuse). dataLn is bound by the caller before the init listener, so that a
// sandbox whose init socket exists has its data socket too, but it serves nothing before
// initialisation. Serve closes both listeners. It returns ErrIdleTimeout if nobody
// initialises the sandbox in time.
func (s *Server) Serve(ctx context.Context, initLn, dataLn net.Listener) error {
	s.life = ctx
	fo := fuse.Options{Identity: s.cert, IdleTTL: s.opts.IdleTTL, Start: s.start, Logger: s.log, Data: s.dataOptions()}
	f, err := fuse.New(dataLn, fo)
	if err != nil {
		dataLn.Close()
		initLn.Close()
		return err
	}
	defer f.Close() // the data server's Stop closes it too; Close is idempotent
	if err := f.Serve(ctx, initLn); err != nil {
		return err
	}
	// The fuse has blown and the init listener is closed. Once the agent's first call has
	// been answered, the timeline is logged.
	go func() {
		select {
		case <-s.firstCall:
			time.Sleep(afterFirstCall)
			s.timeline.log(s.log)
		case <-ctx.Done():
		}
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

// start is the server's part of the one initialisation (fuse.Start): it starts the sandbox's
// egress when the allocation has an allowlist, sets the allocation's environment and working
// directory for the commands, and builds the data plane's gRPC server on
// creds, the fuse's. A failure to start egress leaves nothing started. A ClientHello in the request (sent
// by managers of earlier releases, for an accelerator since removed) is ignored: the agent
// then makes a full handshake.
func (s *Server) start(_ context.Context, req *sandboxv1.InitializeTLSRequest, creds credentials.TransportCredentials) (func(net.Listener), error) {
	if err := cmdenv.Check(req.GetEnv(), req.GetCwd()); err != nil {
		return nil, fmt.Errorf("%w: %v", fuse.ErrInvalid, err) // refused, the fuse intact
	}
	if allow := req.GetEgress(); len(allow) > 0 && s.opts.StartEgress != nil {
		// Before the data plane opens: the agent's first command already has its way out.
		env, err := s.opts.StartEgress(allow)
		if err != nil {
			return nil, fmt.Errorf("starting egress: %w", err)
		}
		s.state.AddBase(env)
	}
	// The allocation's own environment and directory win over the sandbox's, the proxy
	// variables included: an explicit choice of the agent's.
	s.state.Override(req.GetEnv(), req.GetCwd())
	received := time.Now().UnixNano()
	data := s.newDataServer(creds, func(before bool) {
		if before {
			mark(&s.timeline.firstCallStart)
			return
		}
		mark(&s.timeline.firstCallEnded)
		s.firstCallOnce.Do(func() { close(s.firstCall) })
	})
	s.mu.Lock()
	s.data = data
	s.mu.Unlock()
	s.timeline.initReceived.Store(received)
	mark(&s.timeline.initAnswered)
	return func(ln net.Listener) { s.dataErr <- data.Serve(ln) }, nil
}

// dataOptions are the data plane's transport options (fuse.DataOptions): bulk connections
// unless NoBulk, and the handshake's marks on the allocation timeline (a measurement, logged
// once after the first call, that changes nothing of the connection).
func (s *Server) dataOptions() fuse.DataOptions {
	var o fuse.DataOptions
	if !s.opts.NoBulk {
		o.BulkProto, o.Bulk = bulk.Proto, func(c net.Conn) { s.serveBulk(s.life, c) }
	}
	if !s.opts.NoPortForward {
		o.PortProto, o.Port = portfwd.Proto, func(c net.Conn) { s.serveForward(s.life, c) }
	}
	o.Handshake = s.timeline.handshake
	return o
}

// newDataServer builds the data plane's gRPC server with creds. around, if set, runs before (true) and after (false) every call.
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
		// What gRPC hands TLS at a time, which fuse.DataCredentials sends in one write: under
		// gVisor a download's throughput follows the size of its writes (docs/performance.md).
		// One buffer per connection, made as it opens;
		// a flush touches only the pages it fills, so small calls cost no more.
		grpc.WriteBufferSize(256 << 10),
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
	sandboxv1.RegisterSandboxServer(srv, &dataService{ws: s.opts.Workspace, exec: s.exec, watch: s.watch})
	sandboxv1.RegisterProcessesServer(srv, &processService{reg: s.procs})
	return srv
}

// devNull is shared as the standard input of commands that get none.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })
