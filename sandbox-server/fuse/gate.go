package fuse

import (
	"net"
	"sync"
)

// Waitroom keeps connections that reach the data listener while the gate is shut, without
// reading or writing them (an accelerator: the connection an agent told the picked unit
// early makes while sFuse runs, see internal/fastpath's EarlyNaming). The gate calls its methods one at a time.
type Waitroom interface {
	// Keep takes c, accepted while the gate is shut. It may close c, or one kept before.
	Keep(c net.Conn)
	// Release is called once, when the gate opens: it returns the connection to serve first
	// (nil for none) and closes any other it kept.
	Release() net.Conn
	// Close closes what it keeps.
	Close()
}

// gate is the data listener, bound before the sandbox joins the pool and shut until the fuse
// blows: until then no connection is served (each is closed at once, or kept unread by the
// Waitroom). Once open, Accept returns the connection the Waitroom released, then every one
// accepted. What is served on them is the data plane Start began, with the pinning
// configuration the fuse built.
type gate struct {
	net.Listener
	waiting Waitroom      // nil: close connections accepted while shut
	conns   chan net.Conn // accepted while open, for Accept
	closing chan struct{} // closed by Close
	done    chan struct{} // closed when the accept loop has ended; err is then set
	err     error

	mu     sync.Mutex // guards isOpen, closed, first, and the calls to waiting
	isOpen bool
	closed bool
	first  net.Conn // released by waiting when the gate opened, for the first Accept

	closeOnce sync.Once
}

func newGate(ln net.Listener, w Waitroom) *gate {
	g := &gate{Listener: ln, waiting: w, conns: make(chan net.Conn),
		closing: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

func (g *gate) run() {
	defer close(g.done)
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			g.err = err
			return
		}
		g.mu.Lock()
		switch {
		case g.closed:
			c.Close()
		case !g.isOpen && g.waiting != nil:
			g.waiting.Keep(c)
		case !g.isOpen:
			c.Close()
		}
		open := g.isOpen && !g.closed
		g.mu.Unlock()
		if open {
			select {
			case g.conns <- c:
			case <-g.closing:
				c.Close()
			}
		}
	}
}

// open lets connections through from now on, the one the Waitroom releases first.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.isOpen || g.closed {
		return
	}
	g.isOpen = true
	if g.waiting != nil {
		g.first = g.waiting.Release()
	}
}

// Accept returns the next connection once the gate is open.
func (g *gate) Accept() (net.Conn, error) {
	g.mu.Lock()
	if c := g.first; c != nil {
		g.first = nil
		g.mu.Unlock()
		return c, nil
	}
	g.mu.Unlock()
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.closing:
		return nil, net.ErrClosed
	case <-g.done:
		return nil, g.err
	}
}

// Close closes the listener (removing its unix socket) and every connection not yet served,
// and ends the accept loop.
func (g *gate) Close() error {
	var err error
	g.closeOnce.Do(func() {
		close(g.closing)
		err = g.Listener.Close()
		g.mu.Lock()
		g.closed = true
		c := g.first
		g.first = nil
		if g.waiting != nil {
			g.waiting.Close()
		}
		g.mu.Unlock()
		if c != nil {
			c.Close()
		}
	})
	return err
}
