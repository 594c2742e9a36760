// Package coalesce sends the TLS records that one Write of a TLS connection produces in one
// write of the connection below it. crypto/tls writes each record (at most 16 KiB) with its
// own write; under gVisor every write is a round through the sentry to the host socket, and
// on the host every small write wakes the sandbox's reader for a small read. The bytes on the
// wire are the same, in the same order; only the number of writes changes, so this sits below
// TLS, outside what the key pinning decides.
//
// Use: b := Under(raw); t := tls.Server(b, cfg) (or tls.Client); c := Over(t, b).
package coalesce

import (
	"net"
	"sync"
)

// Below is the connection under TLS. While a Write of the connection Over it runs, its
// writes are kept and then leave in one write; at other times (the handshake, an alert from
// the read side) each write goes straight through.
type Below struct {
	net.Conn
	mu        sync.Mutex // guards gathering and buf
	gathering bool
	buf       []byte
}

// Under returns the Below of raw.
func Under(raw net.Conn) *Below { return &Below{Conn: raw} }

func (g *Below) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gathering {
		g.buf = append(g.buf, p...)
		return len(p), nil
	}
	return g.Conn.Write(p)
}

func (g *Below) start() {
	g.mu.Lock()
	g.gathering = true
	g.mu.Unlock()
}

// flush ends gathering and writes what was gathered.
func (g *Below) flush() error {
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

// Over returns the TLS connection t, made on b, with the records of each of its Writes
// leaving together.
func Over(t net.Conn, b *Below) net.Conn { return &over{Conn: t, g: b} }

type over struct {
	net.Conn // the TLS connection
	g        *Below
	mu       sync.Mutex // one Write at a time: each gathers alone
}

func (c *over) Write(p []byte) (int, error) {
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
