package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/echotest"
	"github.com/fusebox-dev/fusebox/internal/leakcheck"
)

// echoSocket serves a unix socket at path that echoes each connection (see echotest.Serve).
// It returns the number of accepted connections.
func echoSocket(t *testing.T, path string) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return echotest.Serve(t, ln)
}

// startRelay runs Serve on a loopback listener until the test ends and returns the
// listener's address and Serve's result.
func startRelay(t *testing.T, ctx context.Context, socketPath string) (net.Listener, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		served <- Serve(ctx, ln, socketPath, slog.New(slog.DiscardHandler))
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	return ln, served
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c.(*net.TCPConn)
}

func expectEcho(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo: got %d bytes (%v), want %q", len(got), err, msg[:min(len(msg), 20)])
	}
}

func TestRelayPipesBothWays(t *testing.T) {
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	accepted := echoSocket(t, sock)
	ln, _ := startRelay(t, context.Background(), sock)
	addr := ln.Addr().String()

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			c := dial(t, addr)
			expectEcho(t, c, "hello")
			expectEcho(t, c, strings.Repeat(string(rune('a'+i)), 300<<10))
			// Half-close travels through the relay and back.
			io.WriteString(c, "bye")
			c.CloseWrite()
			rest, err := io.ReadAll(c)
			if err != nil || string(rest) != "bye" {
				t.Errorf("after half-close: %q, %v", rest, err)
			}
		})
	}
	wg.Wait()
	if n := accepted.Load(); n != 8 {
		t.Errorf("the socket accepted %d connections, want one per relayed connection (8)", n)
	}
}

func TestRelaySocketMissing(t *testing.T) {
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, _ := startRelay(t, context.Background(), sock)
	addr := ln.Addr().String()

	c := dial(t, addr)
	io.WriteString(c, "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusBadGateway || string(body) != "fusebox egress: the egress proxy is not reachable from this sandbox\n" {
		t.Fatalf("got %s %q (%v)", res.Status, body, err)
	}

	// The socket is dialled per connection: once the proxy is there, the relay reaches it.
	echoSocket(t, sock)
	expectEcho(t, dial(t, addr), "now it works")
}

func TestRelayContextEnds(t *testing.T) {
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	echoSocket(t, sock)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, served := startRelay(t, ctx, sock)
	c := dial(t, ln.Addr().String())
	expectEcho(t, c, "live")

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after its context ended = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a relayed connection is still open after Serve returned (read %d)", n)
	}
	// Asked of the listener itself: a dial to its port, free again, may reach whoever took the
	// port since (another test's listener, or a TCP self-connect). The deadline turns an open
	// listener into a timeout, not a hang.
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
	if c, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Accept after Serve returned = %v, want the listener closed", err)
	}
}

func TestRelayListenerFails(t *testing.T) {
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	echoSocket(t, sock)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- Serve(context.Background(), ln, sock, nil) }()
	c := dial(t, ln.Addr().String())
	expectEcho(t, c, "live")
	ln.Close()
	select {
	case err := <-served:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Serve with a closed listener = %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its listener failed")
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a relayed connection is still open after Serve returned (read %d)", n)
	}
}

func TestListenLoopbackOnly(t *testing.T) {
	for _, bad := range []string{"0.0.0.0:3128", ":3128", "localhost:3128", "10.0.0.1:3128", "[::]:3128", "127.0.0.1", "[fe80::1%lo]:3128"} {
		if ln, err := Listen(bad); err == nil {
			ln.Close()
			t.Errorf("Listen(%q) succeeded, want a refusal", bad)
		}
	}
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := "http://" + ln.Addr().String()
	// NO_PROXY keeps the sandbox's own loopback direct, except the loopback hosts the
	// allowlist names: "--egress 127.0.0.1:8000" means the host's 127.0.0.1, through the proxy.
	tests := []struct {
		allow   []string
		noProxy string // "": not set
	}{
		{[]string{"api.example.com:443"}, "localhost,127.0.0.1,::1"},
		{[]string{"127.0.0.1:8000"}, "localhost,::1"},
		{[]string{"LOCALHOST.:80", "[::1]:80", "*.example.com:443"}, "127.0.0.1"},
		{[]string{"[::ffff:127.0.0.1]:80"}, "localhost,::1"},
		{[]string{"127.0.0.1:1", "localhost:1", "[::1]:1"}, ""},
	}
	for _, tc := range tests {
		env := ProxyEnv(ln.Addr(), tc.allow)
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
			if env[k] != want {
				t.Errorf("%q: %s = %q, want %q", tc.allow, k, env[k], want)
			}
		}
		np, ok := env["NO_PROXY"]
		if np != tc.noProxy || ok != (tc.noProxy != "") || env["no_proxy"] != np || len(env) != 4+2*len(np[:min(len(np), 1)]) {
			t.Errorf("ProxyEnv(%q) = %q, want NO_PROXY and no_proxy %q", tc.allow, env, tc.noProxy)
		}
	}
}
