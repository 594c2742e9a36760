package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// WarmUp runs one throwaway pinned-TLS handshake and data-plane call through this server's own
// code, on a private unix socket, before the sandbox waits in the pool: a self-test (a server
// that cannot complete it never enters the pool) that also runs the data plane's code paths
// once, off the allocation path. It uses its own keys and never touches the pinned identity
// or the init listener.
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
	cert, err := tlspin.Certificate(serverKey)
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "warm.sock")
	srv, err := s.newDataServer(cert, clientKey.Public(), nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("binding the warm-up listener: %w", err)
	}
	go srv.Serve(bufferedListener{ln})
	defer srv.Stop()
	cfg, err := tlspin.ClientConfig(clientKey, serverKey.Public())
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := sandboxv1.NewSandboxClient(conn).Stat(ctx, &sandboxv1.StatRequest{Path: "."}); err != nil {
		return fmt.Errorf("warm-up call: %w", err)
	}
	return nil
}
