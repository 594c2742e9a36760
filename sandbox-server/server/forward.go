package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/internal/portfwd"
)

// Port forwarding (package internal/portfwd): a data connection whose TLS handshake negotiated
// portfwd.Proto is taken out of gRPC after the handshake and carries one TCP connection to a
// port on the sandbox's loopback, the agent's bytes to it and its bytes back. The handshake is
// the gRPC service's own (the same configuration and pin), so only the agent can open one; the
// connection is the sandbox's own, from inside, so it needs no network beyond loopback
// (gVisor's --network=none keeps it). Each forwarded connection has a data connection of its
// own: its bytes share flow control with nothing else, and its end is the connection's end.

const (
	// forwardRequestWait bounds the wait for a forwarding connection's request.
	forwardRequestWait = 30 * time.Second
	// forwardDialWait bounds the dial of the loopback port: a listener that accepts nothing
	// for that long is reported like one that is not there.
	forwardDialWait = 10 * time.Second
	// forwardBuf is the most one direction of a forwarded connection holds between its read
	// and its write (portfwd.Pipe): under gVisor every write is a round through the sentry,
	// so a few large ones beat many small ones.
	forwardBuf = 1 << 20
)

var (
	// errPortRange refuses a port outside 1-65535.
	errPortRange = errors.New("port out of range")
	// errNoListener refuses a port that nothing listens on, on either loopback address.
	errNoListener = errors.New("nothing listens")
)

// forwardStatus is the one place where the errors of port forwarding become the gRPC status
// codes of its answers.
func forwardStatus(err error) error {
	switch {
	case errors.Is(err, errPortRange), errors.Is(err, portfwd.ErrFrame):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errNoListener):
		// Retryable: a server still starting listens a moment later.
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return toStatus(err)
	}
}

// serveForward serves one forwarding connection: it reads the request, dials the port on the
// loopback, answers, and then copies both ways until both directions have ended, either fails,
// or ctx ends; it closes conn.
func (s *Server) serveForward(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	// A timer, not a read deadline: gRPC clears the connection's deadlines after its
	// handshake returns, which may be after this has begun to read.
	wait := time.AfterFunc(forwardRequestWait, func() { conn.Close() })
	req, err := portfwd.ReadRequest(conn)
	wait.Stop()
	if err != nil {
		if errors.Is(err, portfwd.ErrFrame) {
			portfwd.WriteAnswer(conn, forwardStatus(err))
		}
		s.log.Debug("forwarding connection ended before its request", "err", err)
		return
	}
	tcp, err := dialLoopback(ctx, req.Port)
	if err != nil {
		portfwd.WriteAnswer(conn, forwardStatus(err))
		return
	}
	defer tcp.Close()
	defer context.AfterFunc(ctx, func() { tcp.Close() })()
	if err := portfwd.WriteAnswer(conn, nil); err != nil {
		return
	}
	if err := portfwd.Pipe(conn, tcp, forwardBuf); err != nil {
		s.log.Debug("forwarded connection broken", "port", req.Port, "err", err)
	}
}

// dialLoopback connects to port on the sandbox's loopback: 127.0.0.1, then ::1 if nothing
// listens there, so that a server bound to either is found.
func dialLoopback(ctx context.Context, port uint32) (net.Conn, error) {
	if err := portfwd.CheckPort(int64(port)); err != nil {
		return nil, fmt.Errorf("%w: %w", errPortRange, err)
	}
	ctx, cancel := context.WithTimeout(ctx, forwardDialWait)
	defer cancel()
	var d net.Dialer
	p := strconv.Itoa(int(port))
	c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", p))
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("connecting to 127.0.0.1:%d inside the sandbox: %w", port, err)
	}
	c, err6 := d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", p))
	if err6 == nil {
		return c, nil
	}
	if errors.Is(err6, syscall.ECONNREFUSED) || errors.Is(err6, syscall.EADDRNOTAVAIL) || errors.Is(err6, syscall.ENETUNREACH) || errors.Is(err6, syscall.EAFNOSUPPORT) {
		// Refused on both, or refused on 127.0.0.1 where the sandbox has no IPv6 loopback.
		return nil, fmt.Errorf("%w on port %d inside the sandbox (connection refused on 127.0.0.1 and ::1)", errNoListener, port)
	}
	return nil, fmt.Errorf("connecting to [::1]:%d inside the sandbox: %w", port, err6)
}
