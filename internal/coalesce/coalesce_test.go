package coalesce

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// countingConn records each write it is given.
type countingConn struct {
	net.Conn
	writes [][]byte
	err    error
}

func (c *countingConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

// recordWriter stands in for TLS: each Write of it writes p to the connection below in
// records of at most 4 bytes, one write each.
type recordWriter struct {
	net.Conn
	below net.Conn
}

func (r recordWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 4 {
		if _, err := r.below.Write(p[off:min(off+4, len(p))]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func TestWritesLeaveTogetherInOrder(t *testing.T) {
	raw := &countingConn{}
	g := Under(raw)
	c := Over(recordWriter{below: g}, g)

	// Outside a Write of the connection above (the handshake, an alert), writes go through.
	if _, err := g.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Write([]byte("0123456789")); n != 10 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if n, err := c.Write([]byte("abc")); n != 3 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	want := []string{"hello", "0123456789", "abc"}
	if len(raw.writes) != len(want) {
		t.Fatalf("%d writes below (%q), want %d", len(raw.writes), raw.writes, len(want))
	}
	for i, w := range want {
		if string(raw.writes[i]) != w {
			t.Errorf("write %d = %q, want %q", i, raw.writes[i], w)
		}
	}
}

func TestWriteReportsAFailedFlush(t *testing.T) {
	broken := errors.New("broken pipe")
	raw := &countingConn{err: broken}
	g := Under(raw)
	c := Over(recordWriter{below: g}, g)
	if n, err := c.Write([]byte("0123456789")); n != 0 || !errors.Is(err, broken) {
		t.Fatalf("Write = %d, %v; want 0, %v", n, err, broken)
	}
	// Nothing gathered stays behind for the next write.
	raw.err = nil
	if _, err := c.Write([]byte("xy")); err != nil {
		t.Fatal(err)
	}
	if len(raw.writes) != 1 || string(raw.writes[0]) != "xy" {
		t.Fatalf("writes below %q, want [xy]", raw.writes)
	}
}

// slowConn holds each write until release is closed, recording the writes in order.
type slowConn struct {
	countingConn
	release chan struct{}
	started chan struct{} // a write has begun
}

func (c *slowConn) Write(p []byte) (int, error) {
	select {
	case c.started <- struct{}{}:
	default:
	}
	<-c.release
	return c.countingConn.Write(p)
}

func TestPipelinedKeepsTheOrder(t *testing.T) {
	raw := &slowConn{release: make(chan struct{}), started: make(chan struct{}, 1)}
	g := Under(raw)
	c := Pipelined(recordWriter{below: g}, g)
	// The first Write returns with its records still in flight.
	if n, err := c.Write([]byte("0123456789")); n != 10 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	<-raw.started
	// A write outside a Write (an alert from the read side) waits for the one in flight.
	direct := make(chan error, 1)
	go func() {
		_, err := g.Write([]byte("alert"))
		direct <- err
	}()
	close(raw.release)
	if err := <-direct; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if err := c.(interface{ Flush() error }).Flush(); err != nil {
		t.Fatal(err)
	}
	want := []string{"0123456789", "alert", "abc"}
	if len(raw.writes) != len(want) {
		t.Fatalf("%d writes below (%q), want %d", len(raw.writes), raw.writes, len(want))
	}
	for i, w := range want {
		if string(raw.writes[i]) != w {
			t.Errorf("write %d = %q, want %q", i, raw.writes[i], w)
		}
	}
}

func TestPipelinedReportsAFailedWriteLater(t *testing.T) {
	broken := errors.New("broken pipe")
	raw := &countingConn{err: broken}
	g := Under(raw)
	c := Pipelined(recordWriter{below: g}, g)
	if _, err := c.Write([]byte("0123456789")); err != nil {
		t.Fatalf("the first Write returned %v before its records were written", err)
	}
	if err := c.(interface{ Flush() error }).Flush(); !errors.Is(err, broken) {
		t.Fatalf("Flush = %v, want %v", err, broken)
	}
	// Every later write fails too, and nothing more is written.
	raw.err = nil
	if n, err := c.Write([]byte("xy")); n != 0 || !errors.Is(err, broken) {
		t.Fatalf("Write after a failure = %d, %v; want 0, %v", n, err, broken)
	}
	if _, err := g.Write([]byte("alert")); !errors.Is(err, broken) {
		t.Fatalf("a direct write after a failure = %v, want %v", err, broken)
	}
	if len(raw.writes) != 0 {
		t.Fatalf("writes below after a failure: %q", raw.writes)
	}
}
