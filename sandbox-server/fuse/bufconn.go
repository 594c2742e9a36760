package fuse

import (
	"net"
)

// Read buffering under TLS on data-plane connections. TLS reads a record (at most 16 KiB) at a
// time; under gVisor every read is a round through the sentry to the host socket, so without
// a buffer a 256 MiB upload costs some 16,000 reads. The buffer starts small, because every
// fresh page costs a fault under gVisor and a new connection sits on the allocation path, and
// doubles up to a maximum whenever one read fills it, which only bulk transfers do.
const (
	connReadBufferMin = 32 << 10
	connReadBufferMax = 1 << 20
)

// bufferedConn is c with a growing read buffer. It is read by one goroutine at a time (the
// TLS layer's reader).
func newBufferedConn(c net.Conn) *bufferedConn {
	return &bufferedConn{Conn: c, buf: make([]byte, connReadBufferMin)}
}

type bufferedConn struct {
	net.Conn
	buf  []byte
	r, w int // buf[r:w] is unread
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r == c.w {
		if len(p) >= len(c.buf) {
			return c.Conn.Read(p)
		}
		n, err := c.Conn.Read(c.buf)
		c.r, c.w = 0, n
		if n == len(c.buf) && len(c.buf) < connReadBufferMax {
			grown := make([]byte, min(2*len(c.buf), connReadBufferMax))
			copy(grown, c.buf[:n])
			c.buf = grown
		}
		if n == 0 {
			return 0, err
		}
	}
	n := copy(p, c.buf[c.r:c.w])
	c.r += n
	return n, nil
}
