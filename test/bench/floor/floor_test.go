package floor

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/tlspin"
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
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 5<<20 + 123
	data := Content(3, size)
	// host is the host side of a round: it sends data and closes, or reads to EOF and answers
	// one byte, and returns what it read.
	host := func(send bool) <-chan []byte {
		got := make(chan []byte, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- nil
				return
			}
			defer c.Close()
			if send {
				c.Write(data)
				got <- nil
				return
			}
			b, _ := io.ReadAll(c)
			c.Write([]byte{1})
			got <- b
		}()
		return got
	}
	for _, file := range []string{"", filepath.Join(dir, "landed")} {
		<-func() <-chan []byte {
			got := host(true)
			n, _, err := ReceiveStream(path, file)
			if err != nil || n != size {
				t.Fatalf("ReceiveStream(file %q) = %d, %v; want %d bytes", file, n, err, size)
			}
			return got
		}()
		got := host(false)
		n, _, err := SendStream(path, size, file)
		if err != nil || n != size {
			t.Fatalf("SendStream(file %q) = %d, %v; want %d bytes", file, n, err, size)
		}
		if b := <-got; len(b) != size {
			t.Fatalf("the host read %d bytes, want %d", len(b), size)
		} else if file != "" && !bytes.Equal(b, data) {
			t.Fatal("the file sent differs from what was received into it")
		}
	}
}

func TestStreamTLS(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	file := filepath.Join(dir, "f")
	data := Content(4, 5<<20+77)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	key, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := tlspin.MarshalPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		helper []byte // the key the helper pins
		ok     bool
	}{{"pinned", pub, true}, {"another key", otherKey(t), false}} {
		t.Run(tc.name, func(t *testing.T) {
			var got bytes.Buffer
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				_, err = ReceiveStreamTLS(c, key, &got)
				done <- err
			}()
			n, _, err := SendStreamTLS(path, file, tc.helper)
			herr := <-done
			if !tc.ok {
				if err == nil || herr == nil {
					t.Fatalf("a helper pinning another key: helper %v, host %v; want both to fail", err, herr)
				}
				return
			}
			if err != nil || herr != nil {
				t.Fatalf("helper %v, host %v", err, herr)
			}
			if n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("sent %d bytes, received %d, equal %v", n, got.Len(), bytes.Equal(got.Bytes(), data))
			}
		})
	}
}

func otherKey(t *testing.T) []byte {
	k, err := tlspin.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := tlspin.MarshalPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return der
}
