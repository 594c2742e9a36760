package fuse

import (
	"net"
	"sync"
)

// gate is the data listener, bound before the sandbox joins the pool and shut until the fuse
// blows: until then no connection is served, each is closed at once, unread. Once open,
// Accept returns every connection accepted. What is served on them is the data plane Start
// began, with the pinning configuration the fuse built.
type gate struct {
	net.Listener
	conns   chan net.Conn // accepted while open, for Accept
	closing chan struct{} // closed by Close
	done    chan struct{} // closed when the accept loop has ended; err is then set
	err     error

	mu     sync.Mutex // guards isOpen and closed
	isOpen bool
	closed bool

	closeOnce sync.Once
}

func newGate(ln net.Listener) *gate {
	g := &gate{Listener: ln, conns: make(chan net.Conn),
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
		open := g.isOpen && !g.closed
		g.mu.Unlock()
		if !open {
			c.Close()
			continue
		}
		select {
		case g.conns <- c:
		case <-g.closing:
			c.Close()
		}
	}
}

// open lets connections through from now on.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.isOpen = true
	}
}

// Accept returns the next connection once the gate is open.
func (g *gate) Accept() (net.Conn, error) {
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
		g.mu.Unlock()
	})
	return err
}
