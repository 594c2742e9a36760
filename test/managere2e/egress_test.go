package managere2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fusebox-dev/fusebox/client"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// loopbackServer is an HTTP server on 127.0.0.1 that counts its requests.
type loopbackServer struct {
	*httptest.Server
	hits atomic.Int64
}

func newLoopbackServer(t *testing.T, body string) *loopbackServer {
	t.Helper()
	s := &loopbackServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(s.Close)
	if ap, err := netip.ParseAddrPort(s.Listener.Addr().String()); err != nil || ap.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("test server on %s, want 127.0.0.1", s.Listener.Addr())
	}
	return s
}

func (s *loopbackServer) hostPort() string { return s.Listener.Addr().String() }

// curlResult is what a curl inside the sandbox did.
type curlResult struct {
	exit          int
	body, stderr  string
	code, connect string // HTTP status of the request and of the CONNECT ("000": none)
}

// curl runs `prefix curl -sS flags url` inside the sandbox.
func curl(t *testing.T, ctx context.Context, sb *client.Sandbox, prefix, flags, url string) curlResult {
	t.Helper()
	script := prefix + " curl -sS --max-time 20 -w '\n@@%{http_code} %{http_connect}' " + flags + " " + url
	res, err := sb.Exec(ctx, client.Command{Script: script})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	out := string(res.Stdout)
	i := strings.LastIndex(out, "\n@@")
	if i < 0 {
		t.Fatalf("%s: no status; exit %d, stdout %q, stderr %q", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	r := curlResult{exit: res.ExitCode, body: out[:i], stderr: string(res.Stderr)}
	if _, err := fmt.Sscanf(out[i+3:], "%s %s", &r.code, &r.connect); err != nil {
		t.Fatalf("%s: status %q: %v", script, out[i+3:], err)
	}
	return r
}

// An allocation's egress allowlist is enforced by the manager's proxy: the allowed loopback
// server is reachable through HTTP_PROXY, the other one is refused with a 403 that says why,
// direct connections fail (the sandbox has no network), and the manager's own socket does
// not exist inside the sandbox.
func TestEgressThroughManager(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	allowed := newLoopbackServer(t, "hello from the allowed server")
	other := newLoopbackServer(t, "must not be reached")

	a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{Egress: []string{allowed.hostPort()}})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	defer a.Close()
	if out := sandboxtest.Sh(t, ctx, a.Sandbox, `echo "$HTTP_PROXY"`); !strings.HasPrefix(out, "http://127.0.0.1:") {
		t.Fatalf("HTTP_PROXY in the sandbox = %q", out)
	}
	// The variables as the sandbox sets them: NO_PROXY leaves out 127.0.0.1, which the
	// allowlist names, so plain curl to a server on the host's 127.0.0.1 takes the proxy.
	const viaProxy = ""

	t.Run("allowed", func(t *testing.T) {
		for _, flags := range []string{"", "-p"} { // absolute-URI GET, then a CONNECT tunnel
			r := curl(t, ctx, a.Sandbox, viaProxy, flags, "http://"+allowed.hostPort()+"/")
			if r.exit != 0 || r.code != "200" || r.body != "hello from the allowed server" {
				t.Errorf("curl %s to the allowed server: %+v", flags, r)
			}
		}
		if n := allowed.hits.Load(); n != 2 {
			t.Errorf("allowed server saw %d requests, want 2", n)
		}
	})

	t.Run("refused", func(t *testing.T) {
		r := curl(t, ctx, a.Sandbox, viaProxy, "", "http://"+other.hostPort()+"/")
		if r.code != "403" || !strings.Contains(r.body, other.hostPort()) || !strings.Contains(r.body, "not on this sandbox's egress allowlist") {
			t.Errorf("curl to the server not on the allowlist: %+v; want 403 naming %s as not on the allowlist", r, other.hostPort())
		}
		if !strings.Contains(r.body, allowed.hostPort()) {
			t.Errorf("the refusal does not say what is allowed: %q", r.body)
		}
		r = curl(t, ctx, a.Sandbox, viaProxy, "-p", "http://"+other.hostPort()+"/")
		if r.exit == 0 || r.connect != "403" {
			t.Errorf("CONNECT to the server not on the allowlist: %+v; want the CONNECT refused with 403", r)
		}
		if n := other.hits.Load(); n != 0 {
			t.Errorf("the server not on the allowlist saw %d requests", n)
		}
	})

	t.Run("direct", func(t *testing.T) {
		before := allowed.hits.Load()
		for _, s := range []*loopbackServer{allowed, other} {
			r := curl(t, ctx, a.Sandbox, "", "--noproxy '*'", "http://"+s.hostPort()+"/")
			if r.exit == 0 || r.code != "000" {
				t.Errorf("direct curl to %s: %+v; want a failed connection", s.hostPort(), r)
			}
		}
		if allowed.hits.Load() != before || other.hits.Load() != 0 {
			t.Errorf("a direct connection reached a server: allowed %d (was %d), other %d", allowed.hits.Load(), before, other.hits.Load())
		}
	})
	// connectFails asserts that, from inside the sandbox, path does not exist and a unix
	// connection to it fails, while it is a socket on the host.
	connectFails := func(t *testing.T, path string) {
		t.Helper()
		if fi, err := os.Stat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("%s on the host: %v %v; want a socket", path, fi, err)
		}
		res, err := a.Exec(ctx, client.Command{Script: fmt.Sprintf(
			`test -e %[1]q && echo EXISTS; python3 -c 'import socket, sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("CONNECTED")' %[1]q`, path)})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || strings.Contains(string(res.Stdout), "CONNECTED") || strings.Contains(string(res.Stdout), "EXISTS") {
			t.Errorf("from inside the sandbox, %s: exit %d, stdout %q, stderr %q; want no such path", path, res.ExitCode, res.Stdout, res.Stderr)
		}
		if !strings.Contains(string(res.Stderr), "FileNotFoundError") {
			t.Errorf("connecting to %s failed, but not with FileNotFoundError: %q", path, res.Stderr)
		}
	}

	t.Run("manager socket unreachable", func(t *testing.T) { connectFails(t, e.Socket) })

	t.Run("other sandboxes unreachable", func(t *testing.T) {
		units := waitPoolSettled(t, ctx, dialManager(t, e.Addr), 1)
		ready := idsIn(units, managerv1.UnitState_UNIT_STATE_READY)
		if len(ready) != 1 {
			t.Fatalf("ready units %v", ready)
		}
		sock := filepath.Join(e.StateDir, "sandboxes", ready[0], "sock")
		connectFails(t, filepath.Join(sock, "init.sock"))
		// A pool unit has no egress proxy at all (finding 8): only an allocation with an
		// allowlist gets one.
		if _, err := os.Lstat(filepath.Join(sock, "egress.sock")); !os.IsNotExist(err) {
			t.Errorf("egress.sock of a ready unit: %v, want none", err)
		}
	})
}

// A sandbox allocated without an allowlist has no network at all (issue 16 finding 8): no
// proxy variables, nothing listening on the relay's port, no proxy socket on the host; the
// same manager's allocation with an allowlist has all three.
func TestNoEgressMeansNoRelay(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	srv := newLoopbackServer(t, "hello")
	for _, allow := range [][]string{nil, {srv.hostPort()}} {
		a, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{Egress: allow})
		if err != nil {
			t.Fatalf("Allocate(egress %q): %v", allow, err)
		}
		vars := sandboxtest.Sh(t, ctx, a.Sandbox, "env | grep -i _proxy= | LC_ALL=C sort || true")
		r := curl(t, ctx, a.Sandbox, "", "-x http://127.0.0.1:3128", "http://"+srv.hostPort()+"/")
		_, sockErr := os.Lstat(filepath.Join(e.StateDir, "sandboxes", a.ID, "sock", "egress.sock"))
		if allow == nil {
			if vars != "" {
				t.Errorf("proxy variables without egress: %q", vars)
			}
			if r.exit != 7 || r.connect != "000" {
				t.Errorf("curl through 127.0.0.1:3128 without egress: %+v; want exit 7, nothing listening", r)
			}
			if !os.IsNotExist(sockErr) {
				t.Errorf("egress.sock of a sandbox without egress: %v, want none", sockErr)
			}
		} else {
			if !strings.Contains(vars, "HTTP_PROXY=http://127.0.0.1:3128") || !strings.Contains(vars, "NO_PROXY=localhost,::1") {
				t.Errorf("proxy variables with egress %q: %q", allow, vars)
			}
			if r.exit != 0 || r.body != "hello" {
				t.Errorf("curl through the relay with egress %q: %+v", allow, r)
			}
			if sockErr != nil {
				t.Errorf("egress.sock of a sandbox with egress: %v", sockErr)
			}
		}
		a.Close()
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("the server saw %d requests, want 1 (from the sandbox with egress)", n)
	}
}

// The README's example works as written: `fusebox run --egress 127.0.0.1:PORT -- curl -s
// http://127.0.0.1:PORT/` prints the host's server's answer (NO_PROXY listed 127.0.0.1, and
// curl went to the sandbox's own loopback, issue 16 finding 7).
func TestReadmeEgressExample(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(t, daemonOpts{PoolSize: 1})
	ctx := testenv.Context(t, testDeadline)
	srv := newLoopbackServer(t, "hello from the host")
	code, stdout, stderr := runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--egress", srv.hostPort(), "--",
		"curl", "-s", "http://"+srv.hostPort()+"/")
	if code != 0 || stdout != "hello from the host" {
		t.Errorf("fusebox run --egress %s -- curl -s http://%[1]s/: exit %d, stdout %q, stderr %q", srv.hostPort(), code, stdout, stderr)
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("the host's server saw %d requests, want 1", n)
	}
}
