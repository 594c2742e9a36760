package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fusebox-dev/fusebox/client"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// The sandbox's root filesystem is read-only except /tmp, /workspace and /run/fusebox, so
// these are where an escaping write could land. Every name an attempt would create outside
// the workspace contains "pwned" or "stolen".
const outsideScan = `
ls -A / | grep -e pwned -e stolen
find /tmp /run /dev/shm \( -name '*pwned*' -o -name '*stolen*' \) -print 2>/dev/null
exit 0
`

// escapeSetup builds, through a command (commands may do anything inside the sandbox), a
// workspace full of symlinks that lead out of it, and a secret outside it.
const escapeSetup = `set -e
echo TOPSECRET > /tmp/fusebox-secret
cd /workspace
mkdir -p esc sub
ln -s /tmp esc/tmplink
ln -s / esc/rootlink
ln -s ../../tmp esc/rellink
ln -s ../tmp uplink
ln -s link2 esc/link1
ln -s /tmp esc/link2
ln -s /tmp/fusebox-secret esc/secretlink
ln -s /etc/passwd esc/passwdlink
ln -s /proc/self/root/tmp esc/proclink
ln -s /tmp/pwned-dangling esc/dangling
echo victim > victim
`

func TestEscapeAttemptsRefused(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 3*time.Minute)
	c, rpc := b.Client, b.Client.RPC()
	data := []byte("pwned\n")
	sandboxtest.Sh(t, ctx, c, escapeSetup)
	// A link whose target is lexically inside the workspace but runs through an escaping
	// link: creating it is allowed (the check is lexical); following it is not.
	if err := c.Symlink(ctx, "esc/tmplink/fusebox-secret", "innerlink"); err != nil {
		t.Fatalf("creating a lexically contained link: %v", err)
	}
	tmpBefore := lsA(t, ctx, c, "/tmp")

	attempts := escapeAttempts(ctx, c)
	if len(attempts) < 30 {
		t.Fatalf("only %d attempts", len(attempts))
	}
	for _, a := range attempts {
		err := a.do()
		if codeOf(err) != a.want {
			t.Errorf("%s: got %v (%v), want %v", a.name, codeOf(err), err, a.want)
		}
	}

	// A batch with one escaping entry is rejected whole: its valid file is not written.
	_, err := rpc.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{
		Files:    []*sandboxv1.FileWrite{{Path: "batch-ok.txt", Data: data}, {Path: "../pwned-batch", Data: data}},
		Symlinks: []*sandboxv1.SymlinkSpec{{Target: "batch-ok.txt", Path: "batch-ok-link"}},
	})
	wantCode(t, "mixed batch", err, codes.PermissionDenied)
	for _, p := range []string{"batch-ok.txt", "batch-ok-link"} {
		if _, err := c.Stat(ctx, p, false); codeOf(err) != codes.NotFound {
			t.Errorf("%s after a rejected batch: Stat = %v, want NotFound", p, err)
		}
	}

	// Operations that touch escaping links without following them are fine, and leak nothing.
	if fi, err := c.Stat(ctx, "esc/tmplink", false); err != nil || fi.GetType() != sandboxv1.FileType_FILE_TYPE_SYMLINK || fi.GetSymlinkTarget() != "/tmp" {
		t.Errorf("lstat of an escaping link: %v %v, want a symlink to /tmp", fi, err)
	}
	files, _, err := c.ReadFiles(ctx, "**")
	if err != nil {
		t.Fatalf("ReadFiles(**): %v", err)
	}
	for p, d := range files {
		if bytes.Contains(d, []byte("TOPSECRET")) || strings.HasPrefix(p, "esc/") && p != "esc/dangling" {
			t.Errorf("ReadFiles(**) returned %s (%q): it followed an escaping link", p, d)
		}
	}
	gr, err := c.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "TOPSECRET|root:"})
	if err != nil || len(gr.GetMatches()) > 0 {
		t.Errorf("grep over the workspace: %v %v, want no match (escaping links are not followed)", gr.GetMatches(), err)
	}
	found, err := c.Find(ctx, &sandboxv1.FindRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range found.GetEntries() {
		if strings.Count(e.GetPath(), "/") > 1 {
			t.Errorf("find over the workspace descended through a link: %s", e.GetPath())
		}
	}
	// Writing at the path of a dangling link replaces the link; it never creates its target.
	if err := c.WriteFile(ctx, "esc/dangling", data, 0o644); err != nil && codeOf(err) != codes.PermissionDenied {
		t.Errorf("write over a dangling link: %v", err)
	}
	// Removing and renaming escaping links acts on the links only.
	if err := c.Rename(ctx, "esc/link2", "moved-link", false); err != nil {
		t.Errorf("renaming a link: %v", err)
	}
	if err := c.Remove(ctx, "esc/tmplink", false); err != nil {
		t.Errorf("removing a link: %v", err)
	}
	if err := c.Remove(ctx, "esc/rootlink", true); err != nil {
		t.Errorf("removing a link recursively: %v", err)
	}

	assertNothingOutside(t, ctx, b, tmpBefore)
	if got := sandboxtest.Sh(t, ctx, c, "cat /tmp/fusebox-secret"); got != "TOPSECRET\n" {
		t.Errorf("/tmp/fusebox-secret now holds %q", got)
	}
}

type escapeAttempt struct {
	name string
	do   func() error
	want codes.Code
}

// escapeAttempts are the attempts to leave the workspace, for a workspace prepared with
// escapeSetup.
func escapeAttempts(ctx context.Context, c *client.Sandbox) []escapeAttempt {
	rpc := c.RPC()
	data := []byte("pwned\n")
	write := func(p string) func() error {
		return func() error { return c.WriteFile(ctx, p, data, 0o644) }
	}
	stream := func(p string) func() error {
		return func() error {
			_, err := c.WriteFileFrom(ctx, p, 0o644, bytes.NewReader(data), int64(len(data)))
			return err
		}
	}
	batch := func(req *sandboxv1.WriteFilesRequest) func() error {
		return func() error { _, err := rpc.WriteFiles(ctx, req); return err }
	}
	readFiles := func(paths ...string) func() error {
		return func() error { _, _, err := c.ReadFiles(ctx, paths...); return err }
	}
	readFile := func(p string) func() error {
		return func() error { _, err := c.ReadFile(ctx, p); return err }
	}
	stat := func(p string, follow bool) func() error {
		return func() error { _, err := c.Stat(ctx, p, follow); return err }
	}
	PD, IA := codes.PermissionDenied, codes.InvalidArgument
	long := strings.Repeat("a", 300)
	huge := strings.Repeat("d/", 2500) + "pwned"

	return []escapeAttempt{
		// Lexical escapes and malformed paths.
		{"write ../pwned", write("../pwned"), PD},
		{"write /tmp/pwned", write("/tmp/pwned"), PD},
		{"write /workspace/../tmp/pwned", write("/workspace/../tmp/pwned"), PD},
		{"write a/../../tmp/pwned", write("a/../../tmp/pwned"), PD},
		{"write NUL byte", write("pw\x00ned"), IA},
		{"write 300-byte name", write(long), IA},
		{"write 5000-byte path", write(huge), IA},
		{"write /proc/self/root/tmp/pwned", write("/proc/self/root/tmp/pwned"), PD},
		{"write /proc/1/root/tmp/pwned", write("/proc/1/root/tmp/pwned"), PD},
		{"write /workspace-pwned (mount prefix)", write("/workspace-pwned"), PD},
		// Writes through symlinks made by a command.
		{"write via link to /tmp", write("esc/tmplink/pwned"), PD},
		{"write via link to /", write("esc/rootlink/tmp/pwned"), PD},
		{"write via ../../tmp link", write("esc/rellink/pwned"), PD},
		{"write via top-level ../tmp link", write("uplink/pwned"), PD},
		{"write via link chain", write("esc/link1/pwned"), PD},
		{"write via /proc/self/root link", write("esc/proclink/pwned"), PD},
		{"write nested under link (parents created)", write("esc/tmplink/pwned-d/x/pwned"), PD},
		{"stream via link to /tmp", stream("esc/tmplink/pwned-stream"), PD},
		{"stream ../pwned", stream("../pwned-stream"), PD},
		{"stream via link chain", stream("esc/link1/sub/pwned-stream"), PD},
		// Directory operations.
		{"mkdir via link", func() error { return c.Mkdir(ctx, "esc/tmplink/pwned-dir", false) }, PD},
		{"mkdir -p via link to /", func() error { return c.Mkdir(ctx, "esc/rootlink/tmp/pwned-dir/x", true) }, PD},
		{"mkdir ../pwned-dir", func() error { return c.Mkdir(ctx, "../pwned-dir", true) }, PD},
		{"mkdir /tmp/pwned-dir", func() error { return c.Mkdir(ctx, "/tmp/pwned-dir", false) }, PD},
		{"batch mkdir via link chain", batch(&sandboxv1.WriteFilesRequest{Mkdirs: []string{"esc/link1/pwned-dir"}}), PD},
		{"batch mkdir ../", batch(&sandboxv1.WriteFilesRequest{Mkdirs: []string{"../pwned-dir"}}), PD},
		// Rename and remove.
		{"rename to ../x", func() error { return c.Rename(ctx, "victim", "../pwned-renamed", false) }, PD},
		{"rename to /tmp", func() error { return c.Rename(ctx, "victim", "/tmp/pwned-renamed", false) }, PD},
		{"rename into link to /tmp", func() error { return c.Rename(ctx, "victim", "esc/tmplink/pwned-renamed", false) }, PD},
		{"rename a file out of /tmp in", func() error { return c.Rename(ctx, "esc/tmplink/fusebox-secret", "stolen", false) }, PD},
		{"remove via link", func() error { return c.Remove(ctx, "esc/tmplink/fusebox-secret", false) }, PD},
		{"remove -r via link to /", func() error { return c.Remove(ctx, "esc/rootlink/tmp", true) }, PD},
		{"remove /tmp file", func() error { return c.Remove(ctx, "/tmp/fusebox-secret", false) }, PD},
		{"remove ../", func() error { return c.Remove(ctx, "..", true) }, PD},
		// Symlinks whose targets leave the workspace.
		{"symlink absolute target", func() error { return c.Symlink(ctx, "/tmp", "pwned-abs") }, PD},
		{"symlink ../tmp", func() error { return c.Symlink(ctx, "../tmp", "pwned-rel") }, PD},
		{"symlink ../../tmp from sub", func() error { return c.Symlink(ctx, "../../tmp", "sub/pwned-rel") }, PD},
		{"symlink sub/../../tmp", func() error { return c.Symlink(ctx, "sub/../../tmp", "pwned-rel2") }, PD},
		{"symlink created inside link to /tmp", func() error { return c.Symlink(ctx, "x", "esc/tmplink/pwned-link") }, PD},
		{"symlink NUL target", func() error { return c.Symlink(ctx, "a\x00b", "pwned-nul") }, IA},
		{"batch symlink absolute", batch(&sandboxv1.WriteFilesRequest{Symlinks: []*sandboxv1.SymlinkSpec{{Target: "/tmp", Path: "pwned-batch"}}}), PD},
		{"batch symlink ../../../tmp", batch(&sandboxv1.WriteFilesRequest{Symlinks: []*sandboxv1.SymlinkSpec{{Target: "../../../tmp", Path: "a/b/pwned"}}}), PD},
		{"batch symlink inside link", batch(&sandboxv1.WriteFilesRequest{Symlinks: []*sandboxv1.SymlinkSpec{{Target: "x", Path: "esc/tmplink/pwned-batch"}}}), PD},
		{"batch file via link", batch(&sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: "esc/link1/pwned", Data: data}}}), PD},
		// Reads of what lies outside.
		{"readfiles via link", readFiles("esc/tmplink/fusebox-secret"), PD},
		{"readfiles link to secret", readFiles("esc/secretlink"), PD},
		{"readfiles link to /etc/passwd", readFiles("esc/passwdlink"), PD},
		{"readfiles glob via link", readFiles("esc/tmplink/*"), PD},
		{"readfiles glob via link chain", readFiles("esc/link1/**"), PD},
		{"readfiles /tmp path", readFiles("/tmp/fusebox-secret"), PD},
		{"readfiles inner link", readFiles("innerlink"), PD},
		{"raw ReadFiles batch link to secret", func() error {
			_, err := rpc.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"esc/secretlink"}})
			return err
		}, PD},
		{"raw ReadFiles batch via link", func() error {
			_, err := rpc.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"esc/tmplink/fusebox-secret"}})
			return err
		}, PD},
		{"readfile link to secret", readFile("esc/secretlink"), PD},
		{"readfile via /proc link", readFile("esc/proclink/fusebox-secret"), PD},
		{"readfile /etc/passwd", readFile("/etc/passwd"), PD},
		{"readfile ../../etc/passwd", readFile("../../etc/passwd"), PD},
		{"readfile inner link", readFile("innerlink"), PD},
		{"stat follow link to /tmp", stat("esc/tmplink", true), PD},
		{"stat follow link chain", stat("esc/link1", true), PD},
		{"stat through link", stat("esc/tmplink/fusebox-secret", false), PD},
		{"stat /proc/self/root", stat("/proc/self/root/etc/passwd", false), PD},
		{"list link to /tmp", func() error { _, err := c.List(ctx, "esc/tmplink", false, 0); return err }, PD},
		{"list -r link to /", func() error { _, err := c.List(ctx, "esc/rootlink", true, 2); return err }, PD},
		{"find in link to /tmp", func() error {
			_, err := c.Find(ctx, &sandboxv1.FindRequest{Path: "esc/tmplink"})
			return err
		}, PD},
		{"find in ../", func() error { _, err := c.Find(ctx, &sandboxv1.FindRequest{Path: ".."}); return err }, PD},
		{"grep in link to /tmp", func() error {
			_, err := c.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "SECRET", Paths: []string{"esc/tmplink"}})
			return err
		}, PD},
		{"grep link to secret", func() error {
			_, err := c.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "SECRET", Paths: []string{"esc/secretlink"}})
			return err
		}, PD},
		{"grep /etc", func() error {
			_, err := c.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "root", Paths: []string{"/etc"}})
			return err
		}, PD},
	}
}

// assertNothingOutside checks, from inside the sandbox and from the host, that no attempt
// created anything outside the workspace.
func assertNothingOutside(t *testing.T, ctx context.Context, b *sandboxtest.Bound, tmpBefore []string) {
	t.Helper()
	if tmpAfter := lsA(t, ctx, b.Client, "/tmp"); !slices.Equal(tmpBefore, tmpAfter) {
		t.Errorf("/tmp changed: before %q, after %s", tmpBefore, capList(tmpAfter))
	}
	if out := strings.Fields(sandboxtest.Sh(t, ctx, b.Client, outsideScan)); len(out) > 0 {
		t.Errorf("found outside the workspace: %s", capList(out))
	}
	if got := lsA(t, ctx, b.Client, "/run/fusebox"); !slices.Equal(got, []string{"data.sock"}) {
		t.Errorf("/run/fusebox holds %q", got)
	}
	// /run/fusebox is the host's socket directory for this sandbox.
	entries, err := os.ReadDir(strings.TrimSuffix(socketPath(b.DataAddr), "/data.sock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "data.sock" {
			t.Errorf("host socket directory holds %s", e.Name())
		}
	}
}

// capList quotes at most 20 names and counts the rest.
func capList(names []string) string {
	if len(names) <= 20 {
		return fmt.Sprintf("%q", names)
	}
	return fmt.Sprintf("%q and %d more", names[:20], len(names)-20)
}

// swapper flips /workspace/sw between a real directory and a symlink to /tmp as fast as it
// can, until /workspace/stop exists. python3 is much faster than a shell loop, which forks
// for every step; the shell loop is the fallback.
const swapper = `cd /workspace
if command -v python3 >/dev/null; then
exec python3 -c '
import os, shutil
n = 0
while not os.path.exists("stop"):
    for step in ("dir", "link"):
        try:
            if os.path.islink("sw"):
                os.unlink("sw")
            elif os.path.isdir("sw"):
                shutil.rmtree("sw", ignore_errors=True)
        except OSError:
            pass
        try:
            if step == "dir":
                os.mkdir("sw")
            else:
                os.symlink("/tmp", "sw")
        except OSError:
            pass
    n += 1
print(n)
'
fi
n=0
while [ ! -e stop ]; do
  rm -rf sw; mkdir sw 2>/dev/null
  rm -rf sw; ln -s /tmp sw 2>/dev/null
  n=$((n+1))
done
echo $n
`

func TestEscapeSymlinkSwapDuringWrites(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 5*time.Minute)
	c := b.Client
	tmpBefore := lsA(t, ctx, c, "/tmp")

	flips := make(chan string, 1)
	go func() {
		res, err := c.Exec(ctx, client.Command{Script: swapper, Timeout: 4 * time.Minute})
		switch {
		case err != nil:
			flips <- "error: " + err.Error()
		default:
			flips <- fmt.Sprintf("exit %d, %s flips, stderr %q", res.ExitCode, strings.TrimSpace(string(res.Stdout)), res.Stderr)
		}
	}()
	// Let the swapper get going (it creates sw soon after it starts).
	sandboxtest.Eventually(t, time.Minute, "swapper started", func() (bool, string) {
		_, err := c.Stat(ctx, "sw", false)
		return err == nil, errString(err)
	})

	var mu sync.Mutex // guards outcomes
	outcomes := map[string]int{}
	record := func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[op+" "+codeOf(err).String()]++
	}
	payload := []byte("pwned-race\n")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 40 {
				var files []client.File
				for k := range 8 {
					files = append(files, client.File{Path: fmt.Sprintf("sw/pwned-race-%d-%d-%d", g, i, k), Data: payload})
				}
				files = append(files, client.File{Path: fmt.Sprintf("sw/sub/pwned-race-%d-%d", g, i), Data: payload})
				_, err := c.WriteFiles(ctx, files, nil, nil)
				record("WriteFiles", err)
				_, err = c.WriteFileFrom(ctx, fmt.Sprintf("sw/pwned-stream-%d-%d", g, i), 0o644, bytes.NewReader(payload), -1)
				record("WriteFileFrom", err)
				record("Mkdir", c.Mkdir(ctx, fmt.Sprintf("sw/pwned-dir-%d-%d/x", g, i), true))
				record("Symlink", c.Symlink(ctx, "../victim", fmt.Sprintf("sw/pwned-link-%d-%d", g, i)))
			}
		})
	}
	wg.Wait()
	if err := c.WriteFile(ctx, "stop", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("swapper: %s", <-flips)
	t.Logf("outcomes (operation, code): %v", outcomes)
	for k := range outcomes {
		op, code, _ := strings.Cut(k, " ")
		switch code {
		case "OK", "PermissionDenied", "NotFound", "AlreadyExists", "FailedPrecondition":
		default:
			t.Errorf("%s failed with %s during the swap", op, code)
		}
	}
	sandboxtest.Sh(t, ctx, c, "rm -rf /workspace/sw")
	assertNothingOutside(t, ctx, b, tmpBefore)
}
