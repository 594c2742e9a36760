// Package endpoint parses the listen and dial addresses fusebox binaries accept:
// "unix:///absolute/path" and "tcp://host:port".
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// ErrBadAddress reports an address that is neither unix:///path nor tcp://host:port.
var ErrBadAddress = errors.New("address must be unix:///absolute/path or tcp://host:port")

// Addr is a parsed endpoint.
type Addr struct {
	Network string // "unix" or "tcp"
	Address string // socket path, or host:port
}

// Parse parses "unix:///path" or "tcp://host:port".
func Parse(s string) (Addr, error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		p := strings.TrimPrefix(s, "unix://")
		if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
			return Addr{}, fmt.Errorf("%w: %q has no absolute socket path", ErrBadAddress, s)
		}
		return Addr{Network: "unix", Address: filepath.Clean(p)}, nil
	case strings.HasPrefix(s, "tcp://"):
		hp := strings.TrimPrefix(s, "tcp://")
		if _, _, err := net.SplitHostPort(hp); err != nil {
			return Addr{}, fmt.Errorf("%w: %q: %v", ErrBadAddress, s, err)
		}
		return Addr{Network: "tcp", Address: hp}, nil
	default:
		return Addr{}, fmt.Errorf("%w: %q", ErrBadAddress, s)
	}
}

// String returns the address in the form Parse accepts.
func (a Addr) String() string {
	if a.Network == "unix" {
		return "unix://" + a.Address
	}
	return "tcp://" + a.Address
}

// GRPCTarget returns the address as a grpc-go dial target.
func (a Addr) GRPCTarget() string {
	if a.Network == "unix" {
		return "unix://" + a.Address
	}
	return "passthrough:///" + a.Address
}

// ErrInUse reports a unix socket on which another process still accepts connections.
var ErrInUse = errors.New("another process is listening there")

// Listen listens on a. For a unix socket it removes a stale socket file first (never any other
// kind of file, and never a socket someone still accepts on) and restricts the new socket to
// its owner.
func Listen(a Addr) (net.Listener, error) {
	if a.Network == "unix" {
		if fi, err := os.Lstat(a.Address); err == nil {
			if fi.Mode().Type() != os.ModeSocket {
				return nil, fmt.Errorf("listening on %s: %s exists and is not a socket", a, a.Address)
			}
			if c, err := net.Dial("unix", a.Address); err == nil {
				c.Close()
				return nil, fmt.Errorf("listening on %s: %w", a, ErrInUse)
			}
			if err := os.Remove(a.Address); err != nil {
				return nil, fmt.Errorf("removing stale socket %s: %w", a.Address, err)
			}
		}
	}
	ln, err := net.Listen(a.Network, a.Address)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", a, err)
	}
	if a.Network == "unix" {
		if err := os.Chmod(a.Address, 0o600); err != nil {
			ln.Close()
			return nil, fmt.Errorf("restricting socket %s: %w", a.Address, err)
		}
	}
	return ln, nil
}

// ErrNotSocket reports a unix address whose last element is not a socket: a symbolic link
// (which Dial never follows), a regular file, a directory.
var ErrNotSocket = errors.New("not a unix socket (symbolic links are not followed)")

// Dial connects to a. A unix socket is opened by its own name, never through a symbolic link
// there: a sandbox that can write its socket directory could otherwise replace its socket by
// a link to any socket of the host (the manager's, another sandbox's), and a host process
// dialing the sandbox's advertised address would follow it. The socket's directory is
// resolved as usual (it is the host's, not the sandbox's).
//
// On Linux the socket is pinned by an O_PATH descriptor opened with O_NOFOLLOW, checked to be
// a socket, and connected to through /proc/self/fd, so that the name cannot be swapped between
// the check and the connect. Elsewhere the check is an lstat before the connect.
func Dial(ctx context.Context, a Addr) (net.Conn, error) {
	var d net.Dialer
	if a.Network != "unix" {
		return d.DialContext(ctx, a.Network, a.Address)
	}
	return dialUnixNoFollow(ctx, a)
}

// DialContext is Dial of a with the signature of a gRPC context dialer
// (grpc.WithContextDialer(a.DialContext)); the address gRPC passes is ignored.
func (a Addr) DialContext(ctx context.Context, _ string) (net.Conn, error) { return Dial(ctx, a) }

// DialUnix is Dial of the unix socket at path.
func DialUnix(ctx context.Context, path string) (*net.UnixConn, error) {
	c, err := Dial(ctx, Addr{Network: "unix", Address: path})
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// notSocket is the error of a dial of a, whose last element is not a socket.
func notSocket(a Addr) error {
	return &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: a.Address, Net: "unix"},
		Err: fmt.Errorf("%s: %w", a.Address, ErrNotSocket)}
}
