package dataplane

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// sinkPy reads each connection to its end and answers with the number of bytes it read.
const sinkPy = `
import socket, socketserver, sys
class H(socketserver.BaseRequestHandler):
    def handle(self):
        s, n = self.request, 0
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        buf = bytearray(1 << 20)
        while True:
            k = s.recv_into(buf)
            if not k:
                break
            n += k
        s.sendall(str(n).encode())
        s.shutdown(socket.SHUT_WR)
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
S(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
`

// BenchmarkForwardThroughput sends 256 MiB through a port forward to a program in the sandbox
// that reads it, and, in the same iteration, 256 MiB as a bulk file stream (WriteFileFrom)
// into the same sandbox; it reports both rates and their ratio (forward/bulk).
func BenchmarkForwardThroughput(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	c := sb.Client
	ctx := context.Background()
	startProgram(b, c, 3000, pythonProgram(sinkPy, "3000"))
	const size = 256 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var fwd, blk time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		conn, err := c.DialPort(ctx, 3000)
		if err != nil {
			b.Fatal(err)
		}
		for off := 0; off < size; off += 1 << 20 {
			if _, err := conn.Write(data[off : off+1<<20]); err != nil {
				b.Fatal(err)
			}
		}
		conn.(interface{ CloseWrite() error }).CloseWrite()
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || string(got) != strconv.Itoa(size) {
			b.Fatalf("the program read %q bytes (%v), want %d", got, err, size)
		}
		fwd += time.Since(t0)

		t0 = time.Now()
		if _, err := c.WriteFileFrom(ctx, "big", 0o644, bytes.NewReader(data), size); err != nil {
			b.Fatal(err)
		}
		blk += time.Since(t0)
		if err := c.Remove(ctx, "big", false); err != nil {
			b.Fatal(err)
		}
	}
	mibs := func(d time.Duration) float64 { return float64(b.N) * size / (1 << 20) / d.Seconds() }
	b.ReportMetric(mibs(fwd), "forward-MiB/s")
	b.ReportMetric(mibs(blk), "bulk-MiB/s")
	b.ReportMetric(mibs(fwd)/mibs(blk), "forward/bulk")
}

// BenchmarkForwardHTTP times, in turns, an HTTP request through a port forward (a new
// connection each, so a new forwarding connection each) to a server in the sandbox, and an
// exec round trip of `true`; it reports both medians and their ratio (http/exec).
func BenchmarkForwardHTTP(b *testing.B) {
	sb := sandboxtest.StartBound(b, sandboxtest.Options{})
	c := sb.Client
	ctx := context.Background()
	if err := c.WriteFile(ctx, "www/hello.txt", []byte("hello"), 0o644); err != nil {
		b.Fatal(err)
	}
	startProgram(b, c, 3000, client.Command{Argv: []string{"python3", "-m", "http.server", "3000", "--bind", "127.0.0.1", "--directory", "/workspace/www"}})
	ln, err := c.ForwardPort(ctx, 3000, "")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	url := "http://" + ln.Addr().String() + "/hello.txt"
	get := func() {
		resp, err := hc.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !strings.EqualFold(string(body), "hello") {
			b.Fatalf("GET through the forward: %q, %v", body, err)
		}
	}
	exec := func() {
		if res, err := c.Run(ctx, "true"); err != nil || res.ExitCode != 0 {
			b.Fatalf("true: %v", err)
		}
	}
	for range 20 {
		get()
		exec()
	}
	var httpT, execT []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		get()
		httpT = append(httpT, time.Since(t0))
		t0 = time.Now()
		exec()
		execT = append(execT, time.Since(t0))
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	h, e := p50(httpT), p50(execT)
	b.ReportMetric(h, "http-p50-ms")
	b.ReportMetric(e, "exec-p50-ms")
	b.ReportMetric(h/e, "http/exec")
}
