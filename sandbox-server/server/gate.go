package server

import (
	"net"
	"sync"
)

// gate is the data listener, bound when the server starts and shut until the fuse blows.
// Binding a host unix socket from inside gVisor is a round trip to the host (about a
// millisecond), so it is done before the sandbox joins the pool rather than during
// InitializeTLS; until the gate opens, every connection is closed as soon as it is accepted,
// before a byte is read or written: the data plane serves nothing before initialisation.
type gate struct {
	net.Listener
	open    chan struct{} // closed when the fuse blows
	conns   chan net.Conn // connections accepted while open, for Accept
	closing chan struct{} // closed by Close
	done    chan struct{} // closed when the accept loop has ended; err is then set
	err     error

	openOnce, closeOnce sync.Once
}

func newGate(ln net.Listener) *gate {
	g := &gate{Listener: ln, open: make(chan struct{}), conns: make(chan net.Conn),
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
		select {
		case <-g.open:
		default:
			c.Close() // shut: served nothing
			continue
		}
		select {
		case g.conns <- c:
		case <-g.closing:
			c.Close()
		}
	}
}

// Open lets connections through from now on.
func (g *gate) Open() { g.openOnce.Do(func() { close(g.open) }) }

// Accept returns the next connection accepted while the gate is open.
func (g *gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		return nil, g.err
	}
}

// Close closes the listener (removing its unix socket) and ends the accept loop.
func (g *gate) Close() error {
	var err error
	g.closeOnce.Do(func() {
		close(g.closing)
		err = g.Listener.Close()
	})
	return err
}
