package imagebuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/image"
)

// nodeBin is where make node-bins puts containerd and ctr ($FUSEBOX_NODE_BIN, which the
// Makefile exports).
func nodeBin() string {
	if d := os.Getenv("FUSEBOX_NODE_BIN"); d != "" {
		return d
	}
	return filepath.Join(cacheDir(), "node-containerd-v2.4.2-k8s-v1.37.2")
}

// containerd is a containerd the test started on its own state, root and socket directory:
// no CRI, no NRI, no network, nothing outside the directory.
type containerd struct {
	ctr, sock string
}

// startContainerd starts containerd in dir and waits until ctr reaches it; it is killed when
// the test ends.
func startContainerd(t *testing.T, bin, dir string) *containerd {
	t.Helper()
	// Images are unpacked into the native snapshotter: no mounts, on any file system.
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.transfer.v1.local"]
  unpack_config = [{platform = "linux/%[5]s", snapshotter = "native"}]
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "c.sock"), filepath.Join(dir, "c.sock.ttrpc"), goarch)
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "containerd"), "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // containerd and anything it started
		<-exited
	})
	c := &containerd{ctr: filepath.Join(bin, "ctr"), sock: filepath.Join(dir, "c.sock")}
	// Readiness: containerd creates its socket when it serves. The deadline only bounds a
	// containerd that never comes up.
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd exited: %v\n%s", err, log)
		default:
		}
		if _, err := os.Stat(c.sock); err == nil {
			if _, err := c.run("version"); err == nil {
				return c
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd did not serve on %s:\n%s", c.sock, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run runs ctr against the test's containerd in the namespace fusebox-test.
func (c *containerd) run(args ...string) (string, error) {
	cmd := exec.Command(c.ctr, append([]string{"--address", c.sock, "--namespace", "fusebox-test"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ctr %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

var (
	digestField = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	statusField = regexp.MustCompile(`\scomplete \((\d+)/(\d+)\)\s`)
)

// ctrRow is one image row of `ctr images ls` or `ctr images check`: the reference, the
// digest, the platforms (ls), the status and whether it is unpacked (check). Sizes are
// printed with spaces ("16.4 MiB"), so fields are found by their form, not their position.
type ctrRow struct {
	Ref, Digest, Platforms, Status, Unpacked string
}

func ctrRows(out string) map[string]ctrRow {
	rows := map[string]ctrRow{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, line := range lines[min(1, len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		r := ctrRow{Ref: f[0], Unpacked: f[len(f)-1]}
		for _, x := range f {
			switch {
			case digestField.MatchString(x) && r.Digest == "":
				r.Digest = x
			case strings.HasPrefix(x, "linux/"):
				r.Platforms = x
			}
		}
		if m := statusField.FindStringSubmatch(line); m != nil {
			r.Status = strings.TrimSpace(m[0])
			if m[1] != m[2] {
				r.Status = "incomplete " + r.Status
			}
		}
		rows[r.Ref] = r
	}
	return rows
}

// TestCtrImportsEachArchive imports each archive of `fusebox image build --tar` into a real
// containerd with `ctr images import` and checks that ctr reports the name and the digest the
// build printed, with all content present and unpacked.
func TestCtrImportsEachArchive(t *testing.T) {
	bin := nodeBin()
	for _, b := range []string{"containerd", "ctr"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Skipf("no %s in %s (make node-bins builds containerd v2.4.2 and ctr there): %v", b, bin, err)
		}
	}
	imgs := buildImages(t)
	// A short directory of its own: the socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := startContainerd(t, bin, dir)

	for _, n := range image.Names {
		b := imgs[n]
		if b.Tar == "" || b.ImportName != image.RefName(n) {
			t.Fatalf("%s: the build printed archive %q named %q, want one named %q", n, b.Tar, b.ImportName, image.RefName(n))
		}
		if out, err := c.run("images", "import", "--snapshotter", "native", b.Tar); err != nil {
			t.Fatalf("importing %s: %v", n, err)
		} else {
			t.Logf("ctr images import %s:\n%s", b.Tar, out)
		}
	}
	ls, err := c.run("images", "ls")
	if err != nil {
		t.Fatal(err)
	}
	check, err := c.run("images", "check", "--snapshotter", "native")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ctr images ls:\n%s\nctr images check:\n%s", ls, check)
	listed, checked := ctrRows(ls), ctrRows(check)
	if len(listed) != len(image.Names) {
		t.Errorf("ctr lists %d images, want %d", len(listed), len(image.Names))
	}
	for _, n := range image.Names {
		b := imgs[n]
		row, ok := listed[b.ImportName]
		if !ok {
			t.Errorf("ctr images ls has no %s", b.ImportName)
			continue
		}
		if row.Digest != b.Digest {
			t.Errorf("%s: ctr reports digest %s, the build printed %s", b.ImportName, row.Digest, b.Digest)
		}
		if row.Platforms != "linux/"+goarch {
			t.Errorf("%s: platforms %q, want linux/%s", b.ImportName, row.Platforms, goarch)
		}
		ck := checked[b.ImportName]
		if !strings.HasPrefix(ck.Status, "complete") || ck.Unpacked != "true" {
			t.Errorf("%s: ctr images check says status %q, unpacked %q; want complete and unpacked", b.ImportName, ck.Status, ck.Unpacked)
		}
	}
}
