package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// refusingManager answers every allocation with one gRPC error, as a real manager refuses.
type refusingManager struct {
	managerv1.UnimplementedManagerServer
	err error
}

func (m refusingManager) Allocate(context.Context, *managerv1.AllocateRequest) (*managerv1.AllocateResponse, error) {
	return nil, m.err
}

func (m refusingManager) AllocateStream(*managerv1.AllocateRequest, managerv1.Manager_AllocateStreamServer) error {
	return m.err
}

// serveManager serves m on a unix socket in a fresh directory and returns its address.
func serveManager(t *testing.T, m managerv1.ManagerServer) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "m.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	managerv1.RegisterManagerServer(s, m)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return "unix://" + sock
}

// runCLI runs the fusebox command line as a user does and returns its exit code and stderr.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	code := cliMain(ctx, args, &stderr)
	return code, stderr.String()
}

// TestRunErrors: fusebox run names the manager's gRPC code in words instead of printing the
// raw gRPC error, and asks whether the manager runs only when nothing answered.
func TestRunErrors(t *testing.T) {
	const localHint = "is `fusebox local up` running?"
	policy := "permission denied: service account agents/bot may not use template \"gpu\" (allowed: default)"
	for _, tc := range []struct {
		name     string
		manager  func(t *testing.T) string
		want     []string
		wantHint bool
	}{
		{"policy denial", func(t *testing.T) string {
			return serveManager(t, refusingManager{err: status.Error(codes.PermissionDenied, policy)})
		}, []string{"allocating sandbox: " + policy}, false},
		{"unenforceable egress", func(t *testing.T) string {
			return serveManager(t, refusingManager{err: status.Error(codes.FailedPrecondition,
				"not supported by this manager's allocator: egress allowlist pypi.org:443: the process allocator cannot enforce egress")})
		}, []string{"allocating sandbox: failed precondition: not supported by this manager's allocator"}, false},
		{"allocator failure", func(t *testing.T) string {
			return serveManager(t, refusingManager{err: status.Error(codes.Unavailable, "allocator failed: runsc exited 1")})
		}, []string{"allocating sandbox: unavailable: allocator failed: runsc exited 1"}, false},
		{"no socket", func(t *testing.T) string {
			return "unix://" + filepath.Join(t.TempDir(), "none.sock")
		}, []string{"allocating sandbox: unavailable: ", "no such file or directory"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runCLI(t, "run", "-q", "--manager", tc.manager(t), "--", "true")
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr:\n%s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if strings.Contains(stderr, "rpc error") || strings.Contains(stderr, "desc =") {
				t.Errorf("stderr holds the raw gRPC error:\n%s", stderr)
			}
			if got := strings.Contains(stderr, localHint); got != tc.wantHint {
				t.Errorf("hint %q given: %v, want %v:\n%s", localHint, got, tc.wantHint, stderr)
			}
		})
	}
}

// TestRunWithoutDashes: a command given without -- is parsed as fusebox run's flags; the error
// says to put it after --.
func TestRunWithoutDashes(t *testing.T) {
	code, stderr := runCLI(t, "run", "ls", "-la")
	if code != 1 || !strings.Contains(stderr, "unknown shorthand flag") || !strings.Contains(stderr, "put the command to run after --: fusebox run -- ls -la") {
		t.Errorf("exit code %d, stderr:\n%s\nwant the flag error and a hint to put the command after --", code, stderr)
	}
	code, stderr = runCLI(t, "run", "--timeout", "soon", "--", "true")
	if code != 1 || strings.Contains(stderr, "after --") {
		t.Errorf("a bad flag value got the -- hint (exit code %d):\n%s", code, stderr)
	}
}

// TestParsePortForward: --port takes LOCAL:REMOTE; anything else is refused, before any
// sandbox is allocated, with the form to use.
func TestParsePortForward(t *testing.T) {
	for _, tc := range []struct {
		spec, local string
		remote      int
		err         string
	}{
		{"8000:3000", "127.0.0.1:8000", 3000, ""},
		{"0:80", "127.0.0.1:0", 80, ""},
		{"3000", "", 0, "want LOCAL:REMOTE"},
		{"8000:0", "", 0, "port \"0\" in the sandbox: want 1-65535"},
		{"8000:65536", "", 0, "port \"65536\" in the sandbox: want 1-65535"},
		{"x:3000", "", 0, "local port \"x\""},
		{"70000:3000", "", 0, "local port \"70000\""},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			pf, err := parsePortForward(tc.spec)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error containing %q", pf, err, tc.err)
				}
				return
			}
			if err != nil || pf.local != tc.local || pf.remote != tc.remote {
				t.Fatalf("got %+v, %v; want %s to port %d", pf, err, tc.local, tc.remote)
			}
		})
	}
	code, stderr := runCLI(t, "run", "-q", "--manager", "unix:///nonexistent/m.sock", "--port", "8000:65536", "--", "true")
	if code != 1 || !strings.Contains(stderr, "want 1-65535") || strings.Contains(stderr, "allocating") {
		t.Fatalf("a bad --port: exit code %d, stderr:\n%s\nwant the port refused before allocating", code, stderr)
	}
}

// TestRunPortForward: with --port, a server the command runs in a real sandbox (no network
// beyond its loopback) answers an HTTP request made to the local port while the command runs.
func TestRunPortForward(t *testing.T) {
	m := sandboxtest.StartManager(t, sandboxtest.ManagerOptions{PoolSize: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// Serves one request, then exits: the command ends once the test has its answer.
	const server = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = b'hello from the sandbox ' + self.path.encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
http.server.HTTPServer(('127.0.0.1', 3000), H).handle_request()
`
	type result struct {
		code   int
		stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stderr := runCLI(t, "run", "--manager", m.Addr, "--port", fmt.Sprintf("%d:3000", local), "--", "python3", "-c", server)
		done <- result{code, stderr}
	}()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	var body string
	sandboxtest.Eventually(t, time.Minute, "an answer through --port", func() (bool, string) {
		select {
		case r := <-done:
			t.Fatalf("fusebox run ended (exit code %d) before an answer came:\n%s", r.code, r.stderr)
		default:
		}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/x", local))
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, err.Error()
		}
		body = string(b)
		return true, ""
	})
	if body != "hello from the sandbox /x" {
		t.Fatalf("answer %q", body)
	}
	select {
	case r := <-done:
		if r.code != 0 {
			t.Fatalf("fusebox run: exit code %d:\n%s", r.code, r.stderr)
		}
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("fusebox run did not end after its server did")
	}
}
