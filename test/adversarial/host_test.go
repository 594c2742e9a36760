package adversarial

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// hostUserAttacks connect, as another user of the host (nobody), to the sockets of the
// manager and its sandboxes, which only root may use.
func hostUserAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "host users")
	ctx := g.ctx
	allowed := newLoopbackServer(t, "tcp4", "127.0.0.1:0", "allowed")
	l := s.allocate(t, ctx, allowed.hostPort())
	sockets := []struct{ name, path string }{
		{"the manager's socket", s.m.Socket},
		{"a bound sandbox's data socket", strings.TrimPrefix(l.Endpoint, "unix://")},
		{"a bound sandbox's egress proxy", filepath.Join(s.m.StateDir, "sandboxes", l.ID, "sock", "egress.sock")},
		{"a warm unit's init socket", filepath.Join(s.m.StateDir, "sandboxes", s.readyUnit(t, ctx), "sock", "init.sock")},
	}
	asNobody := func(path string) (string, error) {
		cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-c", pyConnect, "unix", "stream", path)
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	// The control: nobody does connect to a socket open to everyone.
	open := listenOpen(t)
	if got, err := asNobody(open); err != nil || !strings.HasPrefix(got, "ESCAPED connected") {
		t.Fatalf("control: python3 as nobody to a socket open to all: %v, %q", err, got)
	}
	for _, sock := range sockets {
		g.attack("connect to "+sock.name+" as nobody", "AF_UNIX connect to "+sock.path+" as uid 65534", func(t *testing.T) verdict {
			got, err := asNobody(sock.path)
			switch {
			case strings.Contains(got, "ESCAPED"):
				return escapedf("%s", got)
			case err == nil && strings.HasPrefix(got, "REFUSED EACCES"):
				return refusedf("%s", got)
			}
			t.Fatalf("python3 as nobody: %v, %q; want REFUSED EACCES or ESCAPED", err, got)
			return verdict{}
		})
	}
	if err := s.unharmed(ctx, l); err != nil {
		t.Errorf("after the host users' attacks: %v", err)
	}
}

// listenOpen listens on a unix socket that every user may connect to, in a directory every
// user may search, until the test ends, and returns its path.
func listenOpen(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fbxadv-open-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "open.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, p := range []string{dir, path} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return path
}
