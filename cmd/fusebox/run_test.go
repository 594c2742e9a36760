package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
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
