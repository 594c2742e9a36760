// Package relay connects the egress proxy's unix socket to a loopback TCP port inside the
// sandbox. The sandbox has no network: the only way out is the host's allowlisting egress
// proxy, reachable through a unix socket in the bind-mounted /run/fusebox directory. Most
// programs cannot use a unix-socket proxy, so fusebox-sandbox listens on a loopback port,
// points HTTP_PROXY and HTTPS_PROXY at it and pipes every connection, byte for byte, to the
// socket. The relay decides nothing: every check is the proxy's, on the host.
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

// Listen listens on addr, which must be a loopback IP:port ("127.0.0.1:3128", "[::1]:3128"):
// the relay is for the sandbox's own processes, and a name could resolve elsewhere.
func Listen(addr string) (net.Listener, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() || ap.Addr().Zone() != "" {
		return nil, fmt.Errorf("egress relay address %q: want a loopback IP:port such as 127.0.0.1:3128", addr)
	}
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return nil, fmt.Errorf("listening for the egress relay: %w", err)
	}
	return ln, nil
}

// ProxyEnv returns the variables that send commands' HTTP and HTTPS traffic to a relay
// listening on addr, in both the upper- and lower-case spellings programs read (curl
// ignores HTTP_PROXY, some Go and Python code ignores http_proxy), and that keep loopback
// traffic direct.
func ProxyEnv(addr net.Addr) map[string]string {
	u := "http://" + addr.String()
	const direct = "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": direct, "no_proxy": direct,
	}
}

// Serve accepts connections on ln (loopback TCP inside the sandbox) and pipes each to the
// unix socket at socketPath, dialled per connection, until ctx ends (it then returns nil)
// or ln fails (it returns the error). Either way it closes ln and every relayed connection
// and returns only after their goroutines have ended. A connection whose socket cannot be
// dialled gets a 502 response and is closed.
func Serve(ctx context.Context, ln net.Listener, socketPath string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
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
			log.Warn("egress relay: accept failed, retrying", "err", err, "backoff", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		wg.Go(func() { relay(ctx, c, socketPath, log) })
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
// ends.
func relay(ctx context.Context, c net.Conn, socketPath string, log *slog.Logger) {
	defer c.Close()
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		log.Warn("egress relay: cannot reach the egress proxy", "socket", socketPath, "err", err)
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
