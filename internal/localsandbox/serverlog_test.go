package localsandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
)

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// Whatever is written to the pipe, the two files hold at most twice the limit, end with the
// last line written and hold whole lines.
func TestServerLogIsCapped(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	const limit = 64 << 10
	l, w, err := startServerLog(dir, limit)
	if err != nil {
		t.Fatal(err)
	}
	const lines = 100_000 // about 6 MiB
	for i := range lines {
		if _, err := fmt.Fprintf(w, "{\"msg\":\"line\",\"n\":%08d,\"pad\":\"%s\"}\n", i, strings.Repeat("x", i%40)); err != nil {
			t.Fatal(err)
		}
	}
	cur, old := filepath.Join(dir, LogName), filepath.Join(dir, LogName+".1")
	l.flush(10 * time.Second)
	// A rotation cuts at a line's end where one fits.
	for _, p := range []string{cur, old} {
		b, _ := os.ReadFile(p)
		if len(b) == 0 || !strings.HasSuffix(string(b), "\n") || !strings.HasPrefix(string(b), "{") {
			t.Errorf("%s does not hold whole lines: %q...%q", p, b[:min(len(b), 40)], b[max(len(b)-40, 0):])
		}
	}
	// A line longer than the limit is split, not kept whole.
	fmt.Fprintf(w, "%s\nlast\n", strings.Repeat("y", 3*limit))
	w.Close()
	l.wait(10 * time.Second)
	select {
	case <-l.done:
	default:
		t.Fatal("the reader did not end at the pipe's end")
	}
	for _, p := range []string{cur, old} {
		if n := fileSize(t, p); n > limit {
			t.Errorf("%s is %d bytes, over the limit %d", p, n, limit)
		}
	}
	log := readLog(dir)
	if !strings.HasSuffix(log, "y\nlast\n") {
		t.Errorf("the log does not end with the last line: ...%q", log[max(len(log)-40, 0):])
	}
}

// Log's flush sees every line written before it, at once.
func TestServerLogFlush(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	l, w, err := startServerLog(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		line := fmt.Sprintf("marker %d\n", i)
		if _, err := w.WriteString(line); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		l.flush(10 * time.Second)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("flush took %v", d)
		}
		if log := readLog(dir); !strings.HasSuffix(log, line) {
			t.Fatalf("after flush %d the log ends %q, want %q", i, log[max(len(log)-20, 0):], line)
		}
	}
	w.Close()
	l.wait(10 * time.Second)
	l.flush(time.Minute) // the reader has ended: at once
}

// With the reader gone (the manager's end), a write fails at once instead of blocking, and the
// file stays as it was.
func TestServerLogWithoutReaderRefusesWrites(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	l, w, err := startServerLog(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.WriteString("before\n")
	l.flush(10 * time.Second)
	l.stopReading()
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < 1000 && err == nil; i++ {
			_, err = w.WriteString(strings.Repeat("z", 1024) + "\n")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("write without a reader: %v, want EPIPE", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write without a reader blocked")
	}
	if log := readLog(dir); log != "before\n" {
		t.Fatalf("log = %q", log)
	}
}
