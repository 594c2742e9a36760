package fuse

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/internal/tlspin/tlspintest"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// sandbox is a Fuse on unix sockets in a temp dir whose data plane is the gRPC health
// service over the credentials the fuse gives Start (DataCredentials, no options).
type sandbox struct {
	initPath, dataPath string
	serveErr           chan error
	started            chan struct{} // closed when Start succeeded
}

func startFuse(t *testing.T, ttl time.Duration, refuse func(*sandboxv1.InitializeTLSRequest) error) *sandbox {
	t.Helper()
	dir := t.TempDir()
	sb := &sandbox{initPath: filepath.Join(dir, "init.sock"), dataPath: filepath.Join(dir, "data.sock"),
		serveErr: make(chan error, 1), started: make(chan struct{})}
	dataLn, err := net.Listen("unix", sb.dataPath)
	if err != nil {
		t.Fatal(err)
	}
	initLn, err := net.Listen("unix", sb.initPath)
	if err != nil {
		t.Fatal(err)
	}
	key, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	id, err := tlspin.Certificate(key)
	if err != nil {
		t.Fatal(err)
	}
	var data *grpc.Server
	var mu sync.Mutex
	start := func(_ context.Context, req *sandboxv1.InitializeTLSRequest, creds credentials.TransportCredentials) (func(net.Listener), error) {
		if refuse != nil {
			if err := refuse(req); err != nil {
				return nil, err
			}
		}
		srv := grpc.NewServer(grpc.Creds(creds))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		mu.Lock()
		data = srv
		mu.Unlock()
		close(sb.started)
		return func(ln net.Listener) { srv.Serve(ln) }, nil
	}
	f, err := New(dataLn, Options{Identity: id, IdleTTL: ttl, Start: start})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { sb.serveErr <- f.Serve(ctx, initLn) }()
	t.Cleanup(func() {
		cancel()
		mu.Lock()
		if data != nil {
			data.Stop()
		}
		mu.Unlock()
		f.Close()
	})
	return sb
}

func (sb *sandbox) init(ctx context.Context, agent []byte) (sfuse.Result, error) {
	return sfuse.Initialize(ctx, "unix://"+sb.initPath, sfuse.Request{AgentKey: agent})
}

// call makes one data-plane call with cfg, reporting the error.
func (sb *sandbox) call(ctx context.Context, cfg *tls.Config) error {
	conn, err := grpc.NewClient("unix://"+sb.dataPath, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// servesNothing checks that a connection to the data socket is closed with nothing read or
// written.
func servesNothing(t *testing.T, path string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dialing the data socket: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("\x16\x03\x01\x00\x05hello")) // may fail: the gate may have closed it already
	if n, err := c.Read(make([]byte, 64)); n != 0 || !closedUnserved(err) {
		t.Fatalf("data socket before init: read %d bytes, %v; want it closed unserved", n, err)
	}
}

func closedUnserved(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

func newKey(t *testing.T) (crypto.Signer, []byte) {
	t.Helper()
	k, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := tlspin.MarshalPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return k, der
}

func TestNewRefusesMissingOptions(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	k, _ := newKey(t)
	id, _ := tlspin.Certificate(k)
	start := func(context.Context, *sandboxv1.InitializeTLSRequest, credentials.TransportCredentials) (func(net.Listener), error) {
		return nil, nil
	}
	for name, o := range map[string]Options{
		"no identity": {IdleTTL: time.Minute, Start: start},
		"no idle TTL": {Identity: id, Start: start},
		"no start":    {Identity: id, IdleTTL: time.Minute},
	} {
		if _, err := New(ln, o); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// The fuse blows exactly once: malformed requests are refused and change nothing, the valid
// one pins the key, and by the time its answer is back the init socket is gone for good.
func TestFuseBlowsOnce(t *testing.T) {
	errRefused := errors.New("refused by Start")
	sb := startFuse(t, time.Minute, func(req *sandboxv1.InitializeTLSRequest) error {
		if len(req.GetEgress()) > 0 {
			return errors.Join(ErrInvalid, errRefused)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	servesNothing(t, sb.dataPath)
	// A connection made before the fuse blows, as the manager's prepared one is.
	conns := prepare(t, "unix://"+sb.initPath)
	if err := conns.Ping(ctx); err != nil {
		t.Fatalf("ping before init: %v", err)
	}
	// Identity, which a manager of an earlier release asks for, is not served.
	if err := conns.Identify(ctx); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Identity before init: %v, want Unimplemented", err)
	}
	servesNothing(t, sb.dataPath)
	agent, agentDER := newKey(t)
	for _, req := range []sfuse.Request{
		{AgentKey: []byte("garbage")},
		{},
		{AgentKey: agentDER, Egress: []string{"refused.example:443"}},
	} {
		_, err := sfuse.Initialize(ctx, "unix://"+sb.initPath, req)
		if status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
			t.Fatalf("malformed init %+v: %v, want InvalidArgument", req, err)
		}
		servesNothing(t, sb.dataPath) // the fuse is intact
	}
	res, err := sb.init(ctx, agentDER)
	if err != nil {
		t.Fatalf("init after malformed ones: %v", err)
	}
	// The guarantee: the init listener was closed before the response was written.
	if _, err := os.Stat(sb.initPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("init socket after InitializeTLS answered: %v, want it removed", err)
	}
	if c, err := net.Dial("unix", sb.initPath); err == nil {
		c.Close()
		t.Fatal("dialing the init socket after InitializeTLS answered succeeded")
	}
	// On a connection made before, a second init is refused.
	other, otherDER := newKey(t)
	if _, err := conns.Initialize(ctx, sfuse.Request{AgentKey: otherDER}); err == nil {
		t.Fatal("second InitializeTLS succeeded")
	} else if c := status.Code(errors.Unwrap(err)); c != codes.FailedPrecondition && c != codes.Unavailable {
		t.Fatalf("second InitializeTLS: %v, want FailedPrecondition (or Unavailable once drained)", err)
	}
	select {
	case err := <-sb.serveErr:
		if err != nil {
			t.Fatalf("Serve after the fuse blew: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Serve did not return after the fuse blew")
	}
	sandboxKey, err := tlspin.ParsePublicKey(res.SandboxKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlspin.ClientConfig(agent, sandboxKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.call(ctx, cfg); err != nil {
		t.Fatalf("pinned agent's call: %v", err)
	}
	intruder, _ := tlspin.ClientConfig(other, sandboxKey)
	if err := sb.call(ctx, intruder); status.Code(err) != codes.Unavailable {
		t.Fatalf("other agent's call: %v, want Unavailable", err)
	}
}

// The data plane accepts only a TLS 1.3 client presenting the pinned key, and the agent
// accepts only the sandbox key InitializeTLS returned.
func TestPinning(t *testing.T) {
	sb := startFuse(t, time.Minute, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agent, agentDER := newKey(t)
	res, err := sb.init(ctx, agentDER)
	if err != nil {
		t.Fatal(err)
	}
	sandboxKey, _ := tlspin.ParsePublicKey(res.SandboxKey)
	cert, err := tlspin.Certificate(agent)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tlspintest.Cases(t, cert, sandboxKey) {
		t.Run(tc.Name, func(t *testing.T) {
			err := sb.call(ctx, tc.Config)
			if tc.OK && err != nil {
				t.Fatal(err)
			}
			if !tc.OK && status.Code(err) != codes.Unavailable {
				t.Fatalf("call: %v, want Unavailable", err)
			}
		})
	}
}

// Of concurrent valid InitializeTLS calls exactly one succeeds.
func TestConcurrentInitExactlyOneWins(t *testing.T) {
	sb := startFuse(t, time.Minute, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := "unix://" + sb.initPath
	const n = 8
	errs := make(chan error, n)
	var wg sync.WaitGroup
	conns := make([]*prepared, n)
	for i := range conns {
		conns[i] = prepare(t, addr)
		if err := conns[i].Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		_, der := newKey(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Initialize(ctx, sfuse.Request{AgentKey: der})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	won := 0
	for err := range errs {
		if err == nil {
			won++
		}
	}
	if won != 1 {
		t.Fatalf("%d calls succeeded, want exactly 1", won)
	}
}

func TestIdleTTL(t *testing.T) {
	sb := startFuse(t, 20*time.Millisecond, nil)
	select {
	case err := <-sb.serveErr:
		if !errors.Is(err, ErrIdleTimeout) {
			t.Fatalf("Serve = %v, want ErrIdleTimeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	_, der := newKey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := sb.init(ctx, der); err == nil {
		t.Fatal("InitializeTLS after the idle TTL succeeded")
	}
	if _, err := net.Dial("unix", sb.dataPath); err == nil {
		t.Fatal("data socket still bound after the idle TTL")
	}
}

// A connection made before the fuse blows is closed at once, unread,
// and is not the one served once the fuse has blown; one made after is served.
func TestEarlyConnectionClosedUnread(t *testing.T) {
	sb := startFuse(t, time.Minute, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	early, err := net.Dial("unix", sb.dataPath)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	early.SetDeadline(time.Now().Add(10 * time.Second))
	early.Write([]byte("\x16\x03\x01\x00\x05hello")) // may fail: the gate may have closed it already
	if n, err := early.Read(make([]byte, 64)); n != 0 || !closedUnserved(err) {
		t.Fatalf("connection made before the fuse blew: read %d bytes, %v; want it closed unserved", n, err)
	}
	agent, der := newKey(t)
	res, err := sb.init(ctx, der)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := early.Read(make([]byte, 64)); n != 0 || err == nil {
		t.Fatalf("the early connection after the fuse blew: read %d bytes, %v; want it still closed", n, err)
	}
	sandboxKey, _ := tlspin.ParsePublicKey(res.SandboxKey)
	cfg, _ := tlspin.ClientConfig(agent, sandboxKey)
	if err := sb.call(ctx, cfg); err != nil {
		t.Fatalf("call on a connection made after the fuse blew: %v", err)
	}
}

// prepared is a connection to an init listener made before the fuse blows, as a manager's
// pool keeps one (internal/fastpath/initconns, which the trust core's tests do not import).
type prepared struct {
	conn *grpc.ClientConn
	addr string
}

func prepare(t *testing.T, addr string) *prepared {
	t.Helper()
	conn, err := sfuse.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	t.Cleanup(func() { conn.Close() })
	return &prepared{conn, addr}
}

// Ping is the gRPC health check a manager pings a pooled unit with.
func (p *prepared) Ping(ctx context.Context) error {
	resp, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("health %v", resp.GetStatus())
	}
	return err
}

// Identify is the Init service's Identity call, which a manager of an earlier release makes
// (its request and answer were messages of two bytes fields; an empty one is either).
func (p *prepared) Identify(ctx context.Context) error {
	return p.conn.Invoke(ctx, "/fusebox.sandbox.v1.Init/Identity", &emptypb.Empty{}, &emptypb.Empty{})
}

// Initialize is sFuse on this connection.
func (p *prepared) Initialize(ctx context.Context, req sfuse.Request) (sfuse.Result, error) {
	return sfuse.InitializeOn(ctx, p.conn, p.addr, req)
}
