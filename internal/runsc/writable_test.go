package runsc_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
)

func TestWriteBundleRootWritable(t *testing.T) {
	image := t.TempDir()
	dir := filepath.Join(t.TempDir(), "b")
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE"}
	if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, RootFS: image, RootWritable: true, Capabilities: caps, Args: []string{"/bin/true"}}); err != nil {
		t.Fatal(err)
	}
	s := readConfig(t, dir)
	if s.Root.Path != image || s.Root.Readonly {
		t.Errorf("root = %+v, want %s writable", s.Root, image)
	}
	want := map[string]string{
		"dev.gvisor.spec.rootfs.source":  image,
		"dev.gvisor.spec.rootfs.type":    "bind",
		"dev.gvisor.spec.rootfs.overlay": "",
	}
	for k, v := range want {
		if got, ok := s.Annotations[k]; !ok || got != v {
			t.Errorf("annotation %s = %q (set %v), want %q", k, got, ok, v)
		}
	}
	for _, dest := range []string{"/tmp", runsc.DefaultWorkspace} {
		if m := mountAt(s, dest); m != nil {
			t.Errorf("a writable root has a mount at %s: %+v", dest, m)
		}
	}
	t.Run("the root's /tmp bound over itself", func(t *testing.T) {
		if err := os.Mkdir(filepath.Join(image, "tmp"), 0o1777); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(filepath.Join(image, "tmp"))
		dir := filepath.Join(t.TempDir(), "b")
		if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, RootFS: image, RootWritable: true, Args: []string{"/bin/true"}}); err != nil {
			t.Fatal(err)
		}
		m := mountAt(readConfig(t, dir), "/tmp")
		if m == nil || m.Type != "bind" || m.Source != filepath.Join(image, "tmp") || !slices.Contains(m.Options, "rw") {
			t.Errorf("/tmp mount = %+v, want a read-write bind of the root's /tmp", m)
		}
	})
	t.Run("a /tmp link is not followed", func(t *testing.T) {
		if err := os.Symlink(t.TempDir(), filepath.Join(image, "tmp")); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(filepath.Join(image, "tmp"))
		dir := filepath.Join(t.TempDir(), "b")
		if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, RootFS: image, RootWritable: true, Args: []string{"/bin/true"}}); err != nil {
			t.Fatal(err)
		}
		if m := mountAt(readConfig(t, dir), "/tmp"); m != nil {
			t.Errorf("/tmp mount = %+v, want none for a link", m)
		}
	})
	if p := s.Process; p.Cwd != "/" || !slices.Equal(p.Capabilities.Effective, caps) || !slices.Equal(p.Capabilities.Bounding, caps) {
		t.Errorf("process cwd %q caps %+v, want / and %v", p.Cwd, p.Capabilities, caps)
	}

	t.Run("read-only root unchanged", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "b")
		if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, RootFS: image, Args: []string{"/bin/true"}}); err != nil {
			t.Fatal(err)
		}
		s := readConfig(t, dir)
		if !s.Root.Readonly || len(s.Annotations) != 0 || mountAt(s, "/tmp") == nil {
			t.Errorf("root %+v annotations %v: want read-only, no annotations, a /tmp tmpfs", s.Root, s.Annotations)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		args := []string{"/bin/true"}
		tests := []struct {
			name string
			spec runsc.BundleSpec
			want string
		}{
			{"writable host root", runsc.BundleSpec{Args: args, RootWritable: true}, "needs RootFS"},
			{"writable with workspace", runsc.BundleSpec{Args: args, RootFS: image, RootWritable: true, Workspace: "/w"}, "no workspace"},
			{"writable with tmp size", runsc.BundleSpec{Args: args, RootFS: image, RootWritable: true, TmpSizeBytes: 1 << 20}, "no workspace"},
			{"bad capability", runsc.BundleSpec{Args: args, RootFS: image, Capabilities: []string{"chown"}}, "not a CAP_ name"},
			{"capabilities and command user", runsc.BundleSpec{Args: args, RootFS: image, Capabilities: caps, CommandUser: &runsc.User{UID: 1, GID: 1}}, "exclude each other"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				tt.spec.Dir = t.TempDir()
				err := runsc.WriteBundle(tt.spec)
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("WriteBundle = %v, want an error containing %q", err, tt.want)
				}
			})
		}
	})
}

func TestRunFake(t *testing.T) {
	rt, log := newFake(t, runsc.Runtime{})
	const id = "fbx-000000000001"
	bundle := t.TempDir()
	code, err := rt.Run(t.Context(), id, bundle, nil, nil)
	if err != nil || code != 0 {
		t.Fatalf("Run = %d, %v", code, err)
	}
	data, _ := os.ReadFile(log)
	if want := " --log-fd=3 run --bundle=" + bundle + " " + id + "\n"; !strings.Contains(string(data), want) {
		t.Errorf("no call ending in %q in:\n%s", want, data)
	}
	if _, err := rt.Run(t.Context(), "broken-000000000001", bundle, nil, nil); err == nil {
		t.Error("Run of an invalid id succeeded")
	}
}

// hostRoot makes a writable root directory whose programs are the host's: /usr is a link
// to the host's /usr, bound read-only at /host/usr (/usr itself is reserved for the
// host-derived root), and /bin, /lib... are the host's links or links into /usr.
func hostRoot(t *testing.T) (string, []runsc.Mount) {
	t.Helper()
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"host/usr", "proc", "sys", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("host/usr", filepath.Join(root, "usr")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		target, err := os.Readlink(d)
		if err != nil {
			target = "usr" + d // a directory on the host: its files are under /usr too
		}
		if err := os.Symlink(target, filepath.Join(root, d)); err != nil {
			t.Fatal(err)
		}
	}
	return root, []runsc.Mount{{Source: "/usr", Destination: "/host/usr", ReadOnly: true}}
}

// A one-shot command in a writable root: its writes, owners included, reach the host
// directory and nothing else; its exit code and output come back; the container is gone.
func TestRunWritableRoot(t *testing.T) {
	rt := runsctest.Runtime(t)
	root, mounts := hostRoot(t)
	before, _ := os.ReadDir(root)
	outside := t.TempDir()
	bundle := filepath.Join(t.TempDir(), "bundle")
	script := "echo out; echo err >&2; mkdir /made; echo data > /made/f; chown 1000:1001 /made/f; echo tmp > /tmp/t; " +
		"echo no > " + outside + "/escaped 2>/dev/null; exit 3"
	err := runsc.WriteBundle(runsc.BundleSpec{
		Dir: bundle, RootFS: root, RootWritable: true, Mounts: mounts,
		Capabilities: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"},
		Args:         []string{"/bin/sh", "-c", script},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Of this process: runsc names the host cgroup after the id (see runsctest).
	id := runsc.ID("wtest", uint64(os.Getpid()))
	t.Cleanup(func() { runsctest.Remove(t, rt, id) })
	var out, errOut bytes.Buffer
	code, err := rt.Run(t.Context(), id, bundle, &out, &errOut)
	if err != nil || code != 3 {
		t.Fatalf("Run = %d, %v (stderr %q); want 3", code, err, errOut.String())
	}
	if out.String() != "out\n" || !strings.Contains(errOut.String(), "err\n") {
		t.Errorf("stdout %q stderr %q", out.String(), errOut.String())
	}
	data, err := os.ReadFile(filepath.Join(root, "made/f"))
	if err != nil || string(data) != "data\n" {
		t.Fatalf("made/f = %q, %v", data, err)
	}
	info, _ := os.Stat(filepath.Join(root, "made/f"))
	if st := info.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1001 {
		t.Errorf("made/f belongs to %d:%d, want 1000:1001", st.Uid, st.Gid)
	}
	if data, err := os.ReadFile(filepath.Join(root, "tmp/t")); err != nil || string(data) != "tmp\n" {
		t.Errorf("tmp/t = %q, %v: /tmp is the root's own directory", data, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "escaped")); err == nil {
		t.Error("the command wrote to a host directory outside its root")
	}
	after, _ := os.ReadDir(root)
	if len(after) != len(before)+1 {
		t.Errorf("root holds %v, want %v and made", after, before)
	}
	states, err := rt.List(t.Context())
	if err != nil || len(states) != 0 {
		t.Errorf("List = %+v, %v: want no containers after Run", states, err)
	}
}
