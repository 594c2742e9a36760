package server

import (
	"bufio"
	"net"
)

// connReadBuffer is the read buffer under TLS on data-plane connections. TLS reads a record
// (at most 16 KiB) at a time; under gVisor every read is a round through the sentry to the
// host socket, so without this buffer a 256 MiB upload costs some 16,000 reads. With it, one
// read drains whatever the socket holds.
const connReadBuffer = 1 << 20

// bufferedListener wraps accepted connections in a large read buffer.
type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, connReadBuffer)}, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
