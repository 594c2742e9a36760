// Package egress is the host side of a sandbox's only way out: an HTTP proxy, served on a
// per-sandbox unix socket, that lets a sandbox reach exactly the destinations on its
// allocation's allowlist and nothing else.
//
// Sandboxes run with no network (gVisor --network=none); fusebox-sandbox relays a loopback
// port inside the sandbox to this proxy's socket and gives commands HTTP_PROXY and
// HTTPS_PROXY (see package github.com/fusebox-dev/fusebox/sandbox-server/relay). The proxy
// accepts CONNECT host:port (HTTPS and any other TCP) and plain HTTP forward-proxy requests
// with absolute http:// URIs. It checks every destination against the Allowlist before it
// resolves or dials anything, refuses names that resolve to internal addresses, and dials
// the address it checked. Refusals are 403 responses whose body says what was refused and
// why, in words an agent can act on.
//
// # Resolution
//
// The sandbox never resolves anything (it has no network and is given no resolver); an
// allowlisted name is resolved by this proxy, on the host, the same way for every name,
// single-label ("localhost", an alias the operator keeps) or not:
//  1. the host's hosts file (ProxyOptions.HostsFile, /etc/hosts), matched exactly, case and a
//     trailing dot aside, re-read when it changes;
//  2. otherwise DNS, through the host's resolver, for the name fully qualified (with a
//     trailing dot, so that no search domain is appended).
//
// Either answer is then checked: a name that leads to any internal address (loopback,
// private, link-local, metadata and the like; see isInternal) is refused, so "localhost:8000"
// on an allowlist reaches nothing, and the refusal names the IP-literal entry that would
// ("127.0.0.1:8000"). Go's resolver alone would skip the hosts file for single-label names
// asked fully qualified ("localhost." is not the hosts file's "localhost"), so the proxy reads
// the file itself.
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
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the optional ProxyOptions fields and the proxy's fixed limits.
const (
	DefaultDialTimeout = 10 * time.Second
	DefaultIdleTimeout = 10 * time.Minute
	// DefaultMaxConns bounds one sandbox's open connections to its proxy.
	DefaultMaxConns = 256
	// resolveTimeout bounds the host's DNS lookup of one destination.
	resolveTimeout = 10 * time.Second
	// readHeaderTimeout bounds how long a client may take to send a request's headers.
	readHeaderTimeout = 30 * time.Second
	// keepAliveTimeout closes client connections idle between requests.
	keepAliveTimeout = 2 * time.Minute
)

// ProxyOptions configure a Proxy. Every field is optional.
type ProxyOptions struct {
	// Dial connects to an address that passed every check, always an IP:port literal.
	// Default: a net.Dialer with a 10 s timeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HostsFile is the hosts(5) file looked up first for every allowlisted name (see
	// Resolution in the package documentation). Default: DefaultHostsFile.
	HostsFile string
	// Resolve looks up an allowlisted name the hosts file does not hold. It is given the name
	// fully qualified, with a trailing dot, so that no search domain applies. Default:
	// net.DefaultResolver.LookupNetIP with network "ip".
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Logger receives one record per decision (destination, allowed or refused, why); no
	// request or response bodies are logged. Default: slog.Default().
	Logger *slog.Logger
	// IdleTimeout closes a CONNECT tunnel that carried no byte in either direction for this
	// long. Default: 10 minutes.
	IdleTimeout time.Duration
	// MaxConns bounds the connections open to the proxy at once (tunnels included), so that
	// a sandbox cannot exhaust the host's file descriptors or ports through it; one more is
	// answered with a 503 that says so and closed. Default: DefaultMaxConns.
	MaxConns int
}

// Proxy is the egress proxy of one sandbox. It refuses every destination until SetAllowlist
// is called. It is safe for concurrent use.
type Proxy struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	hosts   *hostsFile
	log     *slog.Logger
	idle    time.Duration
	srv     *http.Server

	maxConns int
	conns    atomic.Int64 // connections accepted and not yet closed

	// allow is the current allowlist; nil until SetAllowlist, which refuses everything.
	allow atomic.Pointer[Allowlist]

	mu sync.Mutex // guards closed and tunnels, and orders tunnels.Add against Close's Wait
	// closed is set by Close; no tunnel starts after it.
	closed bool
	// tunnels holds both connections of every live CONNECT tunnel (the server forgets
	// hijacked connections), so that Close can end them.
	tunnels map[net.Conn]struct{}
	// tunnelsDone counts the tunnels' goroutines; Close waits for them.
	tunnelsDone sync.WaitGroup
}

// NewProxy returns a Proxy that refuses everything until SetAllowlist is called.
func NewProxy(o ProxyOptions) *Proxy {
	p := &Proxy{dial: o.Dial, resolve: o.Resolve, log: o.Logger, idle: o.IdleTimeout, maxConns: o.MaxConns,
		tunnels: make(map[net.Conn]struct{})}
	if p.maxConns <= 0 {
		p.maxConns = DefaultMaxConns
	}
	if p.dial == nil {
		p.dial = (&net.Dialer{Timeout: DefaultDialTimeout}).DialContext
	}
	if o.HostsFile == "" {
		o.HostsFile = DefaultHostsFile
	}
	p.hosts = &hostsFile{path: o.HostsFile}
	if p.resolve == nil {
		p.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.idle <= 0 {
		p.idle = DefaultIdleTimeout
	}
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       keepAliveTimeout,
		// Client-side protocol errors are the sandbox's business, not operator noise.
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	return p
}

// SetAllowlist replaces the allowlist for the requests that arrive from now on. Tunnels
// already open are not affected.
func (p *Proxy) SetAllowlist(a Allowlist) { p.allow.Store(&a) }

// Serve serves the proxy on ln until Close is called (it then returns nil) or ln fails (it
// returns the listener's error). It may be called for several listeners. ln is closed when
// Serve returns.
func (p *Proxy) Serve(ln net.Listener) error {
	if err := p.srv.Serve(&capListener{Listener: ln, p: p}); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close closes the listeners and every client connection, ends the live tunnels and waits
// for their goroutines. Requests arriving afterwards are never served.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.tunnels))
	for c := range p.tunnels {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.srv.Close()
	for _, c := range conns {
		c.Close()
	}
	p.tunnelsDone.Wait()
	return err
}

// capListener counts the proxy's open connections and turns away those over MaxConns.
type capListener struct {
	net.Listener
	p *Proxy
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.p.conns.Add(1); n > int64(l.p.maxConns) {
			l.p.conns.Add(-1)
			l.p.log.Warn("egress refused", "why", "too many connections", "limit", l.p.maxConns)
			go refuseBusy(c, l.p.maxConns)
			continue
		}
		return &countedConn{Conn: c, n: &l.p.conns}, nil
	}
}

// refuseBusy answers a connection over the limit. It reads the request's head first (briefly,
// and at most 64 KiB), so that the client's write does not meet a closed socket and it gets
// to read the answer.
func refuseBusy(c net.Conn, limit int) {
	defer c.Close()
	body := fmt.Sprintf("fusebox egress: this sandbox has %d connections open through its egress proxy, the most it may; close some and retry\n", limit)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	http.ReadRequest(bufio.NewReader(io.LimitReader(c, 64<<10))) // its outcome does not matter
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// countedConn gives its slot back once, on the first Close (the server's or, for a hijacked
// CONNECT tunnel, the tunnel's).
type countedConn struct {
	net.Conn
	n    *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return c.Conn.Close()
}

// serveHTTP dispatches on the request form: CONNECT authority, or an absolute http:// URI.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		p.connect(w, r)
	case r.URL.Scheme == "http" && r.URL.Host != "":
		p.forward(w, r)
	case r.URL.Scheme == "https":
		p.fail(w, r, r.URL.Host, http.StatusBadRequest, "bad request",
			"fusebox egress: %s %s: this proxy does not originate TLS; for https use CONNECT %s (clients do this when HTTPS_PROXY is set)\n",
			r.Method, r.URL.Redacted(), hostPort(r.URL))
	default:
		p.fail(w, r, "", http.StatusBadRequest, "bad request",
			"fusebox egress: %s %q is not a proxy request: send CONNECT host:port, or a request for an absolute http:// URI\n",
			r.Method, r.RequestURI)
	}
}

// connect serves CONNECT host:port: it checks and dials the destination, then joins the
// client's connection to it.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	host, portStr, err := net.SplitHostPort(r.URL.Host)
	port, perr := parsePort(portStr)
	if err != nil || perr != nil || host == "" || r.URL.Path != "" {
		p.fail(w, r, r.RequestURI, http.StatusBadRequest, "bad CONNECT target",
			"fusebox egress: bad CONNECT target %q: want host:port, with the port (IPv6 in brackets)\n", r.RequestURI)
		return
	}
	upstream, ok := p.open(w, r, host, int(port))
	if !ok {
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		upstream.Close()
		p.fail(w, r, r.URL.Host, http.StatusInternalServerError, "cannot hijack", "fusebox egress: internal error: cannot take over the connection\n")
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		upstream.Close()
		p.log.Warn("egress tunnel not started", "dest", r.URL.Host, "err", err)
		return
	}
	if !p.track(client, upstream) {
		client.Close()
		upstream.Close()
		return
	}
	defer p.tunnelsDone.Done()
	defer p.untrack(client, upstream)
	// The server may have left deadlines on the hijacked connection; the tunnel's own idle
	// timer replaces them.
	client.SetDeadline(time.Time{})
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		client.Close()
		upstream.Close()
		return
	}
	p.splice(r.URL.Host, client, upstream, brw.Reader)
}

// forward serves one plain-HTTP request for an absolute http:// URI over a fresh connection
// to the checked destination.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	authority := r.URL.Host
	host := r.URL.Hostname()
	port := uint16(80)
	if s := r.URL.Port(); s != "" || strings.HasSuffix(authority, ":") {
		n, err := parsePort(s)
		if err != nil || host == "" {
			p.fail(w, r, authority, http.StatusBadRequest, "bad URI",
				"fusebox egress: bad URI %q: %v\n", r.URL.Redacted(), err)
			return
		}
		port = n
	}
	upstream, ok := p.open(w, r, host, int(port))
	if !ok {
		return
	}
	// The transport takes the already-checked connection instead of dialling: it cannot
	// reach anything else, and with keep-alives off it never asks twice.
	var pending atomic.Pointer[net.Conn]
	pending.Store(&upstream)
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if c := pending.Swap(nil); c != nil {
				return *c, nil
			}
			return nil, errors.New("connection already used")
		},
		DisableKeepAlives:  true,
		DisableCompression: true, // pass Accept-Encoding and the encoded body through as they are
	}
	defer func() {
		if c := pending.Swap(nil); c != nil {
			(*c).Close()
		}
		tr.CloseIdleConnections()
	}()
	rp := &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			// ReverseProxy has removed the hop-by-hop headers; Proxy-* headers (credentials
			// for this proxy) go too, and so do upgrades: an upgraded connection would outlive
			// the request and escape Close (clients tunnel WebSockets with CONNECT).
			for k := range pr.Out.Header {
				if strings.HasPrefix(k, "Proxy-") {
					delete(pr.Out.Header, k)
				}
			}
			pr.Out.Header.Del("Connection")
			pr.Out.Header.Del("Upgrade")
			pr.Out.URL = &url.URL{Scheme: "http", Host: authority, Path: pr.In.URL.Path,
				RawPath: pr.In.URL.RawPath, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = authority
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.Warn("egress request failed", "method", r.Method, "dest", authority, "err", err)
			writeText(w, http.StatusBadGateway, fmt.Sprintf("fusebox egress: %s %s: %v\n", r.Method, r.URL.Redacted(), err))
		},
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	rp.ServeHTTP(w, r)
}

// open checks host:port against the allowlist and, for a name, its resolved addresses, then
// dials the first checked address that answers. On refusal or failure it has written the
// response and returns false.
func (p *Proxy) open(w http.ResponseWriter, r *http.Request, host string, port int) (net.Conn, bool) {
	dst := net.JoinHostPort(host, strconv.Itoa(port))
	a := p.allow.Load()
	var d dest
	ok := false
	if a != nil {
		d, ok = a.match(host, port)
	}
	if !ok {
		p.fail(w, r, dst, http.StatusForbidden, "not on the allowlist", "%s", notAllowed(dst, a))
		return nil, false
	}
	var addrs []netip.AddrPort
	if d.ip.IsValid() {
		addrs = []netip.AddrPort{netip.AddrPortFrom(d.ip, d.port)}
	} else {
		ips, from, err := p.lookup(r.Context(), d.name)
		if err != nil {
			p.fail(w, r, dst, http.StatusBadGateway, "cannot resolve",
				"fusebox egress: cannot resolve %s: %v\n", d.name, err)
			return nil, false
		}
		for _, ip := range ips {
			// Any internal address refuses the name, so that a rebinding answer cannot
			// hide behind a public one.
			if isInternal(ip) {
				p.fail(w, r, dst, http.StatusForbidden, "resolves to an internal address",
					"fusebox egress: %s resolved to %s (%s), a blocked internal address (loopback, private, link-local, metadata or similar); names on the egress allowlist may only lead to public addresses: to reach this address on purpose, allowlist it as %s\n",
					d.name, ip.WithZone(""), from, netip.AddrPortFrom(ip.WithZone("").Unmap(), d.port))
				return nil, false
			}
			addrs = append(addrs, netip.AddrPortFrom(ip.WithZone("").Unmap(), d.port))
		}
	}
	var errs []error
	for _, ap := range addrs {
		c, err := p.dial(r.Context(), "tcp", ap.String())
		if err == nil {
			p.log.Info("egress allowed", "method", r.Method, "dest", dst, "addr", ap.String())
			return c, true
		}
		errs = append(errs, err)
	}
	p.fail(w, r, dst, http.StatusBadGateway, "cannot connect",
		"fusebox egress: %s is allowed but cannot be reached: %v\n", dst, errors.Join(errs...))
	return nil, false
}

// lookup resolves an allowlisted name: from the hosts file if it names it, else from DNS
// (Resolve, fully qualified). from says which answered, for refusals.
func (p *Proxy) lookup(ctx context.Context, name string) (ips []netip.Addr, from string, err error) {
	if ips, ok := p.hosts.lookup(name); ok {
		return ips, "from " + p.hosts.path, nil
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	ips, err = p.resolve(ctx, name+".")
	if err == nil && len(ips) == 0 {
		err = errors.New("no addresses")
	}
	return ips, "from DNS", err
}

// notAllowed is the body of a 403 for a destination that is not on the allowlist.
func notAllowed(dst string, a *Allowlist) string {
	switch {
	case a == nil:
		return fmt.Sprintf("fusebox egress: %s is not on this sandbox's egress allowlist (no allowlist has been set: all egress is refused)\n", dst)
	case len(a.entries) == 0:
		return fmt.Sprintf("fusebox egress: %s is not on this sandbox's egress allowlist (the allowlist is empty: all egress is refused)\n", dst)
	default:
		return fmt.Sprintf("fusebox egress: %s is not on this sandbox's egress allowlist (allowed: %s)\n", dst, a)
	}
}

// fail logs a refusal or error and writes it as a text/plain response.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, dst string, code int, reason, format string, args ...any) {
	level := slog.LevelWarn
	if code >= 500 {
		level = slog.LevelError
	}
	p.log.Log(r.Context(), level, "egress refused", "method", r.Method, "dest", dst, "status", code, "reason", reason)
	writeText(w, code, fmt.Sprintf(format, args...))
}

func writeText(w http.ResponseWriter, code int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	io.WriteString(w, body)
}

// hostPort is u's authority with the port https implies when it has none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "443")
}

// track registers a tunnel's connections and its goroutine with Close, unless Close has
// been called. When it returns true the caller must call untrack and tunnelsDone.Done.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.tunnels[c] = struct{}{}
	}
	p.tunnelsDone.Add(1)
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.tunnels, c)
	}
}

// splice copies bytes both ways until both directions have ended, passing each end-of-stream
// on as a half-close, and closes both connections when both directions are done, when a
// write fails, or when the tunnel has been idle for p.idle. buffered holds what the client
// sent after its CONNECT request and the server had already read.
func (p *Proxy) splice(dst string, client, upstream net.Conn, buffered *bufio.Reader) {
	var last atomic.Int64 // UnixNano of the last byte read in either direction
	last.Store(time.Now().UnixNano())
	closeBoth := sync.OnceFunc(func() {
		client.Close()
		upstream.Close()
	})
	defer closeBoth()
	pipe := func(dst net.Conn, src io.Reader) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					closeBoth()
					return
				}
			}
			if errors.Is(err, io.EOF) {
				// Pass the half-close on; the other direction may still be busy.
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
				return
			}
			if err != nil {
				closeBoth()
				return
			}
		}
	}
	var src io.Reader = client
	if n := buffered.Buffered(); n > 0 {
		b, _ := buffered.Peek(n)
		src = io.MultiReader(strings.NewReader(string(b)), client)
	}
	done := make(chan struct{}, 2)
	go func() { pipe(upstream, src); done <- struct{}{} }()
	go func() { pipe(client, upstream); done <- struct{}{} }()
	idle := time.NewTimer(p.idle)
	defer idle.Stop()
	for pending := 2; pending > 0; {
		select {
		case <-done:
			pending--
		case <-idle.C:
			if since := time.Since(time.Unix(0, last.Load())); since < p.idle {
				idle.Reset(p.idle - since)
				continue
			}
			p.log.Info("egress tunnel idle, closing", "dest", dst, "idle_timeout", p.idle)
			closeBoth()
		}
	}
}
