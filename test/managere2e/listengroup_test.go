package managere2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/test/testenv"
)

// A user of the manager's --listen-group (here nobody, in group nogroup) allocates through
// the shared socket and runs a command in the sandbox: the answer names a data socket that
// user may reach, and no other user may.
func TestListenGroupUserUsesItsSandbox(t *testing.T) {
	e := newEnv(t)
	// Searchable, as the parents of a real state directory and socket are.
	if err := os.Chmod(e.base, 0o755); err != nil {
		t.Fatal(err)
	}
	e.startDaemon(t, daemonOpts{PoolSize: 1, ListenGroup: "nogroup"})
	if err := os.Chmod(filepath.Dir(e.Socket), 0o755); err != nil {
		t.Fatal(err)
	}
	// The CLI where nobody may run it.
	dir, err := os.MkdirTemp("", "fbxlg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(dir, "fusebox")
	data, err := os.ReadFile(fuseboxCLI(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cli, data, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, testDeadline)
	cmd := exec.CommandContext(ctx, cli, "run", "--manager", e.Addr, "--", "sh", "-c", "echo hello from $(id -u)")
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello from 65532") {
		t.Fatalf("fusebox run as a --listen-group user: %v\n%s", err, out)
	}
	// While a sandbox is bound to that user, its name for the data socket is the user's alone.
	cmd = exec.CommandContext(ctx, cli, "run", "--manager", e.Addr, "--", "sleep", "30")
	cmd.Dir, cmd.Env, cmd.SysProcAttr = "/", []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent"}, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	grants := filepath.Join(e.StateDir, "agents")
	var links []os.DirEntry
	for deadline := 0; deadline < 300 && len(links) == 0; deadline++ {
		links, _ = os.ReadDir(grants)
		if len(links) == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(links) != 1 {
		t.Fatalf("%d names in %s while one sandbox is bound to nobody", len(links), grants)
	}
	fi, err := os.Lstat(filepath.Join(grants, links[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 || st.Uid != 65534 {
		t.Fatalf("the granted name: mode %v, owner %d; want a socket of mode 0600 owned by 65534", fi.Mode(), st.Uid)
	}
	for _, d := range []string{e.StateDir, grants} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o711 {
			t.Fatalf("%s: %v, %v; want mode 0711 (searchable, not listable)", d, fi.Mode(), err)
		}
	}
}
