package endpoint

import (
	"context"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// dialUnixNoFollow connects to the socket at a.Address through an O_PATH descriptor of it.
func dialUnixNoFollow(ctx context.Context, a Addr) (net.Conn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: a.Address, Net: "unix"}, Err: err}
	}
	// O_PATH with O_NOFOLLOW opens a link itself rather than failing: the fstat below sees it.
	fd, err := unix.Open(a.Address, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, opErr(&os.PathError{Op: "open", Path: a.Address, Err: err})
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, opErr(&os.PathError{Op: "fstat", Path: a.Address, Err: err})
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, notSocket(a)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, opErr(err)
	}
	return c, nil
}
