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
