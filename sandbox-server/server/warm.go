package server

import (
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
// plane's code paths once, off the allocation path. It uses its own keys and never touches the pinned identity or the init
// listener.
func (s *Server) WarmUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "fusebox-warm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	serverKey, err := tlspin.GenerateKey()
	if err != nil {
		return err
	}
	clientKey, err := tlspin.GenerateKey()
	if err != nil {
		return err
	}
	serverCert, err := tlspin.Certificate(serverKey)
	if err != nil {
		return err
	}
	clientCert, err := tlspin.Certificate(clientKey)
	if err != nil {
		return err
	}
	scfg, err := tlspin.ServerConfigCert(serverCert, clientKey.Public())
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "warm.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("binding the warm-up listener: %w", err)
	}
	pin := &tlspin.Pin{}
	if err := pin.Set(serverKey.Public()); err != nil {
		ln.Close()
		return err
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
		return err
	}
	defer conn.Close()
	if _, err := sandboxv1.NewSandboxClient(conn).Stat(ctx, &sandboxv1.StatRequest{Path: "."}); err != nil {
		return fmt.Errorf("warm-up call: %w", err)
	}
	return nil
}
