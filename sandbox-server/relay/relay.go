// Package relay connects the egress proxy's unix socket to a loopback TCP port inside the
// sandbox. The sandbox has no network: the only way out is the host's allowlisting egress
// proxy, reachable through a unix socket in the bind-mounted /run/fusebox directory. Most
// programs cannot use a unix-socket proxy, so fusebox-sandbox listens on a loopback port,
// points HTTP_PROXY and HTTPS_PROXY at it and pipes every connection, byte for byte, to the
// socket. The relay decides nothing: every check is the proxy's, on the host. It runs only
// in a sandbox whose allocation has an egress allowlist: fusebox-sandbox starts it when such
// an allocation initialises the sandbox (server.Options.StartEgress), so a sandbox without
// one has no relay, no listener and no proxy variables.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits of the relay.
const (
	// dialTimeout bounds the connection to the proxy's socket.
	dialTimeout = 10 * time.Second
	// drainTimeout bounds how long the relay reads a client's request after answering it
	// with an error, so that closing the connection does not reset it before the client
	// has read the answer.
	drainTimeout = 2 * time.Second
	// maxAcceptBackoff caps the pause after a transient accept error (too many open files).
	maxAcceptBackoff = time.Second
)

// unavailable is the answer to a client when the proxy's socket cannot be reached. Clients
// of the relay speak HTTP to a proxy, so an HTTP error is what they can show.
var unavailable = func() string {
	const body = "fusebox egress: the egress proxy is not reachable from this sandbox\n"
	return "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// CheckAddr checks that addr is a loopback IP:port ("127.0.0.1:3128", "[::1]:3128"): the
// relay is for the sandbox's own processes, and a name could resolve elsewhere.
func CheckAddr(addr string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("egress relay address %q: want a loopback IP:port such as 127.0.0.1:3128", addr)
	}
	return ap, nil
}

// Listen listens on addr, which must be a loopback IP:port (see CheckAddr).
func Listen(addr string) (net.Listener, error) {
	ap, err := CheckAddr(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return nil, fmt.Errorf("listening for the egress relay: %w", err)
	}
	return ln, nil
}

// loopbackNames are the names of the sandbox's own loopback, kept direct (NO_PROXY) unless
// the allowlist names them.
var loopbackNames = []string{"localhost", "127.0.0.1", "::1"}

// ProxyEnv returns the variables that send commands' HTTP and HTTPS traffic to a relay
// listening on addr, in both the upper- and lower-case spellings programs read (curl
// ignores HTTP_PROXY, some Go and Python code ignores http_proxy). NO_PROXY keeps the
// sandbox's own loopback direct (a server a command starts inside the sandbox), except the
// loopback hosts allow names ("127.0.0.1:8000": the host's loopback, reached through the
// proxy, which decides): a loopback host cannot be both. allow is the allocation's allowlist
// ("host:port" entries); nothing here checks or enforces it.
func ProxyEnv(addr net.Addr, allow []string) map[string]string {
	u := "http://" + addr.String()
	env := map[string]string{"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u}
	named := map[string]bool{}
	for _, e := range allow {
		named[entryHost(e)] = true
	}
	var direct []string
	for _, n := range loopbackNames {
		if !named[n] {
			direct = append(direct, n)
		}
	}
	if len(direct) > 0 {
		env["NO_PROXY"] = strings.Join(direct, ",")
		env["no_proxy"] = env["NO_PROXY"]
	}
	return env
}

// entryHost is the host of an allowlist entry ("host:port", "[v6]:port"), lower case, without
// a trailing dot, an IP in its canonical form ("" if the entry has no port).
func entryHost(e string) string {
	h, _, err := net.SplitHostPort(e)
	if err != nil {
		return ""
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip.Unmap().String()
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// Serve accepts connections on ln (loopback TCP inside the sandbox) and pipes each to the
// unix socket at socketPath, dialled per connection, until ctx ends (it then returns nil)
// or ln fails (it returns the error). Either way it closes ln and every relayed connection
// and returns only after their goroutines have ended. A connection whose socket cannot be
// dialled gets a 502 response and is closed; such refusals, and transient accept errors, are
// logged the first time for each cause and then counted, in a line per cause at most every
// minute (see refusals).
func Serve(ctx context.Context, ln net.Listener, socketPath string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	refused := newRefusals(log)
	// Deferred first, so it runs last: after every connection's goroutine has ended.
	defer refused.close()
	var wg sync.WaitGroup
	defer wg.Wait()
	// Deferred after the Wait, so it runs first: the relayed connections end with ctx (see
	// relay), whichever way Serve returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Closing the listener ends Accept.
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !transient(err) {
				return err
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), maxAcceptBackoff)
			refused.add("egress relay: accept failed, retrying", err, "backoff", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		wg.Go(func() { relay(ctx, c, socketPath, refused) })
	}
}

// transient reports whether an accept error may go away by itself.
func transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// relay pipes c to a new connection to the socket until both directions have ended or ctx
// ends. A refusal is counted in refused.
func relay(ctx context.Context, c net.Conn, socketPath string, refused *refusals) {
	defer c.Close()
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		refused.add("egress relay: cannot reach the egress proxy", err, "socket", socketPath)
		c.SetDeadline(time.Now().Add(drainTimeout))
		if _, err := io.WriteString(c, unavailable); err == nil {
			closeWrite(c)
			io.Copy(io.Discard, c)
		}
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() {
		c.Close()
		up.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() {
		pipe(up, c)
		close(done)
	}()
	pipe(c, up)
	<-done
}

// pipe copies src to dst; at src's end of stream it half-closes dst, on an error it closes
// both, so that the other direction ends too.
func pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err != nil {
		dst.Close()
		src.Close()
		return
	}
	closeWrite(dst)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
