//go:build !linux

package endpoint

import (
	"context"
	"net"
	"os"
)

// dialUnixNoFollow connects to the socket at a.Address after checking, with lstat, that it is
// one (without O_PATH the check and the connect cannot be made one step).
func dialUnixNoFollow(ctx context.Context, a Addr) (net.Conn, error) {
	fi, err := os.Lstat(a.Address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: a.Address, Net: "unix"}, Err: err}
	}
	if fi.Mode().Type() != os.ModeSocket {
		return nil, notSocket(a)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", a.Address)
}
