package server

import (
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Write coalescing under TLS. gRPC hands TLS up to its write buffer at a time, and crypto/tls
// writes each record of that (at most 16 KiB) with its own write to the connection. Under
// gVisor every write is a round through the sentry to the host socket, so a 256 MiB download
// would cost some 16,000 of them and a 3.5 MiB batch answer 220. coalescedCreds gathers the
// records one Write of TLS produces and sends them in one write: the bytes on the wire are the
// same, in the same order; only the number of writes changes. It is the write-side twin of
// bufferedConn's read buffer, and like it sits below TLS, outside what the pinning decides.
type coalescedCreds struct {
	credentials.TransportCredentials
}

func (c coalescedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	g := &gatherConn{Conn: raw}
	conn, info, err := c.TransportCredentials.ServerHandshake(g)
	if err != nil {
		return nil, nil, err
	}
	return &flushConn{Conn: conn, g: g}, info, nil
}

func (c coalescedCreds) Clone() credentials.TransportCredentials {
	return coalescedCreds{c.TransportCredentials.Clone()}
}

// gatherConn is the connection under TLS. Between start and flush its writes are kept and
// then leave in one write; at other times (the handshake, an alert from the read side) each
// write goes straight through.
type gatherConn struct {
	net.Conn
	mu        sync.Mutex // guards gathering and buf
	gathering bool
	buf       []byte
}

func (g *gatherConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gathering {
		g.buf = append(g.buf, p...)
		return len(p), nil
	}
	return g.Conn.Write(p)
}

func (g *gatherConn) start() {
	g.mu.Lock()
	g.gathering = true
	g.mu.Unlock()
}

// flush ends gathering and writes what was gathered.
func (g *gatherConn) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gathering = false
	if len(g.buf) == 0 {
		return nil
	}
	_, err := g.Conn.Write(g.buf)
	g.buf = g.buf[:0]
	return err
}

// flushConn is the connection over TLS: the records of each of its Writes leave together.
type flushConn struct {
	net.Conn // the TLS connection
	g        *gatherConn
	mu       sync.Mutex // one Write at a time: each gathers alone
}

func (c *flushConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.g.start()
	n, err := c.Conn.Write(p)
	if ferr := c.g.flush(); ferr != nil && err == nil {
		// TLS counted the records as sent; the connection is broken, and says so.
		return 0, ferr
	}
	return n, err
}
