package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/echotest"
	"github.com/fusebox-dev/fusebox/internal/leakcheck"
	"github.com/fusebox-dev/fusebox/internal/syncbuf"
)

// recorder records the calls of a Proxy's Dial and Resolve.
type recorder struct {
	mu       sync.Mutex
	dials    []string
	resolves []string
}

func (r *recorder) Dials() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.dials)
}

func (r *recorder) Resolves() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.resolves)
}

// options returns ProxyOptions whose Dial records the address and then dials redirect(addr)
// on loopback, and whose Resolve records the name and answers from names. Its hosts file is
// empty (/dev/null), so that the machine's does not answer for names.
func (r *recorder) options(names map[string][]netip.Addr, redirect func(string) string) ProxyOptions {
	return ProxyOptions{
		Logger:    slog.New(slog.DiscardHandler),
		HostsFile: os.DevNull,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			r.mu.Lock()
			r.dials = append(r.dials, addr)
			r.mu.Unlock()
			if redirect != nil {
				addr = redirect(addr)
			}
			ap, err := netip.ParseAddrPort(addr)
			if err != nil || !ap.Addr().IsLoopback() {
				return nil, fmt.Errorf("test dialer: refusing non-loopback %q", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			r.mu.Lock()
			r.resolves = append(r.resolves, host)
			r.mu.Unlock()
			if a, ok := names[host]; ok {
				return a, nil
			}
			return nil, fmt.Errorf("test resolver: no such host %q", host)
		},
	}
}

// startProxy serves a Proxy on a unix socket in a temporary directory and closes it when the
// test ends, failing the test if Serve did not return nil.
func startProxy(t *testing.T, o ProxyOptions) (*Proxy, string) {
	t.Helper()
	p := NewProxy(o)
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return p, sock
}

func mustAllow(t *testing.T, p *Proxy, entries ...string) {
	t.Helper()
	a, err := ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	p.SetAllowlist(a)
}

// echoServer listens on 127.0.0.1 and echoes every connection (see echotest.Serve). It
// returns host:port.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echotest.Serve(t, ln)
	return ln.Addr().String()
}

// closedPort returns a loopback address on which nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// roundTrip sends a raw request to the proxy on a new connection and reads the response
// head; the connection stays open for a tunnel.
func roundTrip(t *testing.T, sock, raw string) (net.Conn, *bufio.Reader, *http.Response, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	method, _, _ := strings.Cut(raw, " ")
	res, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading the response to %q: %v", raw, err)
	}
	var body string
	if method != http.MethodConnect || res.StatusCode != http.StatusOK {
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = string(b)
	}
	return c, br, res, body
}

func connect(t *testing.T, sock, target string) (net.Conn, *bufio.Reader, *http.Response, string) {
	t.Helper()
	return roundTrip(t, sock, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
}

// expectEcho writes msg into the tunnel and expects it back.
func expectEcho(t *testing.T, c net.Conn, br *bufio.Reader, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
		t.Fatalf("echo: got %q (%v), want %q", got, err, msg)
	}
}

func TestConnectAllowed(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))
	mustAllow(t, p, "api.github.com:443", echo)

	c, br, res, _ := connect(t, sock, echo)
	if res.StatusCode != http.StatusOK || res.Status != "200 Connection established" {
		t.Fatalf("CONNECT %s: %s", echo, res.Status)
	}
	expectEcho(t, c, br, "ping")
	expectEcho(t, c, br, strings.Repeat("x", 200<<10))
	// Half-close: the upstream sees end-of-stream, answers it, and the client reads to EOF.
	if _, err := io.WriteString(c, "last"); err != nil {
		t.Fatal(err)
	}
	c.(*net.UnixConn).CloseWrite()
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "last" {
		t.Fatalf("after half-close: got %q (%v), want %q then EOF", rest, err, "last")
	}
	if d := rec.Dials(); !slices.Equal(d, []string{echo}) {
		t.Errorf("dials = %q, want [%s]", d, echo)
	}
	if r := rec.Resolves(); len(r) != 0 {
		t.Errorf("an IP-literal destination was resolved: %q", r)
	}
}

func TestConnectPipelinedBytes(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))
	mustAllow(t, p, echo)
	// Bytes sent right behind the CONNECT request, before its response, reach the upstream.
	c, br, res, _ := roundTrip(t, sock, "CONNECT "+echo+" HTTP/1.1\r\nHost: "+echo+"\r\n\r\nearly bytes")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", res.Status)
	}
	got := make([]byte, len("early bytes"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "early bytes" {
		t.Fatalf("got %q (%v)", got, err)
	}
	expectEcho(t, c, br, "more")
}

func TestConnectRefused(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	other := echoServer(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))
	mustAllow(t, p, "api.github.com:443", "*.pypi.org:443", other)

	tests := []struct{ target, dest string }{
		{echo, echo},
		{"example.com:443", "example.com:443"},
		{"blocked.invalid:443", "blocked.invalid:443"},
		{"api.github.com:80", "api.github.com:80"},
		{"pypi.org:443", "pypi.org:443"},
		{"[::1]:443", "[::1]:443"},
	}
	for _, tt := range tests {
		_, _, res, body := connect(t, sock, tt.target)
		want := fmt.Sprintf("fusebox egress: %s is not on this sandbox's egress allowlist (allowed: api.github.com:443, *.pypi.org:443, %s)\n", tt.dest, other)
		if res.StatusCode != http.StatusForbidden || body != want {
			t.Errorf("CONNECT %s: %s %q, want 403 %q", tt.target, res.Status, body, want)
		}
		if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("CONNECT %s: Content-Type %q", tt.target, ct)
		}
	}
	// The check comes before any lookup or connection.
	if d, r := rec.Dials(), rec.Resolves(); len(d) != 0 || len(r) != 0 {
		t.Errorf("refused destinations were dialled %q or resolved %q", d, r)
	}
}

func TestNothingAllowedBeforeSetAllowlist(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))

	_, _, res, body := connect(t, sock, echo)
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, echo+" is not on this sandbox's egress allowlist (no allowlist has been set") {
		t.Fatalf("before SetAllowlist: %s %q", res.Status, body)
	}
	mustAllow(t, p, echo)
	c, br, res, _ := connect(t, sock, echo)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("after SetAllowlist: %s", res.Status)
	}
	expectEcho(t, c, br, "hi")
	// A new allowlist applies to new requests; the open tunnel stays.
	p.SetAllowlist(Allowlist{})
	_, _, res, body = connect(t, sock, echo)
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "(the allowlist is empty: all egress is refused)") {
		t.Fatalf("after an empty allowlist: %s %q", res.Status, body)
	}
	expectEcho(t, c, br, "still open")
	if d := rec.Dials(); len(d) != 1 {
		t.Errorf("dials = %q, want one", d)
	}
}

// upstream is an HTTP server on 127.0.0.1 that describes the requests it gets.
func upstream(t *testing.T) (*httptest.Server, *sync.Map) {
	t.Helper()
	var hits sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Store(r.URL.Path, true)
		body, _ := io.ReadAll(r.Body)
		var hdr []string
		for k := range r.Header {
			hdr = append(hdr, k)
		}
		slices.Sort(hdr)
		w.Header().Set("X-Upstream", "yes")
		fmt.Fprintf(w, "%s %s host=%s headers=%s body=%s", r.Method, r.URL.RequestURI(), r.Host, strings.Join(hdr, ","), body)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestForwardHTTP(t *testing.T) {
	leakcheck.Check(t)
	srv, hits := upstream(t)
	other, otherHits := upstream(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))
	host := srv.Listener.Addr().String()
	otherHost := other.Listener.Addr().String()
	mustAllow(t, p, host)

	t.Run("allowed, hop-by-hop and proxy headers removed", func(t *testing.T) {
		_, _, res, body := roundTrip(t, sock, "GET http://"+host+"/p?q=1 HTTP/1.1\r\nHost: "+host+
			"\r\nProxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nProxy-Foo: 1\r\nConnection: X-Hop\r\nX-Hop: 1\r\nX-Keep: 1\r\nUpgrade: websocket\r\n\r\n")
		want := "GET /p?q=1 host=" + host + " headers=Connection,X-Keep body="
		if res.StatusCode != http.StatusOK || body != want || res.Header.Get("X-Upstream") != "yes" {
			t.Fatalf("got %s %q, want 200 %q", res.Status, body, want)
		}
	})
	t.Run("allowed through net/http with a body", func(t *testing.T) {
		tr := &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "egress.invalid"}),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			},
		}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Post(srv.URL+"/post", "text/plain", strings.NewReader("payload"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "POST /post ") || !strings.HasSuffix(string(b), "body=payload") {
			t.Fatalf("got %s %q", res.Status, b)
		}
	})
	t.Run("refused", func(t *testing.T) {
		_, _, res, body := roundTrip(t, sock, "GET http://"+otherHost+"/secret HTTP/1.1\r\nHost: "+otherHost+"\r\n\r\n")
		want := "fusebox egress: " + otherHost + " is not on this sandbox's egress allowlist (allowed: " + host + ")\n"
		if res.StatusCode != http.StatusForbidden || body != want {
			t.Fatalf("got %s %q, want 403 %q", res.Status, body, want)
		}
		if _, hit := otherHits.Load("/secret"); hit {
			t.Error("the refused server got the request")
		}
	})
	t.Run("default port 80 is checked", func(t *testing.T) {
		_, _, res, body := roundTrip(t, sock, "GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "127.0.0.1:80 is not on") {
			t.Fatalf("got %s %q", res.Status, body)
		}
	})
	if _, hit := hits.Load("/p"); !hit {
		t.Error("the allowed server never got /p")
	}
	for _, d := range rec.Dials() {
		if d != host {
			t.Errorf("dialled %q, only %q is allowed", d, host)
		}
	}
}

func TestBadRequests(t *testing.T) {
	leakcheck.Check(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))
	mustAllow(t, p, "example.com:443", "127.0.0.1:80")
	tests := []struct {
		raw  string
		want string
	}{
		{"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "is not a proxy request"},
		{"GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", "for https use CONNECT example.com:443"},
		{"GET ftp://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", "is not a proxy request"},
		{"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", `bad CONNECT target "example.com"`},
		{"CONNECT example.com:0 HTTP/1.1\r\nHost: example.com\r\n\r\n", "bad CONNECT target"},
		{"CONNECT example.com:https HTTP/1.1\r\nHost: example.com\r\n\r\n", ""}, // refused by net/http itself
		{"CONNECT :443 HTTP/1.1\r\nHost: x\r\n\r\n", "bad CONNECT target"},
		{"GET http://127.0.0.1:99999/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "bad URI"},
	}
	for _, tt := range tests {
		_, _, res, body := roundTrip(t, sock, tt.raw)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, tt.want) {
			t.Errorf("%q: got %s %q, want 400 containing %q", tt.raw, res.Status, body, tt.want)
		}
	}
	if d, r := rec.Dials(), rec.Resolves(); len(d) != 0 || len(r) != 0 {
		t.Errorf("bad requests were dialled %q or resolved %q", d, r)
	}
}

func TestNamesResolvingToInternalAddressesRefused(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	names := map[string][]netip.Addr{
		"internal.test.":  {netip.MustParseAddr("127.0.0.1")},
		"mixed.test.":     {netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("10.0.0.1")},
		"metadata.test.":  {netip.MustParseAddr("169.254.169.254")},
		"mapped.test.":    {netip.MustParseAddr("::ffff:192.168.0.1")},
		"public.test.":    {netip.MustParseAddr("203.0.113.7")},
		"public6.test.":   {netip.MustParseAddr("2606:4700::1")},
		"a.wild.test.":    {netip.MustParseAddr("fd00:ec2::254")},
		"empty.test.":     {},
		"nat64-lo.test.":  {netip.MustParseAddr("64:ff9b::7f00:1")},
		"unresolvable.x.": nil,
	}
	var rec recorder
	// The "public" addresses are never contacted: the test dialer sends every dial to the
	// loopback echo server after recording it.
	p, sock := startProxy(t, rec.options(names, func(string) string { return echo }))
	var entries []string
	for _, n := range []string{"internal.test", "mixed.test", "metadata.test", "mapped.test", "public.test", "public6.test", "*.wild.test", "empty.test", "nat64-lo.test"} {
		entries = append(entries, n+":"+port)
	}
	mustAllow(t, p, entries...)

	for _, tt := range []struct{ name, addr string }{
		{"internal.test", "127.0.0.1"},
		{"mixed.test", "10.0.0.1"},
		{"metadata.test", "169.254.169.254"},
		{"mapped.test", "::ffff:192.168.0.1"},
		{"a.wild.test", "fd00:ec2::254"},
		{"nat64-lo.test", "64:ff9b::7f00:1"},
	} {
		want := fmt.Sprintf("fusebox egress: %s resolved to %s (from DNS), a blocked internal address", tt.name, tt.addr)
		_, _, res, body := connect(t, sock, tt.name+":"+port)
		if res.StatusCode != http.StatusForbidden || !strings.HasPrefix(body, want) {
			t.Errorf("CONNECT %s: %s %q, want 403 starting %q", tt.name, res.Status, body, want)
		}
		_, _, res, body = roundTrip(t, sock, "GET http://"+tt.name+":"+port+"/ HTTP/1.1\r\nHost: x\r\n\r\n")
		if res.StatusCode != http.StatusForbidden || !strings.HasPrefix(body, want) {
			t.Errorf("GET %s: %s %q, want 403 starting %q", tt.name, res.Status, body, want)
		}
	}
	if d := rec.Dials(); len(d) != 0 {
		t.Fatalf("names resolving to internal addresses were dialled: %q", d)
	}
	for _, name := range []string{"empty.test", "unresolvable.x"} {
		mustAllow(t, p, name+":"+port)
		_, _, res, body := connect(t, sock, name+":"+port)
		if res.StatusCode != http.StatusBadGateway || !strings.Contains(body, "cannot resolve "+name) {
			t.Errorf("CONNECT %s: %s %q, want 502 cannot resolve", name, res.Status, body)
		}
	}
	mustAllow(t, p, entries...)

	// A public answer is dialled by address, not by name.
	c, br, res, _ := connect(t, sock, "PUBLIC.test.:"+port)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT public.test: %s", res.Status)
	}
	expectEcho(t, c, br, "via the checked address")
	_, _, res, _ = connect(t, sock, "public6.test:"+port)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT public6.test: %s", res.Status)
	}
	if d, want := rec.Dials(), []string{"203.0.113.7:" + port, "[2606:4700::1]:" + port}; !slices.Equal(d, want) {
		t.Errorf("dials = %q, want %q", d, want)
	}
	if r := rec.Resolves(); !slices.Contains(r, "public.test.") || !slices.Contains(r, "internal.test.") {
		t.Errorf("resolves = %q, want fully qualified lower-case names", r)
	}
}

func TestDialFailure(t *testing.T) {
	leakcheck.Check(t)
	dead := closedPort(t)
	var rec recorder
	p, sock := startProxy(t, rec.options(nil, nil))
	mustAllow(t, p, dead)
	_, _, res, body := connect(t, sock, dead)
	if res.StatusCode != http.StatusBadGateway || !strings.HasPrefix(body, "fusebox egress: "+dead+" is allowed but cannot be reached: ") {
		t.Fatalf("got %s %q", res.Status, body)
	}
}

func TestCloseEndsTunnels(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	var rec recorder
	p := NewProxy(rec.options(nil, nil))
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	mustAllow(t, p, echo)
	tunnels := openTunnels(t, sock, echo, 3, "x")
	idle, err := net.Dial("unix", sock) // a client connection with no request yet
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close = %v, want nil", err)
	}
	for i, c := range append(tunnels, idle) {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Errorf("connection %d after Close: read %d, %v; want EOF", i, n, err)
		}
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Error("the socket still accepts after Close")
	}
	if err := p.Serve(newUnixListener(t)); err != nil {
		t.Errorf("Serve after Close = %v, want nil", err)
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

func newUnixListener(t *testing.T) net.Listener {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "other.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestIdleTunnelClosed(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	var rec recorder
	o := rec.options(nil, nil)
	o.IdleTimeout = 300 * time.Millisecond
	p, sock := startProxy(t, o)
	mustAllow(t, p, echo)
	c, br, res, _ := connect(t, sock, echo)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", res.Status)
	}
	// Traffic keeps the tunnel open well past the idle timeout...
	for i := range 20 {
		expectEcho(t, c, br, strconv.Itoa(i))
		time.Sleep(50 * time.Millisecond)
	}
	// ...and silence ends it.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("idle tunnel: read %d, %v; want EOF", n, err)
	}
}

func TestDecisionsLogged(t *testing.T) {
	leakcheck.Check(t)
	srv, _ := upstream(t)
	host := srv.Listener.Addr().String()
	var rec recorder
	var logs syncbuf.Buffer
	o := rec.options(nil, nil)
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	p, sock := startProxy(t, o)
	mustAllow(t, p, host)
	roundTrip(t, sock, "POST http://"+host+"/ HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nBODY-SECRET")
	roundTrip(t, sock, "CONNECT refused.invalid:443 HTTP/1.1\r\nHost: x\r\n\r\n")
	out := logs.String()
	for _, want := range []string{
		`msg="egress allowed" method=POST dest=` + host,
		`msg="egress refused" method=CONNECT dest=refused.invalid:443 status=403 reason="not on the allowlist"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "BODY-SECRET") {
		t.Errorf("a request body was logged:\n%s", out)
	}
}

// TestConnectionCap: a sandbox holding MaxConns connections gets a 503 naming the limit for
// the next one, and gets its slot back when a tunnel closes.
func TestConnectionCap(t *testing.T) {
	leakcheck.Check(t)
	echo := echoServer(t)
	var rec recorder
	o := rec.options(nil, nil)
	o.MaxConns = 2
	p, sock := startProxy(t, o)
	mustAllow(t, p, echo)
	tunnels := openTunnels(t, sock, echo, 2, "ping")
	c, _, res, body := connect(t, sock, echo)
	c.Close()
	want := "fusebox egress: this sandbox has 2 connections open through its egress proxy, the most it may; close some and retry\n"
	if res.StatusCode != http.StatusServiceUnavailable || body != want {
		t.Fatalf("CONNECT over the cap: %s %q, want 503 %q", res.Status, body, want)
	}
	tunnels[0].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, br, res, _ := connect(t, sock, echo)
		if res.StatusCode == http.StatusOK {
			expectEcho(t, c, br, "pong")
			c.Close()
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("no slot after a tunnel closed: %s", res.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	tunnels[1].Close()
}

// openTunnels opens n CONNECT tunnels through the proxy at sock to the echo server and checks
// that each echoes msg.
func openTunnels(t *testing.T, sock, echo string, n int, msg string) []net.Conn {
	t.Helper()
	var tunnels []net.Conn
	for i := range n {
		c, br, res, _ := connect(t, sock, echo)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT %d of %d: %s", i+1, n, res.Status)
		}
		expectEcho(t, c, br, msg)
		tunnels = append(tunnels, c)
	}
	return tunnels
}
