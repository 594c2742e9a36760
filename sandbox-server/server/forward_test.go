package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/leakcheck"
	"github.com/fusebox-dev/fusebox/internal/portfwd"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/tlspin"
)

// forwardServer starts an in-process server with opts and returns an initialised agent's
// client, the data socket's path and the agent's pinned TLS configuration. The test fails if
// goroutines started after it (the forwards', the server's and the client's) outlive it.
func forwardServer(t *testing.T, opts Options) (*client.Sandbox, string, *tls.Config) {
	t.Helper()
	opts.IdleTTL = time.Minute
	initAddr, dataAddr, _, _ := startInProcessIn(t, opts, nil)
	key, _ := client.NewKey()
	res, err := sfuse.Initialize(context.Background(), initAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := client.Dial(dataAddr, res.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	// The leak check counts from here: the server, its gRPC connection (up after a first
	// call) and the process-wide signal handling are there before any forward and after all.
	if _, err := sb.Stat(context.Background(), ".", false); err != nil {
		t.Fatal(err)
	}
	leakcheck.Check(t)
	cert, err := tlspin.Certificate(key.Signer())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := tlspin.ParsePublicKey(res.SandboxKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlspin.ClientConfigCert(cert, pub)
	if err != nil {
		t.Fatal(err)
	}
	return sb, strings.TrimPrefix(dataAddr, "unix://"), cfg
}

// upperServer listens on the host's loopback (the in-process server's "sandbox") and, for
// each connection, reads everything up to the half-close and answers it upper-cased, then
// closes. It returns the port.
func upperServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := io.ReadAll(c)
			if err == nil {
				c.Write(bytes.ToUpper(b))
			}
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// A forwarded connection carries the bytes both ways and passes the agent's half-close on:
// the program answers after reading to the end, and its answer and its close come back.
func TestForwardHalfClose(t *testing.T) {
	sb, _, _ := forwardServer(t, Options{})
	port := upperServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		c, err := sb.DialPort(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("hello forward "+strconv.Itoa(i), 50000)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != strings.ToUpper(msg) {
			t.Fatalf("answer of %d bytes, want %d upper-cased", len(got), len(msg))
		}
	}
}

// rawForward opens a forwarding connection with cfg and sends req as it is: the sandbox's
// answer (nil, or its refusal).
func rawForward(t *testing.T, path string, cfg *tls.Config, req []byte) error {
	t.Helper()
	cfg = cfg.Clone()
	cfg.NextProtos = []string{portfwd.Proto}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(context.Background(), "unix", path)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		return err
	}
	return portfwd.ReadAnswer(c)
}

// Refusals: the sandbox answers each with a code and a message the agent can act on, and the
// client reports the same before sending anything for a port out of range.
func TestForwardRefusals(t *testing.T) {
	sb, path, cfg := forwardServer(t, Options{})
	closed := freePort(t)
	for _, tc := range []struct {
		name string
		req  []byte
		code codes.Code
		msg  string
	}{
		{"closed port", portfwd.Request{Port: uint32(closed)}.Append(nil), codes.Unavailable, "nothing listens on port " + strconv.Itoa(closed) + " inside the sandbox"},
		{"port 0", portfwd.Request{Port: 0}.Append(nil), codes.InvalidArgument, "port 0 out of range 1-65535"},
		{"port 65536", portfwd.Request{Port: 65536}.Append(nil), codes.InvalidArgument, "port 65536 out of range 1-65535"},
		{"unknown version", []byte{9, 0, 0, 0, 80}, codes.InvalidArgument, "version 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := rawForward(t, path, cfg, tc.req)
			if st, ok := status.FromError(err); !ok || st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	ctx := context.Background()
	for _, port := range []int{0, 65536, -1} {
		_, err := sb.DialPort(ctx, port)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "out of range 1-65535") {
			t.Errorf("DialPort(%d) = %v, want InvalidArgument naming the range", port, err)
		}
	}
	if _, err := sb.DialPort(ctx, closed); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "nothing listens on port") {
		t.Errorf("DialPort(closed port) = %v, want Unavailable saying nothing listens", err)
	}
}

// A server with NoPortForward does not offer the protocol: the client says so.
func TestForwardOff(t *testing.T) {
	sb, _, _ := forwardServer(t, Options{NoPortForward: true})
	_, err := sb.DialPort(context.Background(), upperServer(t))
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "does not offer port forwarding") {
		t.Fatalf("DialPort to a server without forwarding: %v, want Unimplemented", err)
	}
}

// A key other than the pinned agent's gets no forward: the handshake is refused before the
// request is read, and nothing connects to the port.
func TestForwardOtherKey(t *testing.T) {
	_, path, cfg := forwardServer(t, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other, _ := client.NewKey()
	cert, err := tlspin.Certificate(other.Signer())
	if err != nil {
		t.Fatal(err)
	}
	bad := cfg.Clone()
	bad.Certificates = []tls.Certificate{cert}
	bad.GetClientCertificate = nil
	err = rawForward(t, path, bad, portfwd.Request{Port: uint32(ln.Addr().(*net.TCPAddr).Port)}.Append(nil))
	if err == nil {
		t.Fatal("a second agent key opened a forward")
	}
	if _, ok := status.FromError(err); ok {
		t.Fatalf("a second agent key got an answer (%v), want the handshake refused", err)
	}
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Fatal("the refused agent's forward connected to the port")
	}
}

// ForwardPort tunnels each accepted connection, and Close ends the tunnels, even open ones.
func TestForwardPortListener(t *testing.T) {
	sb, _, _ := forwardServer(t, Options{})
	port := upperServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 10)
	ln, err := sb.ForwardPort(ctx, port, "", client.ForwardOptions{OnError: func(err error) { errs <- err }})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "abc")
		c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "ABC" {
			t.Fatalf("through the forward: %q, %v", got, err)
		}
	}
	// An open tunnel that Close must end: the program waits for the half-close that never comes.
	open, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	io.WriteString(open, "x")
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	open.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(open); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("the open tunnel after Close: %v, want it ended", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Fatal("the forward still accepts after Close")
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	select {
	case err := <-errs:
		t.Fatalf("a tunnel failed: %v", err)
	default:
	}
	if _, err := sb.ForwardPort(ctx, port, "0.0.0.0:0"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a forward on a non-loopback address: %v, want InvalidArgument", err)
	}
}

func isReset(err error) bool { return strings.Contains(err.Error(), "connection reset") }
