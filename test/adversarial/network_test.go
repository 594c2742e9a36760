package adversarial

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fusebox-dev/fusebox/client"
)

// loopbackServer is an HTTP server on the host's loopback that counts its requests.
type loopbackServer struct {
	*httptest.Server
	hits atomic.Int64
}

func newLoopbackServer(t *testing.T, network, addr, body string) *loopbackServer {
	t.Helper()
	s := &loopbackServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		fmt.Fprint(w, body)
	}))
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err != nil || !ap.Addr().IsLoopback() {
		t.Fatalf("test server on %s, want loopback", ln.Addr())
	}
	return s
}

func (s *loopbackServer) hostPort() string { return s.Listener.Addr().String() }
func (s *loopbackServer) port() string {
	_, p, _ := net.SplitHostPort(s.hostPort())
	return p
}

// viaRelay makes curl use the sandbox's relay for every destination, loopback ones included
// (the sandbox's NO_PROXY names localhost and ::1).
const viaRelay = "env -u NO_PROXY -u no_proxy curl -sS --max-time 20 -x http://127.0.0.1:3128"

// curlResult is what a curl inside the sandbox did.
type curlResult struct {
	exit          int
	body, stderr  string
	code, connect string // HTTP status of the request and of the CONNECT ("000": none)
}

// curl runs `viaRelay flags url` inside the sandbox.
func curl(t *testing.T, ctx context.Context, c *client.Sandbox, flags, url string) curlResult {
	t.Helper()
	script := viaRelay + " -w '\n@@%{http_code} %{http_connect}' " + flags + " '" + url + "'"
	res := run(t, ctx, c, client.Command{Script: script})
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

// pyConnect is a Python attempt to open a connection of family and type to addr, which must
// fail in the sandbox.
const pyConnect = pyPrelude + `
fam, typ, addr = sys.argv[1], sys.argv[2], sys.argv[3]
f = {"inet": socket.AF_INET, "inet6": socket.AF_INET6, "unix": socket.AF_UNIX}[fam]
if fam != "unix":
    host, port = addr.rsplit(":", 1)
    addr = (host.strip("[]"), int(port))
s = socket.socket(f, socket.SOCK_DGRAM if typ == "udp" else socket.SOCK_STREAM)
s.settimeout(5)
try:
    if typ == "udp":
        # A DNS query for a name that does not exist; an answer of any kind is an escape.
        q = bytes.fromhex("abcd01000001000000000000") + b"\x07fusebox\x07invalid\x00\x00\x01\x00\x01"
        s.sendto(q, addr)
        data, _ = s.recvfrom(512)
        report(True, "answer of %d bytes from %s" % (len(data), addr))
    else:
        s.connect(addr)
        report(True, "connected to %s" % (addr,))
except socket.timeout:
    report(False, "timed out (no answer)")
except OSError as e:
    report(False, errno.errorcode.get(e.errno, str(e.errno)))
`

// networkAttacks try to reach anything but the egress allowlist from inside a sandbox: other
// addresses directly, the host's resolver, the manager, other sandboxes, and the egress proxy
// with destinations it must refuse.
func networkAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "network")
	ctx := g.ctx
	allowed := newLoopbackServer(t, "tcp4", "127.0.0.1:0", "allowed")
	other := newLoopbackServer(t, "tcp4", "127.0.0.1:0", "must not be reached")
	l := s.allocate(t, ctx, allowed.hostPort())
	c := l.C

	// Every attempt at an address off the machine is made from inside the sandbox, which has
	// no interface but loopback and no route: checked first, and nothing more is tried if not.
	g.attack("find a network interface or route", "read /proc/net/dev, /proc/net/route and /proc/net/ipv6_route", func(t *testing.T) verdict {
		res := run(t, ctx, c, commandf("cat /proc/net/dev; echo @@; tail -n +2 /proc/net/route; echo @@; cat /proc/net/ipv6_route"))
		parts := strings.Split(string(res.Stdout), "@@")
		if res.ExitCode != 0 || len(parts) != 3 {
			t.Fatalf("reading the sandbox's network: exit %d, %q, %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		var ifaces []string
		for _, line := range strings.Split(parts[0], "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
				ifaces = append(ifaces, strings.TrimSpace(name))
			}
		}
		if len(ifaces) != 1 || ifaces[0] != "lo" || strings.TrimSpace(parts[1]) != "" || strings.TrimSpace(parts[2]) != "" {
			return escapedf("interfaces %q, routes %q, IPv6 routes %q", ifaces, parts[1], parts[2])
		}
		return refusedf("the only interface is lo, and there is no route")
	})
	if t.Failed() {
		t.Fatal("the sandbox has a network: no attempt at an address off the machine is made")
	}

	direct := []struct{ name, fam, typ, addr string }{
		{"the metadata address", "inet", "tcp", "169.254.169.254:80"},
		{"the IPv6 metadata address", "inet6", "tcp", "[fd00:ec2::254]:80"},
		{"a private address", "inet", "tcp", "10.0.0.1:443"},
		{"the allowed server directly", "inet", "tcp", allowed.hostPort()},
		{"the other server directly", "inet", "tcp", other.hostPort()},
	}
	if a := hostAddress(); a != "" {
		direct = append(direct, struct{ name, fam, typ, addr string }{"the host's own address", "inet", "tcp", net.JoinHostPort(a, "22")})
	}
	if ns := hostResolver(t); ns != "" {
		direct = append(direct,
			struct{ name, fam, typ, addr string }{"the host's resolver over UDP", "inet", "udp", net.JoinHostPort(ns, "53")},
			struct{ name, fam, typ, addr string }{"the host's resolver over TCP", "inet", "tcp", net.JoinHostPort(ns, "53")})
	}
	for _, d := range direct {
		g.attack("reach "+d.name, fmt.Sprintf("%s %s to %s, bypassing the relay", d.fam, d.typ, d.addr), func(t *testing.T) verdict {
			return python(t, ctx, c, pyConnect, d.fam, d.typ, d.addr)
		})
	}
	g.attack("resolve a name", "getent hosts fusebox.invalid (the sandbox's resolv.conf names the host's resolver)", func(t *testing.T) verdict {
		res := run(t, ctx, c, commandf("getent hosts fusebox.invalid"))
		if res.ExitCode == 0 {
			return escapedf("resolved: %q", res.Stdout)
		}
		return refusedf("getent exit %d", res.ExitCode)
	})
	if n := allowed.hits.Load() + other.hits.Load(); n != 0 {
		t.Errorf("a direct connection reached the host's servers (%d requests)", n)
	}

	// Unix sockets of the host: the manager's, other sandboxes', the sandbox's own server's.
	sockets := map[string]string{
		"the manager's socket":         s.m.Socket,
		"the bystander's data socket":  filepath.Join(s.m.StateDir, "sandboxes", s.bystander.ID, "sock", "data.sock"),
		"its own server's data socket": "/run/fusebox/data.sock",
		"its own server's init socket": "/run/fusebox/init.sock",
		"a warm unit's init socket":    filepath.Join(s.m.StateDir, "sandboxes", s.readyUnit(t, ctx), "sock", "init.sock"),
	}
	for name, path := range sockets {
		g.attack("connect to "+name, "AF_UNIX connect to "+path, func(t *testing.T) verdict {
			return python(t, ctx, c, pyConnect, "unix", "stream", path)
		})
	}

	// The egress proxy: the allowed server is reachable (the control), nothing else is.
	if r := curl(t, ctx, c, "", "http://"+allowed.hostPort()+"/"); r.code != "200" || r.body != "allowed" {
		t.Fatalf("control: the allowed server through the relay: %+v", r)
	}
	allowedHits := allowed.hits.Load()
	refused403 := func(r curlResult, connect bool) verdict {
		code := r.code
		if connect {
			code = r.connect
		}
		if code != "403" {
			return escapedf("status %s (CONNECT %s), exit %d, body %.200q, stderr %.200q; want 403", r.code, r.connect, r.exit, r.body, r.stderr)
		}
		return refusedf("403 %.200s", strings.TrimSpace(r.body))
	}
	proxied := []struct{ name, flags, url string }{
		{"GET a loopback server not on the allowlist", "", "http://" + other.hostPort() + "/"},
		{"CONNECT a loopback server not on the allowlist", "-p", "http://" + other.hostPort() + "/"},
		{"CONNECT a closed loopback port", "-p", "http://127.0.0.1:1/"},
		{"CONNECT the relay's own port on the host", "-p", "http://127.0.0.1:3128/"},
		{"CONNECT 0.0.0.0 at the allowed port", "-p", "http://0.0.0.0:" + allowed.port() + "/"},
		{"CONNECT 127.0.0.2 at the allowed port", "-p", "http://127.0.0.2:" + allowed.port() + "/"},
		{"CONNECT ::1 at the allowed port", "-p", "http://[::1]:" + allowed.port() + "/"},
		{"GET the allowed host at another port", "", "http://127.0.0.1:" + other.port() + "/"},
	}
	for _, p := range proxied {
		g.attack(p.name, viaRelay+" "+p.flags+" "+p.url, func(t *testing.T) verdict {
			return refused403(curl(t, ctx, c, p.flags, p.url), p.flags == "-p")
		})
	}
	raw := []struct{ name, request string }{
		{"CONNECT with the allowed server as Host", "CONNECT " + other.hostPort() + " HTTP/1.1\r\nHost: " + allowed.hostPort() + "\r\n\r\n"},
		{"GET pipelined behind an allowed GET", "GET http://" + allowed.hostPort() + "/ HTTP/1.1\r\nHost: " + allowed.hostPort() + "\r\n\r\n" +
			"GET http://" + other.hostPort() + "/ HTTP/1.1\r\nHost: " + other.hostPort() + "\r\n\r\n"},
		{"GET with an allowed absolute URI and another Host", "GET http://" + allowed.hostPort() + "/ HTTP/1.1\r\nHost: " + other.hostPort() + "\r\n\r\n"},
		{"GET with a relative URI and another Host", "GET / HTTP/1.1\r\nHost: " + other.hostPort() + "\r\n\r\n"},
	}
	for _, r := range raw {
		g.attack(r.name, fmt.Sprintf("raw request to the relay: %q", r.request), func(t *testing.T) verdict {
			before := other.hits.Load()
			res := run(t, ctx, c, client.Command{Argv: []string{"python3", "-c", pyRawProxy, r.request}})
			if res.ExitCode != 0 {
				t.Fatalf("raw request: exit %d, stderr %q", res.ExitCode, res.Stderr)
			}
			if n := other.hits.Load() - before; n != 0 {
				return escapedf("the server not on the allowlist saw %d requests; answers %.300q", n, res.Stdout)
			}
			return refusedf("the server not on the allowlist saw nothing; answers %.200q", statusLines(res.Stdout))
		})
	}
	if n := other.hits.Load(); n != 0 {
		t.Errorf("the server not on the allowlist saw %d requests", n)
	}
	t.Logf("the allowed server saw %d requests after the control's %d", allowed.hits.Load()-allowedHits, allowedHits)
	if err := s.unharmed(ctx, l); err != nil {
		t.Errorf("after the network attacks: %v", err)
	}
}

// pyRawProxy writes argv[1] to the relay and prints what comes back within a few seconds.
const pyRawProxy = `import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(sys.argv[1].encode())
s.settimeout(3)
out = b""
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
except socket.timeout:
    pass
sys.stdout.write(out.decode("latin-1"))
`

// statusLines returns the HTTP status lines of out.
func statusLines(out []byte) []string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "HTTP/") {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// hostAddress returns one of the host's non-loopback IPv4 addresses ("" if none). It is only
// read here; the sandbox tries to connect to it.
func hostAddress() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr().String()
		}
	}
	return ""
}

// hostResolver returns the first IPv4 nameserver of the host's /etc/resolv.conf ("" if none).
// It is only read here; the sandbox tries to query it.
func hostResolver(t *testing.T) string {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		t.Logf("no host resolver to try: %v", err)
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() {
				return a.String()
			}
		}
	}
	return ""
}
