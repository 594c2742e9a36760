// Package echotest serves echo connections for tests of proxies and relays.
package echotest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Serve echoes every connection ln accepts until the client half-closes it, then half-closes
// its side and drains the rest. It returns the number of connections accepted so far. A
// cleanup closes ln and every connection and waits for them.
func Serve(t testing.TB, ln net.Listener) *atomic.Int64 {
	t.Helper()
	var accepted atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex // guards conns
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				io.Copy(c, c)
				if hc, ok := c.(interface{ CloseWrite() error }); ok {
					hc.CloseWrite()
				}
				io.Copy(io.Discard, c)
				c.Close()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return &accepted
}
