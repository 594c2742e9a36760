package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// bulkServer starts an in-process server with opts and returns an initialised agent's client
// with copts, the workspace directory, and the count of data connections accepted.
func bulkServer(t *testing.T, opts Options, copts client.Options) (*client.Sandbox, string, *countingListener) {
	t.Helper()
	var ln *countingListener
	opts.IdleTTL = time.Minute
	initAddr, dataAddr, dir, _ := startInProcessIn(t, opts, func(l net.Listener) net.Listener {
		ln = &countingListener{Listener: l}
		return ln
	})
	key, _ := client.NewKey()
	pub, err := sfuse.Initialize(context.Background(), initAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := client.Dial(dataAddr, pub.SandboxKey, key, copts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb, dir, ln
}

func randomBytes(n int, seed byte) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// Large files move the same way over a bulk connection (the default), over the gRPC streams
// (client.Options.NoBulk), and from a server that offers no bulk transfers (the client falls
// back): the same bytes, the same sizes, and two transfers on one bulk connection.
func TestBulkTransfersMatchTheStreams(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     Options
		copts    client.Options
		dataConn int32 // connections accepted: gRPC's, and the bulk one reused
	}{
		{"bulk", Options{}, client.Options{}, 2},
		{"client without bulk", Options{}, client.Options{NoBulk: true}, 1},
		{"server without bulk", Options{NoBulk: true}, client.Options{}, 2}, // the refused handshake
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, dir, ln := bulkServer(t, tc.opts, tc.copts)
			ctx := context.Background()
			for i, size := range []int{0, 1, 1<<20 + 5, 5 << 20} {
				data := randomBytes(size, byte(i))
				name := filepath.Join("d", "f"+string(rune('a'+i)))
				n, err := sb.WriteFileFrom(ctx, name, 0o640, bytes.NewReader(data), int64(size))
				if err != nil || n != int64(size) {
					t.Fatalf("WriteFileFrom(%d bytes) = %d, %v", size, n, err)
				}
				if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%s on disk: %d bytes, %v; want the %d written", name, len(got), err, size)
				}
				if fi, _ := os.Stat(filepath.Join(dir, name)); fi.Mode().Perm() != 0o640 {
					t.Errorf("%s mode %v, want 0640", name, fi.Mode().Perm())
				}
				var got bytes.Buffer
				if err := sb.ReadFileTo(ctx, name, &got); err != nil || !bytes.Equal(got.Bytes(), data) {
					t.Fatalf("ReadFileTo(%s) = %d bytes, %v; want the %d written", name, got.Len(), err, size)
				}
			}
			if n := ln.n.Load(); n != tc.dataConn {
				t.Errorf("%d data connections accepted, want %d", n, tc.dataConn)
			}
		})
	}
}

// A bulk transfer fails as the gRPC stream would, with the same status code, and an upload the
// sandbox refuses stops reading its source.
func TestBulkErrors(t *testing.T) {
	for _, copts := range []client.Options{{}, {NoBulk: true}} {
		t.Run(map[bool]string{false: "bulk", true: "grpc"}[copts.NoBulk], func(t *testing.T) {
			sb, dir, _ := bulkServer(t, Options{}, copts)
			ctx := context.Background()
			src := &countingReader{left: 1 << 30}
			_, err := sb.WriteFileFrom(ctx, "../escape", 0o644, src, -1)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("escaping write: %v, want PermissionDenied", err)
			}
			if src.read > 256<<20 {
				t.Errorf("a refused upload read %d MiB of its source", src.read>>20)
			}
			if _, err := sb.WriteFileFrom(ctx, "short", 0o644, bytes.NewReader(make([]byte, 10)), 11); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("stream shorter than its size: %v, want InvalidArgument", err)
			}
			if _, err := sb.WriteFileFrom(ctx, "long", 0o644, bytes.NewReader(make([]byte, 3<<20)), 10); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("stream longer than its size: %v, want InvalidArgument", err)
			}
			if err := sb.ReadFileTo(ctx, "missing", io.Discard); status.Code(err) != codes.NotFound {
				t.Fatalf("reading a missing file: %v, want NotFound", err)
			}
			if err := sb.ReadFileTo(ctx, "/etc/passwd", io.Discard); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("reading outside the workspace: %v, want PermissionDenied", err)
			}
			os.Mkdir(filepath.Join(dir, "sub"), 0o755)
			if err := sb.ReadFileTo(ctx, "sub", io.Discard); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("reading a directory: %v, want FailedPrecondition", err)
			}
			// After all that, the next transfer works, and nothing was left behind.
			if _, err := sb.WriteFileFrom(ctx, "ok", 0o644, bytes.NewReader([]byte("fine")), 4); err != nil {
				t.Fatal(err)
			}
			assertOnlyFiles(t, dir, "ok", "sub")
		})
	}
}

// An upload cancelled half-way leaves no file and no temporary file, and the client says why.
func TestBulkCancelledUploadLeavesNothing(t *testing.T) {
	for _, copts := range []client.Options{{}, {NoBulk: true}} {
		t.Run(map[bool]string{false: "bulk", true: "grpc"}[copts.NoBulk], func(t *testing.T) {
			sb, dir, _ := bulkServer(t, Options{}, copts)
			ctx, cancel := context.WithCancel(context.Background())
			src := &countingReader{left: 64 << 20, after: 3 << 20, do: cancel}
			_, err := sb.WriteFileFrom(ctx, "big", 0o644, src, 64<<20)
			if status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled upload: %v, want Canceled", err)
			}
			// The server notices the broken transfer on its own time.
			deadline := time.Now().Add(10 * time.Second)
			for {
				ents, _ := os.ReadDir(dir)
				if len(ents) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("left behind: %v", names(ents))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := sb.WriteFileFrom(context.Background(), "next", 0o644, bytes.NewReader([]byte("x")), 1); err != nil {
				t.Fatalf("the upload after: %v", err)
			}
		})
	}
}

// countingReader yields left zero bytes, counting what was read, and calls do once after
// after bytes.
type countingReader struct {
	left, read, after int64
	do                func()
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.left))
	clear(p[:n])
	r.left -= int64(n)
	r.read += int64(n)
	if r.do != nil && r.read >= r.after {
		r.do()
		r.do = nil
	}
	return n, nil
}

func assertOnlyFiles(t *testing.T, dir string, want ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := names(ents)
	if len(got) != len(want) {
		t.Fatalf("workspace holds %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("workspace holds %v, want %v", got, want)
		}
	}
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
