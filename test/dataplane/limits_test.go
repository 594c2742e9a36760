package dataplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// The tests in this file attack the sandbox's limits and its server the way untrusted code
// can, with the limits of the local allocator's default template, and check that each attack
// fails inside the sandbox (an error the agent sees) while the server stays alive and answers
// the next call.

// defaultBundle is sandboxtest.Options with the production default template's limits.
func defaultBundle() sandboxtest.Options {
	return sandboxtest.Options{Bundle: runscalloc.DefaultTemplate().Bundle}
}

// alive checks that the server still answers: a file call and a command.
func alive(t *testing.T, ctx context.Context, c *client.Sandbox, after string) {
	t.Helper()
	if _, err := c.Stat(ctx, ".", false); err != nil {
		t.Fatalf("after %s: the server does not answer Stat: %v", after, err)
	}
	if got := sandboxtest.Sh(t, ctx, c, "echo alive"); got != "alive\n" {
		t.Fatalf("after %s: echo printed %q", after, got)
	}
}

// run runs a command that is expected to fail, and returns its result.
func run(t *testing.T, ctx context.Context, c *client.Sandbox, cmd client.Command) *client.Result {
	t.Helper()
	res, err := c.Exec(ctx, cmd)
	if err != nil {
		t.Fatalf("exec %q %q: %v", cmd.Argv, cmd.Script, err)
	}
	return res
}

// TestCommandsCannotKillServer: untrusted code's `kill -9 1` (and every other way of reaching
// the server's process) is refused, and the server keeps serving.
func TestCommandsCannotKillServer(t *testing.T) {
	b := sandboxtest.StartBound(t, defaultBundle())
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	if got := strings.TrimSpace(sandboxtest.Sh(t, ctx, c, "id -u; id -g; id -G")); got != "65532\n65532\n65532" {
		t.Errorf("commands run as %q, want user and group 65532 and no other group", got)
	}
	if got := strings.TrimSpace(sandboxtest.Sh(t, ctx, c, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status | awk '{print $2}' | sort -u | head -3")); !strings.HasPrefix(got, "0000000000000000") {
		t.Errorf("commands hold capabilities: %q", got)
	}
	for _, sig := range []string{"KILL", "TERM", "STOP", "INT", "SEGV"} {
		res := run(t, ctx, c, client.Command{Script: "kill -" + sig + " 1"})
		if res.ExitCode == 0 {
			t.Errorf("kill -%s 1 succeeded", sig)
		} else if !strings.Contains(string(res.Stderr), "not permitted") {
			t.Errorf("kill -%s 1: exit %d, stderr %q; want EPERM", sig, res.ExitCode, res.Stderr)
		}
		alive(t, ctx, c, "kill -"+sig+" 1")
	}
	// kill -1 signals everything the sender may signal: the commands, never the server.
	run(t, ctx, c, client.Command{Script: "kill -9 -1"})
	alive(t, ctx, c, "kill -9 -1")
	// The server's memory, environment and descriptors are not the commands' to read.
	for _, p := range []string{"/proc/1/environ", "/proc/1/mem", "/proc/1/fd/0"} {
		if res := run(t, ctx, c, client.Command{Argv: []string{"cat", p}}); res.ExitCode == 0 {
			t.Errorf("cat %s succeeded: %q", p, res.Stdout)
		}
	}
	if res := run(t, ctx, c, client.Command{Script: "ls /proc/1/fd"}); res.ExitCode == 0 {
		t.Errorf("listing the server's descriptors succeeded: %q", res.Stdout)
	}
	alive(t, ctx, c, "reading the server's /proc entries")
	// The workspace is the commands' user's, also for files the server writes.
	if err := c.WriteFile(ctx, "by-server.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(sandboxtest.Sh(t, ctx, c, "stat -c %u:%g /workspace /workspace/by-server.txt; rm by-server.txt && echo removed")); got != "65532:65532\n65532:65532\nremoved" {
		t.Errorf("workspace ownership: %q", got)
	}
}

// TestSocketDirectoryHoldsSocketsOnly: the socket directory is a bind of a host directory,
// and nothing untrusted code tries lands there (files, directories, FIFOs, sockets, links),
// nor can it replace or remove the server's data socket.
func TestSocketDirectoryHoldsSocketsOnly(t *testing.T) {
	b := sandboxtest.StartBound(t, defaultBundle())
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	hostDir := filepath.Dir(socketPath(b.DataAddr))
	alive(t, ctx, c, "init") // the init listener is closed by the first call's end
	before := hostEntries(t, hostDir)
	if !slices.Equal(before, []string{"data.sock"}) {
		t.Fatalf("host socket directory after init holds %q, want only data.sock", before)
	}
	attempts := map[string]string{
		"write a file":         "echo 20MiB > /run/fusebox/junk",
		"fill the disk":        "head -c 1048576 /dev/zero > /run/fusebox/big",
		"make a directory":     "mkdir /run/fusebox/d",
		"make a FIFO":          "mkfifo /run/fusebox/fifo",
		"bind a socket":        `python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("/run/fusebox/evil.sock")'`,
		"make a symlink":       "ln -s / /run/fusebox/root",
		"make a hard link":     "ln /run/fusebox/data.sock /run/fusebox/hard",
		"replace data.sock":    "ln -sf /run/fusebox/../../tmp /run/fusebox/data.sock",
		"move data.sock":       "mv /run/fusebox/data.sock /run/fusebox/old.sock",
		"remove data.sock":     "rm -f /run/fusebox/data.sock && test ! -e /run/fusebox/data.sock",
		"chmod the directory":  "chmod 777 /run/fusebox",
		"chmod data.sock":      "chmod 666 /run/fusebox/data.sock",
		"connect to data.sock": `python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect("/run/fusebox/data.sock")'`,
	}
	for name, script := range attempts {
		if res := run(t, ctx, c, client.Command{Script: script}); res.ExitCode == 0 {
			t.Errorf("%s (%s): succeeded", name, script)
		}
	}
	if after := hostEntries(t, hostDir); !slices.Equal(after, before) {
		t.Errorf("host socket directory after the attempts holds %q, want %q", after, before)
	}
	if fi, err := os.Lstat(socketPath(b.DataAddr)); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("data.sock on the host: %v %v, want the server's socket", fi, err)
	}
	alive(t, ctx, c, "the socket directory attempts")
	// A new connection to the data socket still reaches this sandbox's server.
	c2, err := client.Dial(b.DataAddr, b.SandboxKey, b.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	alive(t, ctx, c2, "the socket directory attempts (a new connection)")
}

// hostEntries lists a host directory.
func hostEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// othersScan prints, using shell builtins only, the stat line of every process but the
// server (PID 1), the scanning shell and sleep processes.
const othersScan = `
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  if [ "$p" = 1 ] || [ "$p" = "$$" ] || [ "$p" = "$BASHPID" ]; then continue; fi
  IFS= read -r st < "$d/stat" 2>/dev/null || continue
  case "$st" in *"(sleep) "*) continue;; esac
  echo "$st"
done
`

// TestProcessLimitFailsInside: more processes than the template allows, and a fork bomb, fail
// with EAGAIN inside the sandbox; the sandbox and its server live on.
func TestProcessLimitFailsInside(t *testing.T) {
	b := sandboxtest.StartBound(t, defaultBundle())
	ctx := testenv.Context(t, 4*time.Minute)
	c := b.Client
	limit := runscalloc.DefaultProcessLimit
	// 300 processes at once were enough to kill a sandbox whose host pids limit was 512.
	res := run(t, ctx, c, client.Command{Argv: []string{"sh", "-c",
		"i=0; while [ $i -lt 300 ]; do sleep 600 & i=$((i+1)); done; echo started $i"},
		Timeout: time.Minute})
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "started 300" {
		t.Fatalf("300 processes: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	alive(t, ctx, c, "300 processes")
	// Past the limit, fork fails inside (dash reports "Cannot fork").
	res = run(t, ctx, c, client.Command{Argv: []string{"sh", "-c", fmt.Sprintf(
		"i=0; while [ $i -lt %d ]; do sleep 600 & i=$((i+1)); done; echo started $i", 2*limit)},
		Timeout: time.Minute})
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "fork") {
		t.Errorf("%d processes: exit %d, stdout %q, stderr %q; want a failed fork", 2*limit, res.ExitCode, res.Stdout, res.Stderr)
	}
	alive(t, ctx, c, fmt.Sprintf("%d processes", 2*limit))
	// A fork bomb, stopped by the exec's timeout, which kills its process group.
	res = run(t, ctx, c, client.Command{Script: "bomb() { bomb | bomb & }; bomb; sleep 5", Timeout: 8 * time.Second})
	t.Logf("fork bomb: exit %d, timed out %v, stderr %.200q", res.ExitCode, res.TimedOut, res.Stderr)
	alive(t, ctx, c, "a fork bomb")
	// Nothing of the bomb outlives its exec: members forked while its group was being killed
	// escaped that kill, and kept the process limit used up after the exec had returned.
	if left := sandboxtest.Sh(t, ctx, c, othersScan); left != "" {
		t.Errorf("processes left after the fork bomb's exec returned:\n%s", left)
	}
	// The limit holds for every command together, and frees up as processes end.
	sandboxtest.Sh(t, ctx, c, "pkill sleep; true")
	waitNoLeftovers(t, ctx, c)
	res = run(t, ctx, c, client.Command{Argv: []string{"sh", "-c",
		"i=0; while [ $i -lt 300 ]; do sleep 600 & i=$((i+1)); done; echo started $i"}, Timeout: time.Minute})
	if res.ExitCode != 0 {
		t.Errorf("300 processes after the others ended: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	alive(t, ctx, c, "the process limit tests")
}

// TestMemoryFilesystemsFullFailInside: filling the workspace or /tmp, which live in the
// sandbox's memory, fails with ENOSPC inside (a command's error, and ResourceExhausted from
// the file API) well before the memory limit, and the sandbox lives on.
func TestMemoryFilesystemsFullFailInside(t *testing.T) {
	b := sandboxtest.StartBound(t, defaultBundle())
	ctx := testenv.Context(t, 4*time.Minute)
	c := b.Client
	tmpl := runscalloc.DefaultTemplate().Bundle
	// Twice the memory limit: without a cap this got the sandbox killed by the host.
	for _, dir := range []string{"/workspace", "/tmp"} {
		res := run(t, ctx, c, client.Command{Script: fmt.Sprintf("head -c %d /dev/zero > %s/fill", 2*tmpl.MemoryLimitBytes, dir),
			Timeout: 2 * time.Minute})
		if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
			t.Errorf("filling %s: exit %d, stderr %q; want ENOSPC", dir, res.ExitCode, res.Stderr)
		}
		alive(t, ctx, c, "filling "+dir)
	}
	got := strings.Fields(sandboxtest.Sh(t, ctx, c, "stat -c %s /workspace/fill /tmp/fill"))
	if want := []string{fmt.Sprint(tmpl.WorkspaceSizeBytes), fmt.Sprint(tmpl.TmpSizeBytes)}; !slices.Equal(got, want) {
		t.Errorf("sizes of the filled files: %q, want the caps %q", got, want)
	}
	// The file API reports the full workspace as ResourceExhausted.
	err := c.WriteFile(ctx, "more", make([]byte, 1<<20), 0o644)
	wantCode(t, "WriteFile into a full workspace", err, codes.ResourceExhausted)
	// Freeing space makes it usable again.
	sandboxtest.Sh(t, ctx, c, "rm /workspace/fill /tmp/fill")
	if err := c.WriteFile(ctx, "more", make([]byte, 1<<20), 0o644); err != nil {
		t.Errorf("WriteFile after freeing space: %v", err)
	}
	alive(t, ctx, c, "the full filesystems")
}
