// Package coalesce sends the TLS records that one Write of a TLS connection produces in one
// write of the connection below it. crypto/tls writes each record (at most 16 KiB) with its
// own write; under gVisor every write is a round through the sentry to the host socket, and
// on the host every small write wakes the sandbox's reader for a small read. The bytes on the
// wire are the same, in the same order; only the number of writes changes, so this sits below
// TLS, outside what the key pinning decides.
//
// Use: b := Under(raw); t := tls.Server(b, cfg) (or tls.Client); c := Over(t, b), or
// Pipelined(t, b) for a connection that streams one way.
package coalesce

import (
	"errors"
	"net"
	"sync"
)

// Below is the connection under TLS. While a Write of the connection Over it runs, its
// writes are kept and then leave in one write; at other times (the handshake, an alert from
// the read side) each write goes straight through, after any gathered write still in flight.
type Below struct {
	net.Conn
	mu        sync.Mutex // guards gathering, buf, async, inFlight, spare and err
	gathering bool
	buf       []byte
	// Pipelined (async): gathered records leave on a goroutine of their own while the next
	// Write encrypts into the spare buffer; at most one write is in flight.
	async    bool
	inFlight bool
	done     chan flushed // the in-flight write's result
	spare    []byte
	err      error // the first failed pipelined write's: every later write returns it
}

type flushed struct {
	buf []byte
	err error
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
	if err := g.waitLocked(); err != nil {
		return 0, err
	}
	return g.Conn.Write(p)
}

func (g *Below) start() {
	g.mu.Lock()
	g.gathering = true
	g.mu.Unlock()
}

// waitLocked waits for the write in flight, if any, and returns the first error of a
// pipelined write.
func (g *Below) waitLocked() error {
	if g.inFlight {
		f := <-g.done
		g.inFlight, g.spare = false, f.buf[:0]
		if f.err != nil && g.err == nil {
			g.err = f.err
		}
	}
	return g.err
}

// flush ends gathering and writes what was gathered: before it returns, or, pipelined, on a
// goroutine that the next write waits for.
func (g *Below) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gathering = false
	if err := g.waitLocked(); err != nil {
		g.buf = g.buf[:0]
		return err
	}
	if len(g.buf) == 0 {
		return nil
	}
	if !g.async {
		_, err := g.Conn.Write(g.buf)
		g.buf = g.buf[:0]
		return err
	}
	out := g.buf
	g.buf, g.spare, g.inFlight = g.spare, nil, true
	go func() {
		_, err := g.Conn.Write(out)
		g.done <- flushed{out, err} // never blocks: done holds the one write in flight
	}()
	return nil
}

// Flush waits until everything written so far has left (or failed to).
func (g *Below) Flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waitLocked()
}

// Over returns the TLS connection t, made on b, with the records of each of its Writes
// leaving together.
func Over(t net.Conn, b *Below) net.Conn { return &over{Conn: t, g: b} }

// Pipelined is Over for a connection that streams large writes one way: a Write returns once
// its records are gathered, and they leave on a goroutine of their own while the next Write
// encrypts, so that encryption and the write below overlap instead of taking turns (under
// gVisor the write waits on the host socket's send buffer). The order of the bytes is kept:
// every write below, gathered or not, waits for the one in flight. The cost is where errors
// show: a failed write is returned by the Write (or Flush) after it, and by all later ones;
// a stream that must know that its last bytes left calls Flush. Close does not wait: the
// bytes in flight leave before TLS's close_notify, or fail with the connection.
func Pipelined(t net.Conn, b *Below) net.Conn {
	b.mu.Lock()
	b.async, b.done = true, make(chan flushed, 1)
	b.mu.Unlock()
	return &over{Conn: t, g: b}
}

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

// Flush waits until the bytes of every Write so far have left (Pipelined), and returns the
// error of the first that failed.
func (c *over) Flush() error { return c.g.Flush() }

// CloseWrite ends the writing side of the TLS connection (its close_notify, after the bytes of
// every Write so far), for a connection that carries a half-closed stream.
func (c *over) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errors.ErrUnsupported
	}
	return cw.CloseWrite()
}
