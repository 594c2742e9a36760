package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/syncbuf"
	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// Every server these tests reach is on the host's loopback; the proxy's dialer refuses
// anything else, so that a bug cannot send test traffic off the machine.

// egressServer is an HTTP server on the host's loopback that counts its requests.
type egressServer struct {
	*httptest.Server
	hits atomic.Int64
	body string
}

func newEgressServer(t *testing.T, body string, tls bool) *egressServer {
	t.Helper()
	s := &egressServer{body: body}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		fmt.Fprint(w, body)
	})
	if tls {
		s.Server = httptest.NewTLSServer(h)
	} else {
		s.Server = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	if ap, err := netip.ParseAddrPort(s.Listener.Addr().String()); err != nil || !ap.Addr().IsLoopback() {
		t.Fatalf("test server on %s, want loopback", s.Listener.Addr())
	}
	return s
}

func (s *egressServer) hostPort() string { return s.Listener.Addr().String() }

// serveEgress serves an egress proxy allowing entries on the host side of the sandbox's
// /run/fusebox/egress.sock until the test ends.
func serveEgress(t *testing.T, b *sandboxtest.Bound, entries ...string) *syncbuf.Buffer {
	t.Helper()
	allow, err := egress.ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	p := egress.NewProxy(egress.ProxyOptions{
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
				return nil, fmt.Errorf("test dialer: refusing non-loopback %q", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	p.SetAllowlist(allow)
	path := filepath.Join(b.Dir, "sock", "egress.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	// As the allocator does: the sandbox server's relay connects as the command user.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-served; err != nil {
			t.Errorf("egress proxy: %v", err)
		}
		if t.Failed() {
			t.Logf("egress proxy log:\n%s", logs)
		}
	})
	return logs
}

// fetchMode says how a request inside the sandbox reaches its server.
type fetchMode string

const (
	viaProxy  fetchMode = "proxy"  // absolute-URI GET to $http_proxy
	viaTunnel fetchMode = "tunnel" // CONNECT through $https_proxy, then plain HTTP
	viaHTTPS  fetchMode = "https"  // CONNECT through $https_proxy, then TLS (certificate not checked)
	direct    fetchMode = "direct" // no proxy at all
)

// fetchPython is the fallback client for a root filesystem without curl.
const fetchPython = `
import http.client, os, re, ssl, sys, urllib.parse
mode, url = sys.argv[1], sys.argv[2]
u = urllib.parse.urlsplit(url)
status = connect = 0
body, rc = b"", 0
try:
    if mode == "direct":
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
        c.request("GET", u.path or "/")
    else:
        p = urllib.parse.urlsplit(os.environ["http_proxy" if mode == "proxy" else "https_proxy"])
        if mode == "https":
            c = http.client.HTTPSConnection(p.hostname, p.port, timeout=20, context=ssl._create_unverified_context())
        else:
            c = http.client.HTTPConnection(p.hostname, p.port, timeout=20)
        if mode == "proxy":
            c.request("GET", url)
        else:
            c.set_tunnel(u.hostname, u.port)
            c.request("GET", u.path or "/")
            connect = 200
    r = c.getresponse()
    status, body = r.status, r.read()
except OSError as e:
    m = re.search(r"Tunnel connection failed: (\d+)", str(e))
    if m:
        connect = int(m.group(1))
    print(e, file=sys.stderr)
    rc = 7
sys.stdout.write(body.decode(errors="replace") + "\n@@status=%03d connect=%03d" % (status, connect))
sys.exit(rc)
`

// fetched is the outcome of a request made inside the sandbox.
type fetched struct {
	exit            int
	status, connect int // HTTP status of the request and of the CONNECT; 0 when none
	body, stderr    string
}

func (f fetched) String() string {
	return fmt.Sprintf("exit %d, status %d, CONNECT %d, body %q, stderr %q", f.exit, f.status, f.connect, f.body, f.stderr)
}

// fetch requests url inside the sandbox with curl (python3 if there is no curl). The proxy
// modes use the sandbox's own proxy variables as they are: NO_PROXY keeps 127.0.0.1 direct
// only when the allowlist does not name it, and every test server is on 127.0.0.1.
func fetch(t *testing.T, ctx context.Context, c *client.Sandbox, mode fetchMode, url string) fetched {
	t.Helper()
	cmd := client.Command{Timeout: time.Minute}
	const w = `'\n@@status=%{http_code} connect=%{http_connect}'`
	curl := map[fetchMode]string{
		viaProxy:  "curl -sS --max-time 20 -w " + w + " " + url,
		viaTunnel: "curl -sS --max-time 20 -p -w " + w + " " + url,
		viaHTTPS:  "curl -sS --max-time 20 -k -w " + w + " " + url,
		direct:    "curl -sS --max-time 20 --noproxy '*' -w " + w + " " + url,
	}[mode]
	cmd.Script = "if command -v curl >/dev/null; then " + curl + "; else python3 -c \"$FETCH_PY\" " + string(mode) + " " + url + "; fi"
	cmd.Env = map[string]string{"FETCH_PY": fetchPython}
	res, err := c.Exec(ctx, cmd)
	if err != nil {
		t.Fatalf("fetch %s %s: %v", mode, url, err)
	}
	out := string(res.Stdout)
	i := strings.LastIndex(out, "\n@@status=")
	if i < 0 {
		t.Fatalf("fetch %s %s: no status line; exit %d, stdout %q, stderr %q", mode, url, res.ExitCode, res.Stdout, res.Stderr)
	}
	f := fetched{exit: res.ExitCode, body: out[:i], stderr: string(res.Stderr)}
	if _, err := fmt.Sscanf(out[i:], "\n@@status=%d connect=%d", &f.status, &f.connect); err != nil {
		t.Fatalf("fetch %s %s: status line %q: %v", mode, url, out[i:], err)
	}
	return f
}

// An allocation with an allowlist of servers on the host's 127.0.0.1 (the README's example):
// the relay runs, the proxy variables are set, and NO_PROXY does not send 127.0.0.1 direct,
// so plain `curl http://127.0.0.1:PORT/` goes through the proxy (it went to the sandbox's
// own loopback, issue 16 finding 7).
func TestEgressAllowlistedThroughProxy(t *testing.T) {
	allowed := newEgressServer(t, "hello from the allowed server", false)
	allowedTLS := newEgressServer(t, "hello over TLS", true)
	blocked := newEgressServer(t, "secret", false)
	b := sandboxtest.StartBound(t, sandboxtest.Options{ServerArgs: []string{"-egress-socket=/run/fusebox/egress.sock"},
		Egress: []string{allowed.hostPort(), allowedTLS.hostPort()}})
	ctx := testenv.Context(t, 3*time.Minute)
	serveEgress(t, b, allowed.hostPort(), allowedTLS.hostPort())

	t.Run("proxy variables", func(t *testing.T) {
		got := sandboxtest.Sh(t, ctx, b.Client, "env | grep -i -e _proxy= | LC_ALL=C sort")
		want := "HTTPS_PROXY=http://127.0.0.1:3128\nHTTP_PROXY=http://127.0.0.1:3128\nNO_PROXY=localhost,::1\n" +
			"http_proxy=http://127.0.0.1:3128\nhttps_proxy=http://127.0.0.1:3128\nno_proxy=localhost,::1\n"
		if got != want {
			t.Errorf("proxy variables:\n%s\nwant:\n%s", got, want)
		}
		if !strings.Contains(b.Log(), "egress relay started") {
			t.Errorf("no relay start in the server log:\n%s", b.Log())
		}
	})
	t.Run("allowlisted server reachable", func(t *testing.T) {
		f := fetch(t, ctx, b.Client, viaProxy, allowed.URL+"/")
		if f.exit != 0 || f.status != 200 || f.body != allowed.body {
			t.Fatalf("GET %s through the proxy: %v", allowed.URL, f)
		}
	})
	t.Run("CONNECT to allowlisted server", func(t *testing.T) {
		f := fetch(t, ctx, b.Client, viaTunnel, allowed.URL+"/tunnel")
		if f.exit != 0 || f.connect != 200 || f.status != 200 || f.body != allowed.body {
			t.Fatalf("tunnelled GET %s: %v", allowed.URL, f)
		}
		f = fetch(t, ctx, b.Client, viaHTTPS, allowedTLS.URL+"/")
		if f.exit != 0 || f.connect != 200 || f.status != 200 || f.body != allowedTLS.body {
			t.Fatalf("GET %s through HTTPS_PROXY: %v", allowedTLS.URL, f)
		}
	})
	t.Run("server not on the allowlist refused", func(t *testing.T) {
		want := fmt.Sprintf("fusebox egress: %s is not on this sandbox's egress allowlist (allowed: %s, %s)\n",
			blocked.hostPort(), allowed.hostPort(), allowedTLS.hostPort())
		f := fetch(t, ctx, b.Client, viaProxy, blocked.URL+"/")
		if f.status != 403 || f.body != want {
			t.Errorf("GET %s through the proxy: %v; want 403 %q", blocked.URL, f, want)
		}
		f = fetch(t, ctx, b.Client, viaTunnel, blocked.URL+"/")
		if f.exit == 0 || f.connect != 403 {
			t.Errorf("CONNECT %s: %v; want the CONNECT refused with 403", blocked.hostPort(), f)
		}
		if n := blocked.hits.Load(); n != 0 {
			t.Errorf("the server not on the allowlist got %d requests", n)
		}
	})
	t.Run("direct connections fail", func(t *testing.T) {
		// The sandbox has no network: 127.0.0.1 inside is its own loopback, where nothing
		// listens on the server's port, and there is no other interface.
		for _, s := range []*egressServer{allowed, blocked} {
			f := fetch(t, ctx, b.Client, direct, s.URL+"/")
			if f.exit == 0 || f.status != 0 {
				t.Errorf("direct GET %s bypassing the proxy: %v; want no connection", s.URL, f)
			}
		}
		if ifaces := interfaces(t, ctx, b.Client); !slices.Equal(ifaces, []string{"lo"}) {
			t.Errorf("network interfaces in the sandbox: %q, want only lo", ifaces)
		}
	})
	if n := allowed.hits.Load(); n != 2 {
		t.Errorf("the allowed server got %d requests, want 2 (one forwarded, one tunnelled)", n)
	}
}

// interfaces lists the sandbox's network interfaces from /proc/net/dev (gVisor has no
// /sys/class/net).
func interfaces(t *testing.T, ctx context.Context, c *client.Sandbox) []string {
	t.Helper()
	var names []string
	for line := range strings.Lines(sandboxtest.Sh(t, ctx, c, "cat /proc/net/dev")) {
		if name, _, ok := strings.Cut(line, ":"); ok {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}

func TestEgressDisabledWithoutFlag(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 3*time.Minute)
	srv := newEgressServer(t, "unreachable", false)
	if got := sandboxtest.Sh(t, ctx, b.Client, "env | grep -i _proxy= || true"); got != "" {
		t.Errorf("proxy variables without -egress-socket: %q", got)
	}
	if ifaces := interfaces(t, ctx, b.Client); !slices.Equal(ifaces, []string{"lo"}) {
		t.Errorf("network interfaces in the sandbox: %q, want only lo", ifaces)
	}
	f := fetch(t, ctx, b.Client, direct, srv.URL+"/")
	if f.exit == 0 || f.status != 0 {
		t.Errorf("direct GET %s: %v; want no connection", srv.URL, f)
	}
	// Nor is there a relay to use explicitly, or a proxy socket to reach.
	res, err := b.Client.Exec(ctx, client.Command{Script: "curl -sS --max-time 20 -x http://127.0.0.1:3128 " + srv.URL + "/ || exit 7; exit 0",
		Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 {
		t.Errorf("GET through 127.0.0.1:3128 without -egress-socket succeeded: %q", res.Stdout)
	}
	if got := sandboxtest.Sh(t, ctx, b.Client, "ls -A /run/fusebox"); strings.Contains(got, "egress") {
		t.Errorf("/run/fusebox without egress: %q", got)
	}
	if n := srv.hits.Load(); n != 0 {
		t.Errorf("the server got %d requests from a sandbox without egress", n)
	}
}

// A sandbox made for the pool (with the relay's socket configured, as the runsc allocator
// makes every one) and allocated without an allowlist has no way out at all: no relay
// listening, no proxy variables, no proxy socket (issue 16 finding 8; the relay used to start
// with the server, and HTTP_PROXY was set in every sandbox).
func TestNoRelayWithoutAnAllowlist(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{ServerArgs: []string{"-egress-socket=/run/fusebox/egress.sock"}})
	ctx := testenv.Context(t, 3*time.Minute)
	srv := newEgressServer(t, "unreachable", false)
	if got := sandboxtest.Sh(t, ctx, b.Client, "env | grep -i _proxy= || true"); got != "" {
		t.Errorf("proxy variables in a sandbox allocated without egress: %q", got)
	}
	// Nothing listens on the relay's port: curl's exit 7 is "failed to connect" (to the
	// proxy), not a refusal by it.
	res, err := b.Client.Exec(ctx, client.Command{Script: "curl -sS --max-time 20 -x http://127.0.0.1:3128 " + srv.URL + "/",
		Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 7 {
		t.Errorf("curl through 127.0.0.1:3128 in a sandbox without egress: exit %d, stdout %q, stderr %q; want 7, nothing listening",
			res.ExitCode, res.Stdout, res.Stderr)
	}
	if strings.Contains(b.Log(), "egress relay started") {
		t.Errorf("the relay started without an allowlist:\n%s", b.Log())
	}
	if n := srv.hits.Load(); n != 0 {
		t.Errorf("the server got %d requests from a sandbox without egress", n)
	}
}

func TestEgressListenMustBeLoopback(t *testing.T) {
	bin := sandboxtest.SandboxBinary(t)
	for _, addr := range []string{"0.0.0.0:3128", ":3128", "localhost:3128", "10.0.0.1:3128"} {
		// Refused while parsing flags, before anything listens.
		out, err := exec.Command(bin, "-egress-socket=/run/fusebox/egress.sock", "-egress-listen="+addr).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "loopback") {
			t.Errorf("-egress-listen=%s: %v, output %q; want exit 2 naming loopback", addr, err, out)
		}
	}
}
