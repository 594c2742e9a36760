package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/fuse"
)

// WarmUp runs one throwaway pinned-TLS handshake and one data-plane call through this
// server's own code, on a private unix socket, before the sandbox waits in the pool: a
// self-test (a server that cannot complete it never enters the pool) that also runs the data
// plane's code paths once, off the allocation path. Then it runs the template's warm-up
// commands (Options.WarmUpCommands) on the same connection. It uses its own keys and never
// touches the pinned identity or the init listener.
func (s *Server) WarmUp(ctx context.Context) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "fusebox-warm-")
	if err != nil {
		return selfTest(err)
	}
	defer os.RemoveAll(dir)
	serverKey, err := tlspin.GenerateKey()
	if err != nil {
		return selfTest(err)
	}
	clientKey, err := tlspin.GenerateKey()
	if err != nil {
		return selfTest(err)
	}
	serverCert, err := tlspin.Certificate(serverKey)
	if err != nil {
		return selfTest(err)
	}
	clientCert, err := tlspin.Certificate(clientKey)
	if err != nil {
		return selfTest(err)
	}
	scfg, err := tlspin.ServerConfigCert(serverCert, clientKey.Public())
	if err != nil {
		return selfTest(err)
	}
	sock := filepath.Join(dir, "warm.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return selfTest(fmt.Errorf("binding the warm-up listener: %w", err))
	}
	pin := &tlspin.Pin{}
	if err := pin.Set(serverKey.Public()); err != nil {
		ln.Close()
		return selfTest(err)
	}
	ccfg := tlspin.ClientConfigPin(func() (tls.Certificate, error) { return clientCert, nil }, pin)
	srv := s.newDataServer(fuse.DataCredentials(scfg, fuse.DataOptions{}), nil)
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///warm-up", grpc.WithTransportCredentials(credentials.NewTLS(ccfg)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		return selfTest(err)
	}
	defer conn.Close()
	c := sandboxv1.NewSandboxClient(conn)
	if _, err := c.Stat(ctx, &sandboxv1.StatRequest{Path: "."}); err != nil {
		return selfTest(fmt.Errorf("warm-up call: %w", err))
	}
	if len(s.opts.WarmUpCommands) == 0 {
		return nil
	}
	timeout := s.opts.WarmUpTimeout
	if timeout <= 0 {
		timeout = DefaultWarmUpTimeout
	}
	cctx, ccancel := context.WithTimeout(parent, timeout)
	defer ccancel()
	for i, cmd := range s.opts.WarmUpCommands {
		if err := runWarmUp(cctx, c, cmd); err != nil {
			return fmt.Errorf("the template's warm-up command %d (%s): %w", i+1, cmd, err)
		}
	}
	return nil
}

// selfTest marks an error of WarmUp's data-plane self-test.
func selfTest(err error) error { return fmt.Errorf("data-plane self-test: %w", err) }

// DefaultWarmUpTimeout bounds a template's warm-up commands together.
const DefaultWarmUpTimeout = 5 * time.Minute

// Command is a template's warm-up command: an argv, or a script (bash, or /bin/sh).
type Command struct {
	Argv   []string `json:"argv,omitempty"`
	Script string   `json:"script,omitempty"`
}

// String is the command as a log shows it.
func (c Command) String() string {
	if c.Script != "" {
		return fmt.Sprintf("script %q", c.Script)
	}
	return fmt.Sprintf("argv %q", c.Argv)
}

// runWarmUp runs cmd through the data plane's Exec and fails unless it exits 0, with the tail
// of its output.
func runWarmUp(ctx context.Context, c sandboxv1.SandboxClient, cmd Command) error {
	stream, err := c.Exec(ctx, &sandboxv1.ExecRequest{Argv: cmd.Argv, Script: cmd.Script})
	if err != nil {
		return err
	}
	var out []byte
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		if o := ev.GetOutput(); o != nil {
			out = append(out, o.GetData()...)
			if len(out) > 2048 {
				out = out[len(out)-2048:]
			}
		}
		if x := ev.GetExit(); x != nil {
			if x.GetExitCode() == 0 {
				return nil
			}
			return fmt.Errorf("exit %d%s: %s", x.GetExitCode(), map[bool]string{true: " (timed out)"}[x.GetTimedOut()], bytes.TrimSpace(out))
		}
	}
}
