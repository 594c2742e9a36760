// Package localimage tests the local runtime's root filesystems under the pinned gVisor
// runsc: sandboxes whose root is the sandbox image (an OCI image layout, unpacked once and
// shared read-only), and the host-derived fallback, where the sandbox sees the
// fusebox-sandbox binary and nothing else of its host directory.
package localimage

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

var (
	layoutOnce sync.Once
	layoutDir  string
	layoutErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if layoutDir != "" {
		os.RemoveAll(filepath.Dir(layoutDir))
	}
	os.Exit(code)
}

// sandboxLayout returns an OCI image layout of the test sandbox image (package imagetest),
// made once per test binary.
func sandboxLayout(t testing.TB) string {
	t.Helper()
	runsctest.Binary(t) // skip (FUSEBOX_SKIP_RUNSC=1) or fail before the slow part
	bin := sandboxtest.SandboxBinary(t)
	layoutOnce.Do(func() {
		var tmp string
		if tmp, layoutErr = os.MkdirTemp("", "fusebox-layout-"); layoutErr != nil {
			return
		}
		layoutDir = filepath.Join(tmp, "sandbox")
		_, layoutErr = imagetest.WriteLayout(layoutDir, bin, os.Stderr)
	})
	if layoutErr != nil {
		t.Fatalf("making the sandbox image layout: %v", layoutErr)
	}
	return layoutDir
}

// bind performs sFuse on a unit's init socket and dials its data plane.
func bind(t testing.TB, ctx context.Context, initAddr, dataAddr string) *client.Sandbox {
	t.Helper()
	key := sandboxtest.NewKey(t)
	res, err := sfuse.Initialize(ctx, initAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("sFuse: %v", err)
	}
	c, err := client.Dial(dataAddr, res.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// run runs script in the sandbox and returns its exit code, stdout and stderr.
func run(t testing.TB, ctx context.Context, c *client.Sandbox, script string) (int, string, string) {
	t.Helper()
	res, err := c.Exec(ctx, client.Command{Script: script})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return int(res.ExitCode), string(res.Stdout), string(res.Stderr)
}

// listDir returns the names in dir, sorted.
func listDir(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestSandboxFromTheImage(t *testing.T) {
	lay := sandboxLayout(t)
	wantOS, err := imagetest.OSRelease(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	a, err := runscalloc.New(runscalloc.Options{Runsc: runsctest.Binary(t), StateDir: state, Image: lay, IdleTTL: 10 * time.Minute})
	if err != nil {
		t.Fatalf("allocator with --image %s: %v", lay, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		a.Shutdown(ctx)
	})
	roots := listDir(t, filepath.Join(state, "rootfs"))
	var digests []string
	for _, n := range roots {
		if !strings.HasPrefix(n, ".") {
			digests = append(digests, n)
		}
	}
	if len(digests) != 1 {
		t.Fatalf("rootfs/ holds %v, want one unpacked image", roots)
	}
	rootDir := filepath.Join(state, "rootfs", digests[0], "root")
	before := listDir(t, rootDir)

	ctx := testenv.Context(t, 5*time.Minute)
	var units []manager.UnitInfo
	for i := range 2 {
		id := runsc.ID("img", uint64(i+1))
		u, err := a.Create(ctx, id, manager.DefaultTemplate)
		if err != nil {
			t.Fatalf("creating a sandbox from the image: %v", err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := a.Destroy(ctx, id); err != nil {
				t.Errorf("destroying %s: %v", id, err)
			}
		})
		units = append(units, u)
	}
	// Both sandboxes use the one unpacked root, read-only.
	for _, u := range units {
		data, err := os.ReadFile(filepath.Join(state, "sandboxes", u.ID, "bundle", "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var spec specs.Spec
		if err := json.Unmarshal(data, &spec); err != nil {
			t.Fatal(err)
		}
		if spec.Root.Path != rootDir || !spec.Root.Readonly {
			t.Errorf("unit %s: root %+v, want %s read-only", u.ID, spec.Root, rootDir)
		}
		// The server starts as root and runs commands as the image's user (privsep).
		cmdUser := fmt.Sprintf("-command-user=%d:%d", imagetest.SandboxUID, imagetest.SandboxUID)
		if !slices.Equal(spec.Process.Args[:1], []string{imagetest.Entrypoint}) || spec.Process.User.UID != 0 || !slices.Contains(spec.Process.Args, cmdUser) {
			t.Errorf("unit %s: argv %q as uid %d, want the image's entrypoint as root with %s", u.ID, spec.Process.Args, spec.Process.User.UID, cmdUser)
		}
	}

	c := bind(t, ctx, units[0].InitAddr, units[0].DataAddr)
	if out := sandboxtest.Sh(t, ctx, c, "python3 -c 'print(1)'"); out != "1\n" {
		t.Errorf("python3 -c 'print(1)' printed %q", out)
	}
	if out := sandboxtest.Sh(t, ctx, c, "git --version"); !strings.HasPrefix(out, "git version ") {
		t.Errorf("git --version printed %q", out)
	}
	if out := sandboxtest.Sh(t, ctx, c, "cat /etc/os-release"); out != wantOS {
		t.Errorf("/etc/os-release is\n%s\nwant the image's\n%s", out, wantOS)
	}
	if !strings.Contains(wantOS, `VERSION_CODENAME=bookworm`) {
		t.Errorf("the image's os-release is not Debian 12's:\n%s", wantOS)
	}
	if out := sandboxtest.Sh(t, ctx, c, "id -u; id -g; pwd; echo $LANG"); out != "65532\n65532\n/workspace\nC.UTF-8\n" {
		t.Errorf("id -u, id -g, pwd, $LANG: %q, want the image's user, working directory and environment", out)
	}
	// Nothing of the host's bin/ is bound in: the server is the image's own.
	if code, out, _ := run(t, ctx, c, "ls -A /opt/fusebox"); code == 0 {
		t.Errorf("/opt/fusebox exists in an image sandbox: %q", out)
	}
	// The root is read-only, and the sandbox writes to its workspace and /tmp only.
	if code, _, _ := run(t, ctx, c, "echo x > /usr/x || exit 1; exit 0"); code == 0 {
		t.Error("wrote to /usr of the image root")
	}
	sandboxtest.Sh(t, ctx, c, "echo x > /workspace/f && echo y > /tmp/f && git init -q /workspace/repo")
	// Bound without an allowlist, the sandbox runs no egress relay at all.
	egress := `import socket
socket.create_connection(("127.0.0.1", 3128), timeout=30)`
	if code, out, _ := run(t, ctx, c, "python3 -c '"+egress+"'"); code == 0 {
		t.Errorf("an egress relay answers without an allowlist: %q", out)
	}

	// The second sandbox answers too, and sees nothing of the first one's writes.
	c2 := bind(t, ctx, units[1].InitAddr, units[1].DataAddr)
	if out := sandboxtest.Sh(t, ctx, c2, "ls -A /workspace /tmp"); strings.Contains(out, "repo") || strings.Contains(out, " f") {
		t.Errorf("second sandbox sees the first one's files: %q", out)
	}
	if after := listDir(t, rootDir); !slices.Equal(before, after) {
		t.Errorf("the shared root changed on the host: %v, then %v", before, after)
	}

	// Preparing the image again (the next manager on this state directory) finds the
	// unpacked root.
	src, err := rootfs.ParseSource(lay)
	if err != nil {
		t.Fatal(err)
	}
	r, err := rootfs.Prepare(ctx, src, filepath.Join(state, "rootfs"), nil)
	if err != nil || r.Dir != rootDir {
		t.Fatalf("preparing the image again: %v, %v; want %s", r, err, rootDir)
	}
	if got := listDir(t, filepath.Join(state, "rootfs")); !slices.Equal(got, roots) {
		t.Errorf("rootfs/ after preparing again: %v, want %v", got, roots)
	}
}

func TestHostRootShowsOnlyTheSandboxBinary(t *testing.T) {
	// bin/ as make build leaves it: the CLI and other files beside the sandbox binary.
	bin := t.TempDir()
	data, err := os.ReadFile(sandboxtest.SandboxBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"fusebox-sandbox": data, "fusebox": []byte("#!/bin/sh\necho the CLI\n"), "secret.txt": []byte("host only\n")} {
		if err := os.WriteFile(filepath.Join(bin, name), body, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b := sandboxtest.StartBound(t, sandboxtest.Options{SandboxBinary: filepath.Join(bin, "fusebox-sandbox")})
	ctx := testenv.Context(t, 2*time.Minute)
	if out := sandboxtest.Sh(t, ctx, b.Client, "ls -A /opt/fusebox"); out != "fusebox-sandbox\n" {
		t.Errorf("ls -A /opt/fusebox = %q, want only fusebox-sandbox", out)
	}
	for _, p := range []string{"/opt/fusebox/fusebox", "/opt/fusebox/secret.txt"} {
		if code, out, _ := run(t, ctx, b.Client, "cat "+p); code == 0 {
			t.Errorf("%s is visible in the sandbox: %q", p, out)
		}
	}
	if out := sandboxtest.Sh(t, ctx, b.Client, "/opt/fusebox/fusebox-sandbox -h 2>&1 | head -1; test -w /opt/fusebox/fusebox-sandbox || echo read-only"); !strings.Contains(out, "read-only") {
		t.Errorf("the bound binary: %q, want it present and read-only", out)
	}
}
