package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
)

// ManagerOption configures the connection to a manager (NewManager).
type ManagerOption func(*managerConfig)

type managerConfig struct {
	tokenFile, caFile, serverName string
}

// WithTokenFile authenticates every call with the bearer token in path: in a cluster, a
// projected ServiceAccount token with the manager's audience. The file is read again whenever
// it changes (the kubelet rotates projected tokens). Needs TLS (a tcp:// manager); a unix
// socket manager is guarded by file permissions and the token is not sent there.
func WithTokenFile(path string) ManagerOption { return func(c *managerConfig) { c.tokenFile = path } }

// WithCAFile verifies a tcp:// manager's certificate with the PEM CA certificates in path
// (the manager publishes its CA in the ConfigMap fusebox-manager-ca, key ca.crt).
func WithCAFile(path string) ManagerOption { return func(c *managerConfig) { c.caFile = path } }

// WithServerName checks the manager's certificate for name instead of the address's host (an
// address by IP, or through a port-forward).
func WithServerName(name string) ManagerOption { return func(c *managerConfig) { c.serverName = name } }

// ErrNoManagerTLS is returned for a tcp:// manager address without TLS configuration.
var ErrNoManagerTLS = errors.New("a tcp:// manager serves TLS only: give its CA (client.WithCAFile or AllocateOptions.CAFile; fusebox --ca-file or $FUSEBOX_CA_FILE) and a ServiceAccount token (--token-file or $FUSEBOX_TOKEN_FILE)")

// dialOptions returns the gRPC options that secure a connection to the manager at a.
func (c managerConfig) dialOptions(a endpoint.Addr, creds credentials.TransportCredentials) ([]grpc.DialOption, error) {
	if a.Network == "unix" {
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		return []grpc.DialOption{grpc.WithTransportCredentials(creds)}, nil
	}
	var tf *tokenFile
	if c.tokenFile != "" {
		tf = &tokenFile{path: c.tokenFile}
		if _, err := tf.token(); err != nil {
			return nil, err
		}
	}
	if creds == nil {
		if c.caFile == "" {
			return nil, fmt.Errorf("manager %s: %w", a, ErrNoManagerTLS)
		}
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("reading the manager's CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the manager's CA file %s holds no PEM certificate", c.caFile)
		}
		name := c.serverName
		if name == "" {
			name, _, _ = net.SplitHostPort(a.Address)
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS13})
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if tf != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(tf))
	}
	return opts, nil
}

// tokenFile is a bearer token read from a file, again whenever the file changes.
type tokenFile struct {
	path string

	mu    sync.Mutex // guards mod, size, tok
	mod   time.Time
	size  int64
	tok   string
	valid bool
}

func (t *tokenFile) token() (string, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return "", fmt.Errorf("manager token file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.valid && fi.ModTime().Equal(t.mod) && fi.Size() == t.size {
		return t.tok, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("manager token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("manager token file %s is empty", t.path)
	}
	t.tok, t.mod, t.size, t.valid = tok, fi.ModTime(), fi.Size(), true
	return tok, nil
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t *tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := t.token()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: a token never travels
// in plaintext.
func (*tokenFile) RequireTransportSecurity() bool { return true }

// DialManager connects to the manager's API for calls other than Allocate (status tools),
// secured as NewManager secures its connection.
func DialManager(addr string, opts ...ManagerOption) (*grpc.ClientConn, error) {
	a, err := endpoint.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("manager address: %w", err)
	}
	var c managerConfig
	for _, o := range opts {
		o(&c)
	}
	dial, err := c.dialOptions(a, nil)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(a.GRPCTarget(), dial...)
}
