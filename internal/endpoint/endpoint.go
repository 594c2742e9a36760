// Package endpoint parses the listen and dial addresses fusebox binaries accept:
// "unix:///absolute/path" and "tcp://host:port".
package endpoint

import (
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
