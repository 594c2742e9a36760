package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
)

// lockedBuffer is a log destination safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// refusalLines returns the log's lines about the proxy being out of reach.
func (l *lockedBuffer) refusalLines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		if m["msg"] == "egress relay: cannot reach the egress proxy" {
			lines = append(lines, m)
		}
	}
	return lines
}

// refusedIn sums the refusals lines account for: one for the first line, the count of each
// summary.
func refusedIn(lines []map[string]any) int {
	n := 0
	for _, l := range lines {
		if c, ok := l["refused"].(float64); ok {
			n += int(c)
		} else {
			n++
		}
	}
	return n
}

// expectBadGateway sends a proxy request to the relay at addr and expects its 502.
func expectBadGateway(t *testing.T, addr string) {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	io.WriteString(c, "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusBadGateway || string(body) != "fusebox egress: the egress proxy is not reachable from this sandbox\n" {
		t.Fatalf("got %s %q (%v)", res.Status, body, err)
	}
}

// With the proxy gone (a stopped manager), every connection is refused: the log gets the
// first refusal and then a count at most every refusalSummaryEvery, not a line each.
func TestRelayRefusalsAreCountedNotLoggedEach(t *testing.T) {
	leakcheck.Check(t)
	every := refusalSummaryEvery
	refusalSummaryEvery = time.Second
	t.Cleanup(func() { refusalSummaryEvery = every })

	// A socket file nobody listens on: what a stopped manager leaves.
	sock := filepath.Join(t.TempDir(), "egress.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	var logBuf lockedBuffer
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, sock, slog.New(slog.NewJSONHandler(&logBuf, nil))) }()

	start := time.Now()
	const n = 200
	for range n {
		expectBadGateway(t, ln.Addr().String())
	}
	elapsed := time.Since(start)
	// Until the summary of the last refusals is out.
	deadline := time.Now().Add(10 * time.Second)
	for refusedIn(logBuf.refusalLines(t)) < n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	lines := logBuf.refusalLines(t)
	if got := refusedIn(lines); got != n {
		t.Fatalf("the log accounts for %d refusals, want %d:\n%v", got, n, lines)
	}
	if max := 2 + int(elapsed/refusalSummaryEvery); len(lines) > max {
		t.Fatalf("%d log lines for %d refusals in %v, want at most %d (the first, then one per %v)", len(lines), n, elapsed, max, refusalSummaryEvery)
	}
	if lines[0]["cause"] != "connection refused" || !strings.Contains(lines[0]["err"].(string), "connection refused") {
		t.Errorf("first line: %v", lines[0])
	}
	last := lines[len(lines)-1]
	if last["refused_in_all"] != float64(n) {
		t.Errorf("last line: %v, want refused_in_all %d", last, n)
	}

	// Refusals still counted when the relay stops are summed up as it stops.
	for range 5 {
		expectBadGateway(t, ln.Addr().String())
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	lines = logBuf.refusalLines(t)
	if got := refusedIn(lines); got != n+5 {
		t.Fatalf("after Serve returned the log accounts for %d refusals, want %d", got, n+5)
	}
	if last := lines[len(lines)-1]; last["refused_in_all"] != float64(n+5) {
		t.Errorf("last line: %v, want refused_in_all %d", last, n+5)
	}
}

func TestRefusalCauseOf(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	_, err := net.Dial("unix", sock)
	if got := refusalCauseOf(err); got != "no such file or directory" {
		t.Errorf("refusalCauseOf(%v) = %q", err, got)
	}
	if got := refusalCauseOf(io.EOF); got != "other" {
		t.Errorf("refusalCauseOf(EOF) = %q", got)
	}
}
