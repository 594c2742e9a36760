package client

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/bulk"
	"github.com/fusebox-dev/fusebox/internal/leakcheck"
)

func TestReadAheadPassesTheBytesInOrder(t *testing.T) {
	leakcheck.Check(t)
	a, b := net.Pipe()
	r := newReadAhead(b)
	data := make([]byte, 3*aheadBufs*aheadBuf+123) // more than the buffers hold at once
	rand.NewChaCha8([32]byte{7}).Read(data)
	go func() {
		for off := 0; off < len(data); off += 70_001 {
			a.Write(data[off:min(off+70_001, len(data))])
		}
		a.Close()
	}()
	got, err := io.ReadAll(struct{ io.Reader }{r}) // small reads, as TLS makes them
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(data))
	}
	r.Close()
}

func TestReadAheadCloseEndsTheReader(t *testing.T) {
	leakcheck.Check(t)
	a, b := net.Pipe()
	defer a.Close()
	r := newReadAhead(b)
	// The reading goroutine is blocked in a read, or on full buffers nobody takes.
	go a.Write(make([]byte, aheadBuf))
	r.Close()
	if _, err := io.ReadAll(r); err == nil {
		t.Fatal("a closed connection read to its end without error")
	}
}

// frames returns the wire form of data as chunks of at most chunk bytes and the empty chunk.
func frames(data []byte, chunk int) []byte {
	var out []byte
	for off := 0; off < len(data); off += chunk {
		n := min(chunk, len(data)-off)
		buf := bulk.NewChunk(n)
		copy(bulk.Data(buf), data[off:off+n])
		out = append(out, bulk.Frame(buf, n)...)
	}
	return append(out, bulk.EndChunk...)
}

// failingWriter fails its write number failAt and records every write it is given.
type failingWriter struct {
	failAt, writes int
	after          bool // a write came after the failure
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.writes++
	if w.writes > w.failAt {
		w.after = true
	}
	if w.writes == w.failAt {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestReceive(t *testing.T) {
	leakcheck.Check(t)
	data := make([]byte, 5*bulk.MaxChunk+77)
	rand.NewChaCha8([32]byte{8}).Read(data)
	for _, tc := range []struct {
		name string
		size int
	}{{"several chunks", len(data)}, {"one chunk", 1000}, {"empty", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() { a.Write(frames(data[:tc.size], bulk.MaxChunk)); a.Close() }()
			var got bytes.Buffer
			n, err := receive(b, &got, uint64(tc.size))
			if err != nil || n != uint64(tc.size) || !bytes.Equal(got.Bytes(), data[:tc.size]) {
				t.Fatalf("receive = %d, %v; got %d bytes, equal %v", n, err, got.Len(), bytes.Equal(got.Bytes(), data[:tc.size]))
			}
		})
	}
	t.Run("the destination fails", func(t *testing.T) {
		a, b := net.Pipe()
		defer b.Close()
		go func() { a.Write(frames(data, bulk.MaxChunk)); a.Close() }()
		w := &failingWriter{failAt: 2}
		if _, err := receive(b, w, uint64(len(data))); err == nil || err.Error() != "disk full" {
			t.Fatalf("receive = %v, want the destination's error", err)
		}
		if w.after {
			t.Fatal("the destination was written after it failed")
		}
	})
	t.Run("the connection ends early", func(t *testing.T) {
		a, b := net.Pipe()
		wire := frames(data, bulk.MaxChunk)
		go func() { a.Write(wire[:len(wire)/2]); a.Close() }()
		if _, err := receive(b, io.Discard, uint64(len(data))); err == nil {
			t.Fatal("a cut stream was received without error")
		}
	})
}
