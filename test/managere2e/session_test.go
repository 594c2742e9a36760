package managere2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// cliResult is what a fusebox CLI subprocess printed and how it exited.
type cliResult struct {
	code           int
	stdout, stderr string
}

// cli runs the fusebox CLI as a subprocess (runFusebox).
func cli(t *testing.T, ctx context.Context, args ...string) cliResult {
	t.Helper()
	code, stdout, stderr := runFusebox(t, ctx, args...)
	return cliResult{code: code, stdout: stdout, stderr: stderr}
}

// wantCLI runs the CLI and fails the test unless it exits with code.
func wantCLI(t *testing.T, ctx context.Context, code int, args ...string) cliResult {
	t.Helper()
	r := cli(t, ctx, args...)
	if r.code != code {
		t.Fatalf("fusebox %s: exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	return r
}

// TestSessionAcrossProcesses: a sandbox allocated by `fusebox run --keep` in one process is
// used from others through its session file: the Go SDK's Connect here, and the CLI's exec,
// cp, ls, ps, attach, kill, port-forward and session renew|release as further processes.
// Once released, the session is refused as a lease no longer held, and the unit is gone.
func TestSessionAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 10*time.Minute)
	mc := dialManager(t, e.Addr)
	m := e.startLocalUp(t, "manager", "--pool-size", "1")
	e.waitServing(t, m, mc)
	dir := t.TempDir()
	sess := filepath.Join(dir, "sb.json")

	r := wantCLI(t, ctx, 0, "run", "--manager", e.Addr, "--keep", "--session-out", sess, "--lease-ttl", "2m", "--",
		"sh", "-c", "echo made > /workspace/made")
	if fi, err := os.Stat(sess); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("session file: %v, mode %v; want 0600\n%s", err, fi.Mode(), r.stderr)
	}
	s, err := client.ReadSessionFile(sess)
	if err != nil {
		t.Fatal(err)
	}
	if s.AgentKey == nil || s.AgentKey.Seal != client.SealNone {
		t.Fatalf("--session-out without --session-key: agent key %+v, want it in the clear", s.AgentKey)
	}

	// This process: the Go SDK.
	a, err := client.Connect(ctx, s, client.ConnectOptions{})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if b, err := a.ReadFile(ctx, "made"); err != nil || string(b) != "made\n" {
		t.Fatalf("ReadFile through the session: %q, %v", b, err)
	}
	before, _ := a.LeaseExpires()
	after, err := a.Renew(ctx)
	if err != nil || !after.After(before) {
		t.Fatalf("Renew: %v, %v (was %v)", after, err, before)
	}
	if err := a.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}

	// Other processes: the CLI.
	if r := wantCLI(t, ctx, 0, "exec", "--session", sess, "--", "cat", "made"); r.stdout != "made\n" {
		t.Fatalf("exec: stdout %q", r.stdout)
	}
	wantCLI(t, ctx, 7, "exec", "--session", sess, "--shell", "--", "exit", "7")
	local := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(local, "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "a.txt"), []byte("alpha"), 0o644)
	os.WriteFile(filepath.Join(local, "sub", "b.txt"), []byte("beta"), 0o600)
	wantCLI(t, ctx, 0, "cp", "--session", sess, local, ":up")
	if r := wantCLI(t, ctx, 0, "ls", "--session", sess, "-R", "up"); !strings.Contains(r.stdout, "up/sub/b.txt") {
		t.Fatalf("ls -R up:\n%s", r.stdout)
	}
	down := filepath.Join(dir, "down")
	wantCLI(t, ctx, 0, "cp", "--session", sess, ":up", down)
	if b, err := os.ReadFile(filepath.Join(down, "sub", "b.txt")); err != nil || string(b) != "beta" {
		t.Fatalf("cp down: %q, %v", b, err)
	}
	if r := cli(t, ctx, "cp", "--session", sess, ":missing", down); r.code == 0 || !strings.Contains(r.stderr, "missing") {
		t.Fatalf("cp of a missing file: exit code %d, stderr %q", r.code, r.stderr)
	}

	r = wantCLI(t, ctx, 0, "exec", "--session", sess, "--detach", "--tag", "web", "--", "python3", "-u", "-c",
		"import http.server as h; print('serving', flush=True); h.HTTPServer(('127.0.0.1', 3000), h.SimpleHTTPRequestHandler).serve_forever()")
	id := strings.TrimSpace(r.stdout)
	if r := wantCLI(t, ctx, 0, "ps", "--session", sess); !regexp.MustCompile(id + `\s+running\s.*\sweb\s`).MatchString(r.stdout) {
		t.Fatalf("ps does not list %s running with tag web:\n%s", id, r.stdout)
	}
	body := portForwardGet(t, ctx, sess, "/made")
	if body != "made\n" {
		t.Fatalf("GET /made through port-forward: %q", body)
	}
	wantCLI(t, ctx, 0, "kill", "--session", sess, id)
	if r := wantCLI(t, ctx, 143, "attach", "--session", sess, id); !strings.HasPrefix(r.stdout, "serving\n") {
		t.Fatalf("attach: stdout %q", r.stdout)
	}
	if r := cli(t, ctx, "kill", "--session", sess, "--signal", "NOPE", id); r.code == 0 || !strings.Contains(r.stderr, "NOPE") {
		t.Fatalf("kill --signal NOPE: exit code %d, stderr %q", r.code, r.stderr)
	}

	if r := wantCLI(t, ctx, 0, "session", "renew", "--session", sess); !strings.Contains(r.stdout, "expires") {
		t.Fatalf("session renew: %q", r.stdout)
	}
	wantCLI(t, ctx, 0, "session", "release", "--session", sess)
	e.waitUnitGone(t, s.SandboxID)
	if r := cli(t, ctx, "exec", "--session", sess, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "no longer held") {
		t.Fatalf("exec after release: exit code %d, stderr %q; want the lease refused", r.code, r.stderr)
	}
	if _, err := client.Connect(ctx, s, client.ConnectOptions{}); !errors.Is(err, client.ErrLeaseNotHeld) {
		t.Fatalf("Connect after release: %v, want ErrLeaseNotHeld", err)
	}
	if code := m.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("manager exit code %d after SIGTERM", code)
	}
}

// portForwardGet runs `fusebox port-forward --session sess 0:3000` as a subprocess, GETs path
// through the port it prints, and interrupts it.
func portForwardGet(t *testing.T, ctx context.Context, sess, path string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, fuseboxCLI(t), "port-forward", "--session", sess, "0:3000")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	addr := make(chan string, 1)
	var log bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if m := regexp.MustCompile(`forwarding (127\.0\.0\.1:\d+) to port 3000`).FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		close(addr)
	}()
	a, ok := <-addr
	if !ok {
		cmd.Wait()
		t.Fatalf("port-forward printed no address:\n%s", log.String())
	}
	var body string
	sandboxtest.Eventually(t, pollDeadline, "an answer through port-forward", func() (bool, string) {
		resp, err := http.Get("http://" + a + path)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == 200, resp.Status
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("port-forward after SIGINT: %v", err)
	}
	return body
}

// TestSessionKeys: a session whose agent key is sealed opens only with its seal key; one
// exported without the key needs the allocation's own key; a wrong key of either kind is
// refused with ErrSessionKey before anything is dialed, and the sandbox is untouched.
func TestSessionKeys(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 10*time.Minute)
	mc := dialManager(t, e.Addr)
	m := e.startLocalUp(t, "manager", "--pool-size", "1")
	e.waitServing(t, m, mc)
	key := sandboxtest.NewKey(t)
	alloc, err := client.Allocate(ctx, e.Addr, client.AllocateOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	defer alloc.Detach()
	seal := make([]byte, client.SealKeySize)
	rand.Read(seal)
	s, err := alloc.ExportSession(client.ExportOptions{SealKey: seal})
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key.Signer())
	if err != nil {
		t.Fatal(err)
	}
	if b := mustMarshal(t, s); bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString(der))) {
		t.Fatalf("the sealed session holds the agent key in the clear:\n%s", b)
	}
	dir := t.TempDir()
	sess, keyFile, wrongFile := filepath.Join(dir, "s.json"), filepath.Join(dir, "k"), filepath.Join(dir, "wrong")
	if err := client.WriteSessionFile(sess, s); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(keyFile, seal, 0o600)
	wrong := make([]byte, client.SealKeySize)
	rand.Read(wrong)
	os.WriteFile(wrongFile, wrong, 0o600)

	if r := wantCLI(t, ctx, 0, "exec", "--session", sess, "--session-key", keyFile, "--", "echo", "sealed"); r.stdout != "sealed\n" {
		t.Fatalf("exec with the seal key: %q", r.stdout)
	}
	if r := cli(t, ctx, "exec", "--session", sess, "--session-key", wrongFile, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "does not open with this seal key") {
		t.Fatalf("exec with a wrong seal key: exit code %d, stderr %q", r.code, r.stderr)
	}
	if r := cli(t, ctx, "exec", "--session", sess, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "give the seal key") {
		t.Fatalf("exec without the seal key: exit code %d, stderr %q", r.code, r.stderr)
	}
	if _, err := client.Connect(ctx, s, client.ConnectOptions{SealKey: wrong}); !errors.Is(err, client.ErrSessionKey) {
		t.Fatalf("Connect with a wrong seal key: %v, want ErrSessionKey", err)
	}
	// A sealed key moved into another sandbox's document does not open.
	moved := *s
	moved.SandboxID += "x"
	if _, err := moved.Key(seal); !errors.Is(err, client.ErrSessionKey) {
		t.Fatalf("a sealed key in an altered document: %v, want ErrSessionKey", err)
	}

	bare, err := alloc.ExportSession(client.ExportOptions{})
	if err != nil || bare.AgentKey != nil {
		t.Fatalf("ExportSession without a seal: %+v, %v; want no agent key", bare.AgentKey, err)
	}
	if _, err := client.Connect(ctx, bare, client.ConnectOptions{Key: sandboxtest.NewKey(t)}); !errors.Is(err, client.ErrSessionKey) {
		t.Fatalf("Connect with another agent key: %v, want ErrSessionKey", err)
	}
	c, err := client.Connect(ctx, bare, client.ConnectOptions{Key: key})
	if err != nil {
		t.Fatalf("Connect with the allocation's key: %v", err)
	}
	if out := sandboxtest.Sh(t, ctx, c.Sandbox, "echo via the key"); out != "via the key\n" {
		t.Fatalf("exec through the keyless session: %q", out)
	}
	// Closing a connected allocation releases the sandbox; the allocating one then finds its
	// lease gone.
	if err := c.Close(); err != nil {
		t.Fatalf("Close of the connected allocation: %v", err)
	}
	e.waitUnitGone(t, alloc.ID)
	if _, err := alloc.Renew(ctx); !errors.Is(err, client.ErrLeaseNotHeld) {
		t.Fatalf("Renew by the allocating agent after release: %v, want ErrLeaseNotHeld", err)
	}
	alloc.Detach()
	if code := m.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("manager exit code %d after SIGTERM", code)
	}
}

func mustMarshal(t *testing.T, s *client.Session) []byte {
	t.Helper()
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
