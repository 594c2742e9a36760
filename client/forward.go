package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/coalesce"
	"github.com/fusebox-dev/fusebox/internal/portfwd"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// Port forwarding (internal/portfwd): DialPort and ForwardPort reach a TCP port on the
// sandbox's loopback, each connection over a connection of its own to the sandbox's data
// socket, with the same pinned TLS 1.3 handshake as the gRPC connection but the application
// protocol portfwd.Proto. The sandbox connects from inside, so this works with no network in
// the sandbox beyond loopback; only the holder of the agent key gets through the handshake.

// forwardBuf is the most one direction of a tunnel holds between its read and its write
// (portfwd.Pipe).
const forwardBuf = 1 << 20

// portDialer makes one sandbox's forwarding connections.
type portDialer struct {
	dial func(context.Context) (net.Conn, error) // a raw connection to the data socket
	cfg  *tls.Config                             // the pinned configuration, offering portfwd.Proto only
}

// newPortDialer returns the dialer for a sandbox dialed with dial and pinned by cfg (an
// agent's tlspin configuration, which is cloned).
func newPortDialer(dial func(context.Context) (net.Conn, error), cfg *tls.Config) *portDialer {
	c := cfg.Clone()
	c.NextProtos = []string{portfwd.Proto}
	return &portDialer{dial: dial, cfg: c}
}

// forwardErr is the error of a forwarding connection that broke before the sandbox answered,
// as gRPC reports a broken connection.
func forwardErr(port int, doing string, err error) error {
	return status.Errorf(codes.Unavailable, "forwarding port %d: %s: %v", port, doing, err)
}

// DialPort connects to port on the sandbox's loopback (127.0.0.1, else ::1) and returns the
// connection: what is written to it reaches the program listening there, and what that
// program writes is read from it. ctx bounds the connecting only. The connection's CloseWrite
// (it has one: interface{ CloseWrite() error }) ends what the program reads, as a TCP
// half-close would; Close ends the connection both ways.
//
// A port outside 1-65535 is InvalidArgument; a port nothing listens on in the sandbox is
// Unavailable, whose message says so; a sandbox server that does not offer port forwarding is
// Unimplemented; a broken connection is Unavailable, as for the gRPC calls.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := portfwd.CheckPort(int64(port)); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.ports == nil {
		return nil, status.Error(codes.Unimplemented, "forwarding ports: this connection has no data socket to dial")
	}
	return s.ports.open(ctx, port)
}

// open makes a forwarding connection to port: the handshake, the request and the answer.
func (p *portDialer) open(ctx context.Context, port int) (net.Conn, error) {
	raw, err := p.dial(ctx)
	if err != nil {
		return nil, forwardErr(port, "connecting to the sandbox", err)
	}
	// The connection's end while connecting is ctx's; after that, the caller's.
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	conn, err := p.handshake(ctx, raw, port)
	if !stop() || ctx.Err() != nil {
		raw.Close()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		raw.Close()
		return nil, err
	}
	return conn, nil
}

func (p *portDialer) handshake(ctx context.Context, raw net.Conn, port int) (net.Conn, error) {
	// The records of each write leave in one write of the socket, into a send buffer of up
	// to 4 MiB, as on bulk connections: under gVisor each read is a round through the
	// sentry, so the sandbox should find much to read at once.
	if u, ok := raw.(interface{ SetWriteBuffer(int) error }); ok {
		u.SetWriteBuffer(4 << 20) // best effort: a smaller buffer is only slower
	}
	b := coalesce.Under(raw)
	t := tls.Client(b, p.cfg)
	if err := t.HandshakeContext(ctx); err != nil {
		// crypto/tls reports the peer's alerts only by their text.
		if strings.Contains(err.Error(), "no application protocol") {
			return nil, status.Errorf(codes.Unimplemented, "forwarding port %d: the sandbox server does not offer port forwarding", port)
		}
		if errors.Is(err, tlspin.ErrPinMismatch) {
			return nil, status.Errorf(codes.Unavailable, "forwarding port %d: %v", port, err)
		}
		return nil, forwardErr(port, "TLS handshake", err)
	}
	conn := coalesce.Over(t, b)
	if _, err := conn.Write(portfwd.Request{Port: uint32(port)}.Append(nil)); err != nil {
		return nil, forwardErr(port, "sending the request", err)
	}
	// The sandbox checks the agent's certificate after the client's side of a TLS 1.3
	// handshake has ended: a refused key shows here, as the alert instead of an answer.
	if err := portfwd.ReadAnswer(conn); err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, forwardErr(port, "reading the answer", err)
	}
	return conn, nil
}

// ForwardOptions tune ForwardPort.
type ForwardOptions struct {
	// OnError, if set, is called (on the tunnel's goroutine) with the error of each tunnel
	// that could not be opened (its local connection is closed) or broke.
	OnError func(error)
}

// ForwardPort listens on localAddr (host:port on a loopback address; "" is 127.0.0.1 on a port
// the system picks) and tunnels each connection it accepts to port on the sandbox's loopback
// (DialPort), both ways, half-closes included, until the listener is closed or ctx ends. It
// returns the listener, whose Addr is where to connect; its Accept only waits for the
// forward's end (the forward accepts the connections itself) and then returns net.ErrClosed.
// Close stops accepting, ends the tunnels and returns once they have ended. A connection whose
// tunnel cannot be opened (nothing listens on port in the sandbox) is closed.
func (s *Sandbox) ForwardPort(ctx context.Context, port int, localAddr string, opts ...ForwardOptions) (net.Listener, error) {
	if err := portfwd.CheckPort(int64(port)); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if localAddr == "" {
		localAddr = "127.0.0.1:0"
	}
	if err := checkLoopback(localAddr); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "forwarding port %d: %v", port, err)
	}
	ln, err := net.Listen("tcp", localAddr)
	if err != nil {
		return nil, fmt.Errorf("forwarding port %d: %w", port, err)
	}
	var o ForwardOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &portForward{Listener: ln, sb: s, port: port, opts: o, ctx: cancel, done: ctx.Done(), conns: map[net.Conn]struct{}{}}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer stop()
		f.serve(ctx)
	}()
	return f, nil
}

// checkLoopback refuses a local address whose host is not a loopback one: a forward gives
// whoever connects to it what the agent's key gives.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("local address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("local address %q: the host must be a loopback address (127.0.0.1, ::1 or localhost): whoever connects gets what the agent's key gets", addr)
	}
	return nil
}

// portForward is ForwardPort's listener.
type portForward struct {
	net.Listener
	sb   *Sandbox
	port int
	opts ForwardOptions
	ctx  context.CancelFunc // ends the forward's context
	done <-chan struct{}    // the forward's context's Done
	wg   sync.WaitGroup     // the accepting goroutine and the tunnels

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool
}

// serve accepts connections and tunnels each on a goroutine of its own.
func (f *portForward) serve(ctx context.Context) {
	for {
		c, err := f.Listener.Accept()
		if err != nil {
			return // closed: Close ends the tunnels
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			if err := f.tunnel(ctx, c); err != nil && f.opts.OnError != nil && ctx.Err() == nil {
				f.opts.OnError(err)
			}
		}()
	}
}

// tunnel carries local, an accepted connection, to the port in the sandbox; it closes local.
func (f *portForward) tunnel(ctx context.Context, local net.Conn) error {
	defer local.Close()
	remote, err := f.sb.DialPort(ctx, f.port)
	if err != nil {
		return err
	}
	if !f.track(remote) {
		remote.Close()
		return nil
	}
	defer f.untrack(remote)
	defer remote.Close()
	if err := portfwd.Pipe(local, remote, forwardBuf); err != nil {
		return fmt.Errorf("forwarding %s to port %d in the sandbox: %w", local.RemoteAddr(), f.port, err)
	}
	return nil
}

// track records c for Close to end; false if the forward is closed already.
func (f *portForward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *portForward) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// Accept waits for the forward's end: the forward accepts and tunnels the connections itself.
func (f *portForward) Accept() (net.Conn, error) {
	<-f.done
	return nil, net.ErrClosed
}

// Close stops accepting, ends every tunnel and waits for them.
func (f *portForward) Close() error {
	f.mu.Lock()
	already := f.closed
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ctx()
	err := f.Listener.Close()
	if already {
		err = nil
	}
	f.wg.Wait()
	return err
}
