// Package floor measures the physical floors of moving small files inside a sandbox: a plain
// loop of open, write, close (or open, read, compare, close) in the sandbox itself, with no
// RPC, no atomic rename and no validation. The data plane's WriteFiles and ReadFiles figures
// are judged against them; fusebox-bench dataplane runs them there as the fusebox-floor
// helper. The benchmark and the floor share the workload defined here: the same paths (Dirs
// directories) and the same random contents (Content), so that both verify the same bytes.
package floor

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
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
