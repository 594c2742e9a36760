package server

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestGateHoldsTheLatestConnectionUntilItOpens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(ln)
	defer g.Close()
	dial := func(msg string) net.Conn {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := dial("first")
	second := dial("second") // replaces the first, which is closed unserved
	if n, err := first.Read(make([]byte, 8)); n != 0 || !closedUnserved(err) {
		t.Fatalf("replaced connection: read %d bytes, %v; want it closed", n, err)
	}
	g.Open()
	third := dial("third")
	// Accept returns the held connection first, with its bytes unread, then the later one.
	for _, want := range []string{"second", "third"} {
		c, err := g.Accept()
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
			t.Fatalf("accepted connection carries %q (%v), want %q", got, err, want)
		}
		c.Close()
	}
	for _, c := range []net.Conn{second, third} {
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("after the server's close: %v, want EOF", err)
		}
	}
}

func TestGateCloseClosesTheHeldConnection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(ln)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for { // until the gate holds it
		g.mu.Lock()
		held := g.held != nil
		g.mu.Unlock()
		if held {
			break
		}
		time.Sleep(time.Millisecond)
	}
	g.Close()
	if _, err := c.Read(make([]byte, 1)); !closedUnserved(err) {
		t.Errorf("held connection after Close: %v, want it closed", err)
	}
	if _, err := g.Accept(); err == nil {
		t.Error("Accept after Close succeeded")
	}
}

// closedUnserved reports whether err is what reading a connection the server closed returns
// (a reset when it closed with our bytes unread).
func closedUnserved(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}
