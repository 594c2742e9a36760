package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/bulk"
	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/internal/fastpath/initconns"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/syncbuf"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
	"github.com/fusebox-dev/fusebox/internal/tlspin/tlspintest"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/envstate"
	"github.com/fusebox-dev/fusebox/sandbox-server/process"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

func TestCodeOf(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{fmt.Errorf("x: %w", workspace.ErrEscape), codes.PermissionDenied},
		{workspace.ErrInvalidPath, codes.InvalidArgument},
		{workspace.ErrLimit, codes.ResourceExhausted},
		{envstate.ErrDuplicateOrder, codes.InvalidArgument},
		{tlspin.ErrBadKey, codes.InvalidArgument},
		{errInvalid, codes.InvalidArgument},
		{&fs.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, codes.NotFound},
		{fs.ErrExist, codes.AlreadyExists},
		{syscall.ENOTDIR, codes.FailedPrecondition},
		{syscall.ENOTEMPTY, codes.FailedPrecondition},
		{syscall.ENOSPC, codes.ResourceExhausted},
		{fmt.Errorf("x: %w", process.ErrNotFound), codes.NotFound},
		{process.ErrInvalid, codes.InvalidArgument},
		{process.ErrExited, codes.FailedPrecondition},
		{process.ErrStdinClosed, codes.FailedPrecondition},
		{process.ErrNoTerminal, codes.FailedPrecondition},
		{process.ErrKeyReused, codes.FailedPrecondition},
		{process.ErrFutureOffset, codes.OutOfRange},
		{process.ErrLimit, codes.ResourceExhausted},
		{errors.New("boom"), codes.Internal},
		{status.Error(codes.Aborted, "kept"), codes.Aborted},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			if got := status.Code(toStatus(tc.err)); got != tc.want {
				t.Fatalf("code of %v = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
	if toStatus(nil) != nil {
		t.Fatal("toStatus(nil) != nil")
	}
}

func TestNewRefusesMissingOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New accepted empty options")
	}
}

// startInProcess runs a server on unix sockets in a temp dir, on the host kernel: a unit test
// of the protocol, not of the isolation (test/dataplane runs it under gVisor).
func startInProcess(t *testing.T, ttl time.Duration) (initAddr, dataAddr string, wait func() error) {
	t.Helper()
	return startInProcessWith(t, Options{IdleTTL: ttl})
}

// startInProcessWith is startInProcess with opts (the workspace, reaper, environment and
// workspace directory are set here).
func startInProcessWith(t testing.TB, opts Options) (initAddr, dataAddr string, wait func() error) {
	t.Helper()
	initAddr, dataAddr, _, wait = startInProcessIn(t, opts, nil)
	return initAddr, dataAddr, wait
}

// startInProcessIn is startInProcessWith that also returns the workspace's directory and
// serves the data plane on wrap(the data listener) when wrap is set.
func startInProcessIn(t testing.TB, opts Options, wrap func(net.Listener) net.Listener) (initAddr, dataAddr, dir string, wait func() error) {
	t.Helper()
	dir = t.TempDir()
	ws, err := workspace.Open(workspace.Options{Dir: dir, MountPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	r, err := procs.NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	sock := t.TempDir()
	data := endpoint.Addr{Network: "unix", Address: filepath.Join(sock, "data.sock")}
	opts.Workspace, opts.WorkspaceDir, opts.Reaper = ws, dir, r
	opts.BaseEnv = map[string]string{"PATH": os.Getenv("PATH")}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	dataLn, err := endpoint.Listen(data)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		dataLn = wrap(dataLn)
	}
	initLn, err := endpoint.Listen(endpoint.Addr{Network: "unix", Address: filepath.Join(sock, "init.sock")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var serveErr error
	go func() { serveErr = srv.Serve(ctx, initLn, dataLn); close(done) }()
	wait = func() error {
		select {
		case <-done:
			return serveErr
		case <-time.After(30 * time.Second):
			return errors.New("Serve did not return")
		}
	}
	t.Cleanup(func() {
		cancel()
		wait()
		r.Close()
		ws.Close()
	})
	return "unix://" + filepath.Join(sock, "init.sock"), data.String(), dir, wait
}

func TestFuseBlowsOnce(t *testing.T) {
	initAddr, dataAddr, _ := startInProcess(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sandboxtest.ServesNothing(t, dataAddr[len("unix://"):])
	var conns initconns.Conns
	if err := conns.Ping(ctx, initAddr); err != nil {
		t.Fatalf("ping of a sandbox in the pool: %v", err)
	}
	if _, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: []byte("garbage")}); status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
		t.Fatalf("malformed init: %v, want InvalidArgument", err)
	}
	sandboxtest.ServesNothing(t, dataAddr[len("unix://"):]) // a malformed init leaves the gate shut
	key, _ := client.NewKey()
	pub, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("init after a malformed one: %v", err)
	}
	// The certificate that comes with the key carries exactly that key and the fixed server
	// name, for clients that pin through a root certificate.
	cert, err := x509.ParseCertificate(pub.SandboxCertificate)
	if err != nil {
		t.Fatalf("sandbox certificate: %v", err)
	}
	if !bytes.Equal(cert.RawSubjectPublicKeyInfo, pub.SandboxKey) || !slices.Equal(cert.DNSNames, []string{tlspin.ServerName}) {
		t.Fatalf("sandbox certificate: key %x names %q, want key %x and %q", cert.RawSubjectPublicKeyInfo, cert.DNSNames, pub.SandboxKey, tlspin.ServerName)
	}
	other, _ := client.NewKey()
	// The init listener was closed before the answer was written: nobody reaches it again.
	if _, err := os.Stat(initAddr[len("unix://"):]); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("init socket after InitializeTLS answered: %v, want it removed", err)
	}
	sb, err := client.Dial(dataAddr, pub.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Exec(ctx, client.Command{Script: "export A=1; echo hi"})
	if err != nil || string(res.Stdout) != "hi\n" || !res.StateRecorded {
		t.Fatalf("exec: %v %+v", err, res)
	}
	if _, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: other.PublicKey()}); err == nil {
		t.Fatal("InitializeTLS after the init listener closed succeeded")
	}
	if err := conns.Ping(ctx, initAddr); err == nil {
		t.Fatal("ping after the init listener closed succeeded")
	}
	res, err = sb.Exec(ctx, client.Command{Script: `printf %s "$A"`})
	if err != nil || string(res.Stdout) != "1" {
		t.Fatalf("state not carried: %v %q", err, res.Stdout)
	}
	intruder, _ := client.Dial(dataAddr, pub.SandboxKey, other)
	defer intruder.Close()
	if _, err := intruder.Run(ctx, "true"); status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Fatalf("intruder exec: %v, want Unavailable", err)
	}
}

// firstCall initialises the server with a fresh agent key, then makes the agent's first
// data-plane call (a Stat).
func firstCall(t *testing.T, initAddr, dataAddr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, _ := client.NewKey()
	pub, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := client.Dial(dataAddr, pub.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Stat(ctx, ".", false); err != nil {
		t.Fatal(err)
	}
}

// After the agent's first call the server logs when each step of its allocation happened, in
// order.
func TestAllocationTimelineIsLogged(t *testing.T) {
	var logs syncbuf.Buffer
	initAddr, dataAddr, _ := startInProcessWith(t, Options{IdleTTL: time.Minute, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	firstCall(t, initAddr, dataAddr)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		for _, line := range strings.Split(logs.String(), "\n") {
			tl, ok := ParseTimeline([]byte(line))
			if !ok {
				continue
			}
			steps := []int64{tl.InitReceived, tl.InitAnswered, tl.DataAccepted, tl.HandshakeDone, tl.FirstCallStart, tl.FirstCallEnd}
			prev := int64(0)
			for i, v := range steps {
				if v == 0 || v < prev {
					t.Fatalf("step %d = %d after %d: want every step set and in order (%s)", i, v, prev, line)
				}
				prev = v
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no allocation timeline logged:\n%s", logs.String())
		}
	}
}

func TestIdleTTL(t *testing.T) {
	_, _, wait := startInProcess(t, 50*time.Millisecond)
	if err := wait(); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("Serve = %v, want ErrIdleTimeout", err)
	}
}

// A manager of an earlier release sends the agent's ClientHello in InitializeTLS (field 2,
// reserved since): the sandbox ignores it, answers no TLS flight, and the agent's ordinary
// handshake reaches the data plane.
func TestClientHelloFromAnEarlierManagerIsIgnored(t *testing.T) {
	initAddr, dataAddr, _ := startInProcessWith(t, Options{IdleTTL: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, _ := client.NewKey()
	cert, err := tlspin.Certificate(key.Signer())
	if err != nil {
		t.Fatal(err)
	}
	cfg := tlspin.ClientConfigPin(func() (tls.Certificate, error) { return cert, nil }, &tlspin.Pin{})
	req := &sandboxv1.InitializeTLSRequest{AgentPublicKey: key.PublicKey()}
	req.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), tlspintest.ClientHello(t, cfg)))
	conn, err := grpc.NewClient(initAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := sandboxv1.NewInitClient(conn).InitializeTLS(ctx, req)
	if err != nil {
		t.Fatalf("InitializeTLS with a ClientHello: %v", err)
	}
	if extra := resp.ProtoReflect().GetUnknown(); len(extra) > 0 {
		t.Fatalf("the answer carries %d bytes of fields it no longer has (a TLS flight): %x", len(extra), extra)
	}
	sb, err := client.Dial(dataAddr, resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Run(ctx, "true"); err != nil {
		t.Fatalf("the agent's call after a full handshake: %v", err)
	}
}

// The key-pinning and sFuse guarantees hold whether sFuse comes on a fresh connection (the
// plain path) or on one the manager's pool prepared (internal/fastpath/initconns, the
// latency wing): only the pinned agent, over TLS 1.3 with a client certificate, reaches the data plane;
// the agent refuses a sandbox presenting another key; a replayed ClientHello or a stray
// handshake record gets nothing; a second InitializeTLS is refused.
func TestKeyPinningOnBothPaths(t *testing.T) {
	for _, path := range []struct {
		name     string
		prepared bool
	}{
		{"plain", false},
		{"prepared", true},
	} {
		t.Run(path.name, func(t *testing.T) {
			initAddr, dataAddr, _ := startInProcessWith(t, Options{IdleTTL: time.Minute})
			dataPath := dataAddr[len("unix://"):]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			initialize := sfuse.Initialize
			if path.prepared {
				var conns initconns.Conns // prepared before the fuse blows, as the manager's is
				conns.Prepare(initAddr)
				defer conns.Forget(initAddr)
				if err := conns.Ping(ctx, initAddr); err != nil {
					t.Fatal(err)
				}
				initialize = conns.Initialize
			}
			key, _ := client.NewKey()
			cert, err := tlspin.Certificate(key.Signer())
			if err != nil {
				t.Fatal(err)
			}
			pin := &tlspin.Pin{}
			cfg := tlspin.ClientConfigPin(func() (tls.Certificate, error) { return cert, nil }, pin)
			hello := tlspintest.ClientHello(t, cfg)
			res, err := initialize(ctx, initAddr, sfuse.Request{AgentKey: key.PublicKey()})
			if err != nil {
				t.Fatal(err)
			}
			sandboxKey, _ := tlspin.ParsePublicKey(res.SandboxKey)
			if err := pin.Set(sandboxKey); err != nil {
				t.Fatal(err)
			}
			conn, err := grpc.NewClient(dataAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := sandboxv1.NewSandboxClient(conn).Stat(ctx, &sandboxv1.StatRequest{Path: "."}); err != nil {
				t.Fatalf("pinned agent's call: %v", err)
			}

			// Ordinary handshakes, the pinned agent's and those to be refused.
			for _, tc := range tlspintest.Cases(t, cert, sandboxKey) {
				t.Run(tc.Name, func(t *testing.T) {
					c, err := grpc.NewClient(dataAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc.Config)))
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					_, err = sandboxv1.NewSandboxClient(c).Stat(ctx, &sandboxv1.StatRequest{Path: "."})
					if tc.OK && err != nil {
						t.Fatal(err)
					}
					if !tc.OK && status.Code(err) != codes.Unavailable {
						t.Fatalf("call: %v, want Unavailable", err)
					}
					// The same handshake asking for a bulk connection instead of HTTP/2.
					if err := bulkRequest(ctx, dataPath, tc.Config); tc.OK != (status.Code(err) == codes.NotFound) {
						t.Fatalf("bulk request: %v, want NotFound: %v", err, tc.OK)
					}
				})
			}
			other, _ := client.NewKey()
			t.Run("replayed ClientHello", func(t *testing.T) {
				// On the prepared connection, if any (a new one finds no socket): the fuse is
				// blown.
				_, err := initialize(ctx, initAddr, sfuse.Request{AgentKey: other.PublicKey()})
				if c := status.Code(errors.Unwrap(err)); err == nil || c != codes.FailedPrecondition && c != codes.Unavailable {
					t.Fatalf("a second InitializeTLS: %v, want FailedPrecondition or Unavailable", err)
				}
				if _, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: other.PublicKey()}); err == nil {
					t.Fatal("a second InitializeTLS on a new connection succeeded")
				}
				// The ClientHello sent straight to the data socket: a handshake the server
				// answers, but the client's second flight it never gets is the agent's; it
				// ends without a session.
				c, err := net.Dial("unix", dataPath)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.Write(hello)
				c.Write([]byte("\x14\x03\x03\x00\x01\x01\x17\x03\x03\x00\x100123456789abcdef"))
				for {
					if _, err := c.Read(make([]byte, 4096)); err != nil {
						if !closedUnserved(err) {
							t.Fatalf("replayed ClientHello: %v, want the connection closed", err)
						}
						break
					}
				}
			})
			t.Run("stray handshake record", func(t *testing.T) {
				c, err := net.Dial("unix", dataPath)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.Write([]byte("\x14\x03\x03\x00\x01\x01"))
				if n, err := c.Read(make([]byte, 64)); n != 0 && err == nil {
					t.Fatalf("a ChangeCipherSpec record first: read %d bytes, %v; want the connection closed", n, err)
				}
			})
			if _, err := sandboxv1.NewSandboxClient(conn).Stat(ctx, &sandboxv1.StatRequest{Path: "."}); err != nil {
				t.Fatalf("pinned agent's call after the others: %v", err)
			}
		})
	}
}

// bulkRequest makes a bulk connection to the data socket at path with cfg (offering only
// bulk.Proto) and asks it for a file that does not exist: the sandbox's answer (NOT_FOUND),
// or why there was none.
func bulkRequest(ctx context.Context, path string, cfg *tls.Config) error {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{bulk.Proto}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := bulk.WriteMsg(c, &sandboxv1.BulkRequest{Op: &sandboxv1.BulkRequest_Read{Read: &sandboxv1.ReadFileStreamRequest{Path: "missing"}}}); err != nil {
		return err
	}
	var st sandboxv1.BulkStatus
	if err := bulk.ReadMsg(c, &st); err != nil {
		return err
	}
	return bulk.Err(&st)
}

// closedUnserved reports whether err is what reading a connection the server closed returns
// (a reset when it closed with our bytes unread).
func closedUnserved(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// TestInitEnvAndCwd: the allocation's env and working directory reach the commands; a bad
// one is refused as invalid and leaves the fuse intact for a good request.
func TestInitEnvAndCwd(t *testing.T) {
	initAddr, dataAddr, _ := startInProcessWith(t, Options{IdleTTL: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, _ := client.NewKey()
	conn, err := grpc.NewClient(initAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	init := sandboxv1.NewInitClient(conn)
	_, err = init.InitializeTLS(ctx, &sandboxv1.InitializeTLSRequest{AgentPublicKey: key.PublicKey(), Env: map[string]string{"A=B": "x"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a bad variable name: %v, want InvalidArgument", err)
	}
	dir := t.TempDir()
	resp, err := init.InitializeTLS(ctx, &sandboxv1.InitializeTLSRequest{AgentPublicKey: key.PublicKey(),
		Env: map[string]string{"GREETING": "hi"}, Cwd: dir})
	if err != nil {
		t.Fatalf("InitializeTLS after a refused one: %v", err)
	}
	sb, err := client.Dial(dataAddr, resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Exec(ctx, client.Command{Script: "pwd; echo $GREETING"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(res.Stdout), dir+"\nhi\n"; got != want {
		t.Errorf("pwd and $GREETING: %q, want %q", got, want)
	}
}

// TestWarmUpCommands: a template's warm-up commands run before the sandbox serves, leaving
// their files for the agent; a failing one fails WarmUp with its exit code and output.
func TestWarmUpCommands(t *testing.T) {
	dir := t.TempDir()
	ws, err := workspace.Open(workspace.Options{Dir: dir, MountPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	r, err := procs.NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	newServer := func(cmds ...Command) *Server {
		srv, err := New(Options{Workspace: ws, WorkspaceDir: dir, Reaper: r, IdleTTL: time.Minute,
			BaseEnv: map[string]string{"PATH": os.Getenv("PATH")}, WarmUpCommands: cmds})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	ctx := context.Background()
	if err := newServer(Command{Script: "echo warmed > warm.txt"}, Command{Argv: []string{"true"}}).WarmUp(ctx); err != nil {
		t.Fatalf("WarmUp: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "warm.txt")); err != nil || string(b) != "warmed\n" {
		t.Errorf("the warm-up's file: %q, %v", b, err)
	}
	err = newServer(Command{Argv: []string{"true"}}, Command{Script: "echo no such module >&2; exit 3"}).WarmUp(ctx)
	if err == nil || !strings.Contains(err.Error(), "warm-up command 2") || !strings.Contains(err.Error(), "exit 3: no such module") {
		t.Errorf("a failing warm-up: %v", err)
	}
}
