package runsc

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"testing"
)

// isDenied reports whether p (relative to /etc) is or is below an entry of
// etcDenied.
func isDenied(p string) bool {
	for q := p; q != "." && q != "/"; q = path.Dir(q) {
		if etcDenied[q] {
			return true
		}
	}
	return false
}

func TestCopySanitizedEtc(t *testing.T) {
	src := t.TempDir()
	mk := func(p string, mode os.FileMode, content string) {
		t.Helper()
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(full, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("passwd", 0o644, "root:x:0:0::/root:/bin/sh\n")
	mk("shadow", 0o640, "root:$6$secret:1::::::\n")
	mk("gshadow", 0o644, "world-readable but denied\n")
	mk("private.key", 0o600, "secret\n")
	mk("private/readable", 0o644, "inside an unreadable directory\n")
	if err := os.Chmod(filepath.Join(src, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	mk("ssh/ssh_host_ed25519_key.pub", 0o644, "denied directory\n")
	mk("ssl/private/key.pem", 0o644, "denied subdirectory\n")
	mk("ssl/certs/ca.pem", 0o644, "certificate\n")
	mk("setuid-tool.conf", 0o755|os.ModeSetuid|os.ModeSetgid, "set-id bits dropped\n")
	if info, err := os.Stat(filepath.Join(src, "setuid-tool.conf")); err != nil || info.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("test setup: setuid-tool.conf mode %v, %v", info.Mode(), err)
	}
	mk("hosts", 0o644, "10.0.0.5 build-host-7\n")
	for link, target := range map[string]string{
		"alternatives/awk": "/usr/bin/mawk",
		"mtab":             "../proc/self/mounts",
		"shadow-link":      "shadow",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(src, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}

	dst := filepath.Join(t.TempDir(), "etc")
	if err := copySanitizedEtc(src, dst); err != nil {
		t.Fatalf("copySanitizedEtc: %v", err)
	}

	for p, want := range map[string]string{
		"passwd":           "root:x:0:0::/root:/bin/sh\n",
		"ssl/certs/ca.pem": "certificate\n",
		"hosts":            sandboxHosts,
		"setuid-tool.conf": "set-id bits dropped\n",
	} {
		got, err := os.ReadFile(filepath.Join(dst, p))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
	}
	if info, err := os.Stat(filepath.Join(dst, "setuid-tool.conf")); err != nil || info.Mode() != 0o755 {
		t.Errorf("setuid-tool.conf mode = %v, %v; want 0755", info.Mode(), err)
	}
	for p, want := range map[string]string{"alternatives/awk": "/usr/bin/mawk", "mtab": "../proc/self/mounts", "shadow-link": "shadow"} {
		if got, err := os.Readlink(filepath.Join(dst, p)); err != nil || got != want {
			t.Errorf("link %s -> %q, %v; want -> %q", p, got, err, want)
		}
	}
	for _, p := range []string{"shadow", "gshadow", "private.key", "private", "ssh", "ssl/private", "fifo"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); err == nil {
			t.Errorf("%s was copied", p)
		}
	}
}

func TestWriteSanitizedEtcHost(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "etc")
	if err := WriteSanitizedEtc(dst); err != nil {
		t.Fatalf("WriteSanitizedEtc: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "passwd")); err != nil {
		t.Errorf("no passwd: %v", err)
	}
	err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dst, p)
		if rel == "." {
			return nil
		}
		if isDenied(filepath.ToSlash(rel)) && rel != "hosts" {
			t.Errorf("denied %s was copied", rel)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
		case info.IsDir():
			if info.Mode().Perm()&0o005 != 0o005 {
				t.Errorf("directory %s has mode %v", rel, info.Mode())
			}
		case info.Mode().IsRegular():
			if info.Mode().Perm()&0o004 == 0 || info.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
				t.Errorf("file %s has mode %v", rel, info.Mode())
			}
		default:
			t.Errorf("%s has type %v", rel, info.Mode().Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func BenchmarkWriteSanitizedEtc(b *testing.B) {
	dir := b.TempDir()
	n := 0
	for b.Loop() {
		n++
		if err := WriteSanitizedEtc(filepath.Join(dir, "etc"+string(rune('a'+n%26))+string(rune('a'+n/26)))); err != nil {
			b.Fatal(err)
		}
	}
}
