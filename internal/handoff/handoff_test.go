package handoff

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// peer is the far end of held connections: a unix listener standing in for a sandbox's
// data socket.
type peer struct {
	t  *testing.T
	ln net.Listener
}

func newPeer(t *testing.T) *peer {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "data.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &peer{t, ln}
}

// connect returns a connection to the peer as the holder has it, and the peer's end.
func (p *peer) connect() (*net.UnixConn, net.Conn) {
	p.t.Helper()
	c, err := net.Dial("unix", p.ln.Addr().String())
	if err != nil {
		p.t.Fatal(err)
	}
	s, err := p.ln.Accept()
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.UnixConn), s
}

// readEOF reports whether the peer's end sees the connection closed (no other copy of the
// holder's end is open).
func readEOF(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF)
}

func listen(t *testing.T) (*Server, string) {
	path := filepath.Join(t.TempDir(), "handoff.sock")
	s, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func TestTakeGetsTheHeldConnectionOnce(t *testing.T) {
	s, path := listen(t)
	if s.Addr() != "unix://"+path {
		t.Errorf("Addr() = %q", s.Addr())
	}
	p := newPeer(t)
	mine, far := p.connect()
	s.Hold("u1", mine)
	token, ok := s.Grant("u1")
	if !ok || len(token) != TokenSize {
		t.Fatalf("Grant = %x, %v", token, ok)
	}
	ctx := context.Background()
	c, err := Take(ctx, path, token)
	if err != nil {
		t.Fatal(err)
	}
	// Both directions work on the passed descriptor.
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(far, got); err != nil || string(got) != "ping" {
		t.Fatalf("peer read %q, %v", got, err)
	}
	far.Write([]byte("pong"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "pong" {
		t.Fatalf("taker read %q, %v", got, err)
	}
	// The server kept no copy: closing the taker's closes the connection.
	c.Close()
	if !readEOF(t, far) {
		t.Error("the peer did not see EOF after the taker closed: another descriptor is open")
	}
	if _, err := Take(ctx, path, token); !errors.Is(err, ErrNoGrant) {
		t.Errorf("second Take = %v, want ErrNoGrant", err)
	}
}

func TestTakeRefusesUngrantedAndWrongTokens(t *testing.T) {
	s, path := listen(t)
	p := newPeer(t)
	mine, _ := p.connect()
	s.Hold("u1", mine)
	ctx := context.Background()
	// Held but not granted: no token works, not even all zeros.
	if _, err := Take(ctx, path, make([]byte, TokenSize)); !errors.Is(err, ErrNoGrant) {
		t.Errorf("Take before Grant = %v, want ErrNoGrant", err)
	}
	token, _ := s.Grant("u1")
	wrong := bytes.Clone(token)
	wrong[0] ^= 1
	if _, err := Take(ctx, path, wrong); !errors.Is(err, ErrNoGrant) {
		t.Errorf("Take with a wrong token = %v, want ErrNoGrant", err)
	}
	if _, err := Take(ctx, path, token[:8]); err == nil {
		t.Error("Take with a short token succeeded")
	}
	// A new grant voids the old token.
	newer, _ := s.Grant("u1")
	if _, err := Take(ctx, path, token); !errors.Is(err, ErrNoGrant) {
		t.Errorf("Take with a replaced token = %v, want ErrNoGrant", err)
	}
	c, err := Take(ctx, path, newer)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, ok := s.Grant("u2"); ok {
		t.Error("Grant for a unit with nothing held reported ok")
	}
}

func TestDropHoldAndCloseCloseHeldConnections(t *testing.T) {
	s, path := listen(t)
	p := newPeer(t)
	first, farFirst := p.connect()
	second, farSecond := p.connect()
	s.Hold("u1", first)
	token, _ := s.Grant("u1")
	s.Hold("u1", second) // replaces: the first is closed and its grant gone
	if !readEOF(t, farFirst) {
		t.Error("a replaced connection was not closed")
	}
	if _, err := Take(context.Background(), path, token); !errors.Is(err, ErrNoGrant) {
		t.Errorf("Take of a replaced connection = %v, want ErrNoGrant", err)
	}
	token, _ = s.Grant("u1")
	s.Drop("u1")
	if !readEOF(t, farSecond) {
		t.Error("a dropped connection was not closed")
	}
	if _, err := Take(context.Background(), path, token); !errors.Is(err, ErrNoGrant) {
		t.Errorf("Take of a dropped connection = %v, want ErrNoGrant", err)
	}
	third, farThird := p.connect()
	s.Hold("u2", third)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !readEOF(t, farThird) {
		t.Error("Close left a held connection open")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after Close: %v", err)
	}
	fourth, farFourth := p.connect()
	s.Hold("u3", fourth) // after Close: closed at once
	if !readEOF(t, farFourth) {
		t.Error("Hold after Close kept the connection")
	}
}

func TestTakeEndsWithItsContext(t *testing.T) {
	// A handoff socket whose server never answers.
	path := filepath.Join(t.TempDir(), "mute.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	defer func(d time.Duration) { ioTimeout = d }(ioTimeout)
	ioTimeout = time.Hour // only the context can end the wait
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := Take(ctx, path, make([]byte, TokenSize)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Take from a mute server = %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Take did not end with its context")
	}
}

func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handoff.sock")
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // the file stays, as a killed manager leaves it
	s, err := Listen(path, nil)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	s.Close()
}
