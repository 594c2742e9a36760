package server

import (
	"net"
	"sync"
)

// gate is the data listener, bound when the server starts and shut until the fuse blows.
// Binding a host unix socket from inside gVisor is a round trip to the host (about a
// millisecond), so it is done before the sandbox joins the pool rather than during
// InitializeTLS. Until the gate opens it serves nothing: no byte is read or written on any
// connection. It holds one connection, the latest accepted while shut, unread (the one the
// local manager opens ahead to hand to the agent, see internal/handoff: accepting it during
// the allocation cost the agent about a millisecond) and closes the rest as soon as they are
// accepted (a later one replaces the held one: a restarted manager opens a new one). When the
// gate opens, the held connection is the first that Accept returns.
type gate struct {
	net.Listener
	open    chan struct{} // closed when the fuse blows
	conns   chan net.Conn // for Accept; one buffered place, for the held connection
	closing chan struct{} // closed by Close
	done    chan struct{} // closed when the accept loop has ended; err is then set
	err     error

	mu   sync.Mutex // guards held
	held net.Conn   // accepted while shut, not yet passed to Accept

	openOnce, closeOnce sync.Once
}

func newGate(ln net.Listener) *gate {
	g := &gate{Listener: ln, open: make(chan struct{}), conns: make(chan net.Conn, 1),
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
		if g.isClosing() { // accepted as Close ran, which has emptied held already
			g.mu.Unlock()
			c.Close()
			continue
		}
		select {
		case <-g.open:
		default:
			// Shut: hold it unread, in place of the one held before.
			old := g.held
			g.held = c
			g.mu.Unlock()
			if old != nil {
				old.Close()
			}
			continue
		}
		g.mu.Unlock()
		g.pass(c)
	}
}

// isClosing reports whether Close has begun.
func (g *gate) isClosing() bool {
	select {
	case <-g.closing:
		return true
	default:
		return false
	}
}

// pass gives c to Accept, or closes it if the gate is closing.
func (g *gate) pass(c net.Conn) {
	if g.isClosing() {
		c.Close()
		return
	}
	select {
	case g.conns <- c:
	case <-g.closing:
		c.Close()
	}
}

// Open lets connections through from now on, the held one first.
func (g *gate) Open() {
	g.openOnce.Do(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.held != nil {
			// The buffer's place is free (nothing is sent before the gate opens), and the
			// accept loop's first send comes after this one.
			g.conns <- g.held
			g.held = nil
		}
		close(g.open)
	})
}

// Accept returns the next connection: the held one, then those accepted while open.
func (g *gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		return nil, g.err
	}
}

// Close closes the listener (removing its unix socket), the held connection if any, and ends
// the accept loop.
func (g *gate) Close() error {
	var err error
	g.closeOnce.Do(func() {
		close(g.closing)
		err = g.Listener.Close()
		g.mu.Lock()
		c := g.held
		g.held = nil
		g.mu.Unlock()
		if c != nil {
			c.Close()
		}
		select {
		case c := <-g.conns: // passed on opening, never accepted
			c.Close()
		default:
		}
	})
	return err
}
