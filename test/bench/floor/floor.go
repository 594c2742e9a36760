// Package floor measures the physical floors of moving small files inside a sandbox: a plain
// loop of open, write, close (or open, read, compare, close) in the sandbox itself, with no
// RPC, no atomic rename and no validation. The data plane's WriteFiles and ReadFiles figures
// are judged against them; fusebox-bench dataplane runs them there as the fusebox-floor
// helper. The benchmark and the floor share the workload defined here: the same paths (Dirs
// directories) and the same random contents (Content), so that both verify the same bytes.
// ReceiveStream and SendStream are the streaming floor: raw bytes over a host unix socket,
// alone or written to (read from) a file.
package floor

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Dirs is how many directories the workload's files are spread over, as a source tree's would be.
const Dirs = 50

// Path is file i's path under root: Dirs directories, files dealt round them.
func Path(root string, i int) string {
	return fmt.Sprintf("%s/d%02d/f%05d.txt", root, i%Dirs, i)
}

// Content is file i's contents: size random bytes (ChaCha8 seeded by i), incompressible and
// distinct per file, the same in the benchmark and in the floor.
func Content(i, size int) []byte {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(i))
	b := make([]byte, size)
	rand.NewChaCha8(seed).Read(b)
	return b
}

// Contents returns Content(i, size) for i in [0, n).
func Contents(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = Content(i, size)
	}
	return out
}

// WriteFiles writes n files of size bytes under dir (Path, Content) and returns the time the
// writes took, directory creation included; the contents are made before the clock starts.
func WriteFiles(dir string, n, size int) (time.Duration, error) {
	data := Contents(n, size)
	start := time.Now()
	for d := range min(n, Dirs) {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("d%02d", d)), 0o755); err != nil {
			return 0, err
		}
	}
	for i := range n {
		if err := os.WriteFile(Path(dir, i), data[i], 0o644); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// ReadFiles reads back the n files of size bytes WriteFiles wrote under dir, compares every
// byte with what it wrote, and returns the time that took; the expected contents are made
// before the clock starts.
func ReadFiles(dir string, n, size int) (time.Duration, error) {
	want := Contents(n, size)
	start := time.Now()
	for i := range n {
		got, err := os.ReadFile(Path(dir, i))
		if err != nil {
			return 0, err
		}
		if !bytes.Equal(got, want[i]) {
			return 0, fmt.Errorf("%s: contents differ from what was written", Path(dir, i))
		}
	}
	return time.Since(start), nil
}

// streamBuf is the floor's socket buffer: as large as the client's stream chunk.
const streamBuf = 2 << 20

// ReceiveStream connects to the unix socket at path and reads from it until EOF: the raw
// throughput of a host unix socket into the sandbox, with no TLS, HTTP/2 or framing. With
// file set it writes what arrives to that file (created), in the same loop: the floor of any
// transfer that lands in a file. It returns the bytes read and the time from the connection to
// EOF (and the file's close).
func ReceiveStream(path, file string) (int64, time.Duration, error) {
	var w io.Writer = io.Discard
	var f *os.File
	if file != "" {
		var err error
		if f, err = os.Create(file); err != nil {
			return 0, 0, err
		}
		defer f.Close()
		w = f
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	start := time.Now()
	n, err := io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{c}, make([]byte, streamBuf))
	if err == nil && f != nil {
		err = f.Close()
	}
	return n, time.Since(start), err
}

// SendStream connects to the unix socket at path and writes n bytes of random data to it
// (made before the clock starts), then closes: the raw throughput out of the sandbox. With
// file set it sends that file's bytes instead (n is then ignored), read in the same loop. It
// returns the bytes sent and the time until the host had them all.
func SendStream(path string, n int64, file string) (int64, time.Duration, error) {
	var f *os.File
	if file != "" {
		var err error
		if f, err = os.Open(file); err != nil {
			return 0, 0, err
		}
		defer f.Close()
	}
	buf := Content(0, streamBuf)
	c, err := net.Dial("unix", path)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	start := time.Now()
	var sent int64
	if f != nil {
		sent, err = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{f}, buf)
	} else {
		// The same buffer written over and over: no copy beside the socket's own.
		for sent < n && err == nil {
			var k int
			k, err = c.Write(buf[:min(n-sent, int64(len(buf)))])
			sent += int64(k)
		}
	}
	if err != nil {
		return 0, 0, err
	}
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		return 0, 0, err
	}
	// The host answers one byte once it has read everything: the time covers the delivery.
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return 0, 0, fmt.Errorf("waiting for the receiver: %w", err)
	}
	return sent, time.Since(start), nil
}
