// Package waitroom holds, for the sandbox's data-socket gate, a connection that an agent made
// before the fuse blew (early naming, fastpath.Switches.EarlyNaming). It is part of the
// latency wing; the gate (sandbox-server/fuse) reads nothing from what it keeps until the
// fuse has blown.
package waitroom

import "net"

// Latest is the sandbox gate's Waitroom (see sandbox-server/fuse) for early naming: it keeps
// the latest connection accepted while the gate is shut, unread, and closes the one it kept
// before (an agent that dials again replaces it). The gate serializes its calls.
type Latest struct{ c net.Conn }

// Keep keeps c in place of the connection kept before, which it closes.
func (l *Latest) Keep(c net.Conn) {
	if l.c != nil {
		l.c.Close()
	}
	l.c = c
}

// Release returns the kept connection, if any.
func (l *Latest) Release() net.Conn {
	c := l.c
	l.c = nil
	return c
}

// Close closes the kept connection, if any.
func (l *Latest) Close() {
	if l.c != nil {
		l.c.Close()
		l.c = nil
	}
}
