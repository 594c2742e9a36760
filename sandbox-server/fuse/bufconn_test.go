package fuse

import (
	"bytes"
	"io"
	"net"
	"testing"
)

func TestBufferedConnDeliversEveryByteAndGrows(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	want := make([]byte, 5<<20)
	for i := range want {
		want[i] = byte(i * 31)
	}
	go func() {
		a.Write(want)
		a.Close()
	}()
	c := &bufferedConn{Conn: b, buf: make([]byte, connReadBufferMin)}
	var got bytes.Buffer
	buf := make([]byte, 1000) // smaller than the buffer: reads go through it
	if _, err := io.CopyBuffer(&got, struct{ io.Reader }{c}, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatal("bytes differ")
	}
	if len(c.buf) > connReadBufferMax || len(c.buf) <= connReadBufferMin {
		t.Fatalf("buffer is %d bytes after a bulk transfer, want (%d, %d]", len(c.buf), connReadBufferMin, connReadBufferMax)
	}
}
