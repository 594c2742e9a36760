package bench

import (
	"net"
	"path/filepath"

	"google.golang.org/grpc"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/auth"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// ServeManager serves m's gRPC API on a unix socket in dir and returns its address and a stop
// function.
func ServeManager(m *manager.Manager, dir string) (string, func(), error) {
	path := filepath.Join(dir, "manager.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		return "", nil, err
	}
	// Callers are identified as the manager daemon identifies them on its socket.
	opts := append(manager.ServerOptions(), grpc.Creds(auth.PeerCredentials()))
	srv := grpc.NewServer(append(opts, auth.NewAuthenticator(auth.AuthenticatorOptions{}).ServerOptions()...)...)
	managerv1.RegisterManagerServer(srv, &manager.Service{M: m})
	go srv.Serve(ln)
	return "unix://" + path, srv.Stop, nil
}
