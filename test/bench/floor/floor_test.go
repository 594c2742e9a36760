package floor

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteThenReadVerifies(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteFiles(dir, 120, 512); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != Dirs {
		t.Fatalf("%d directories, want %d", len(entries), Dirs)
	}
	if _, err := ReadFiles(dir, 120, 512); err != nil {
		t.Fatalf("reading back: %v", err)
	}
	// A changed byte must fail the read-back.
	p := Path(dir, 77)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFiles(dir, 120, 512); err == nil {
		t.Fatal("a changed file read back without error")
	}
}

func TestContentIsRandomAndDistinct(t *testing.T) {
	a, b := Content(1, 4096), Content(2, 4096)
	if bytes.Equal(a, b) {
		t.Fatal("two files have the same contents")
	}
	if !bytes.Equal(a, Content(1, 4096)) {
		t.Fatal("Content is not deterministic")
	}
	seen := map[byte]bool{}
	for _, c := range a {
		seen[c] = true
	}
	if len(seen) < 200 { // 4096 random bytes cover nearly all 256 values
		t.Fatalf("only %d distinct byte values: not random", len(seen))
	}
	if got := Path("/w", 123); got != filepath.Join("/w", "d23", "f00123.txt") {
		t.Fatalf("Path = %s", got)
	}
}

func TestStreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 5<<20 + 123
	go func() { // the host side of ReceiveStream: size bytes, then EOF
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Write(make([]byte, size))
		c.Close()
	}()
	n, _, err := ReceiveStream(path)
	if err != nil || n != size {
		t.Fatalf("ReceiveStream = %d, %v; want %d bytes", n, err, size)
	}
	got := make(chan int64, 1)
	go func() { // the host side of SendStream: read to EOF, answer one byte
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		c.Write([]byte{1})
		got <- n
	}()
	if _, err := SendStream(path, size); err != nil {
		t.Fatalf("SendStream: %v", err)
	}
	if n := <-got; n != size {
		t.Fatalf("the host read %d bytes, want %d", n, size)
	}
}
