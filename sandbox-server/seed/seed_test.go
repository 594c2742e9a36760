package seed

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// tree writes a seed under dir: a file, an executable, a read-only subdirectory with a file
// of another owner, links inside and out, and returns what the copy must show.
func tree(t *testing.T, dir string) map[string]want {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "sub", "mine.txt"), []byte("mine"), 0o640))
	must(os.Mkdir(filepath.Join(dir, "sub", "deep"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "sub", "deep", "x"), nil, 0o600))
	must(os.Chmod(filepath.Join(dir, "sub", "deep"), 0o500)) // the copy must still fill it
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "out")))
	must(os.Symlink("../hello.txt", filepath.Join(dir, "sub", "up")))
	must(os.Symlink("sub", filepath.Join(dir, "sublink")))
	owner := -1
	if os.Geteuid() == 0 {
		owner = 65532
		must(os.Lchown(filepath.Join(dir, "sub", "mine.txt"), owner, owner))
		must(os.Lchown(filepath.Join(dir, "sub", "up"), owner, owner))
		must(os.Lchown(filepath.Join(dir, "sub"), owner, owner))
	}
	return map[string]want{
		"hello.txt":    {mode: 0o644, data: "hello\n", owner: -1},
		"run.sh":       {mode: 0o755, data: "#!/bin/sh\n", owner: -1},
		"sub":          {mode: fs.ModeDir | 0o755, owner: owner},
		"sub/mine.txt": {mode: 0o640, data: "mine", owner: owner},
		"sub/deep":     {mode: fs.ModeDir | 0o500, owner: -1},
		"sub/deep/x":   {mode: 0o600, owner: -1},
		"out":          {mode: fs.ModeSymlink, target: "/etc/passwd", owner: -1},
		"sub/up":       {mode: fs.ModeSymlink, target: "../hello.txt", owner: owner},
		"sublink":      {mode: fs.ModeSymlink, target: "sub", owner: -1},
	}
}

// want is one copied entry: its type and permissions, contents or target, and owner (-1:
// the test's user).
type want struct {
	mode   fs.FileMode
	data   string
	target string
	owner  int
}

func TestCopy(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	wants := tree(t, src)
	before, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Copy(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Dirs: 2, Files: 4, Links: 3, Bytes: int64(len("hello\n#!/bin/sh\nmine"))}) {
		t.Errorf("stats %+v", st)
	}
	n := 0
	err = filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dst {
			return err
		}
		n++
		rel, _ := filepath.Rel(dst, p)
		w, ok := wants[rel]
		if !ok {
			t.Errorf("unexpected %s", rel)
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != w.mode && !(w.mode == fs.ModeSymlink && got.Type() == fs.ModeSymlink) {
			t.Errorf("%s: mode %v, want %v", rel, got, w.mode)
		}
		switch fi.Mode().Type() {
		case fs.ModeSymlink:
			if got, _ := os.Readlink(p); got != w.target {
				t.Errorf("%s: link to %q, want %q", rel, got, w.target)
			}
		case 0:
			if got, _ := os.ReadFile(p); string(got) != w.data {
				t.Errorf("%s: %q, want %q", rel, got, w.data)
			}
		}
		owner := w.owner
		if owner == -1 {
			owner = os.Geteuid()
		}
		if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != owner {
			t.Errorf("%s: owner %d, want %d", rel, uid, owner)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(wants) {
		t.Errorf("copied %d entries, want %d", n, len(wants))
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode() != before.Mode() {
		t.Errorf("the destination's own mode changed: %v %v", fi.Mode(), err)
	}
}

func TestCopyRefuses(t *testing.T) {
	t.Run("fifo", func(t *testing.T) {
		src := t.TempDir()
		if err := os.Mkdir(filepath.Join(src, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(filepath.Join(src, "d", "pipe"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Copy(src, t.TempDir())
		if !errors.Is(err, ErrUnsupported) || err.Error() != "d/pipe is a fifo: "+ErrUnsupported.Error() {
			t.Errorf("error %v, want d/pipe refused as a fifo", err)
		}
	})
	t.Run("an entry in the way", func(t *testing.T) {
		src, dst := t.TempDir(), t.TempDir()
		os.WriteFile(filepath.Join(src, "a"), []byte("new"), 0o644)
		os.WriteFile(filepath.Join(dst, "a"), []byte("old"), 0o644)
		if _, err := Copy(src, dst); !errors.Is(err, fs.ErrExist) {
			t.Errorf("error %v, want fs.ErrExist", err)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "a")); string(b) != "old" {
			t.Errorf("the existing file became %q", b)
		}
	})
	t.Run("a link in the way is not followed", func(t *testing.T) {
		src, dst, outside := t.TempDir(), t.TempDir(), t.TempDir()
		os.Mkdir(filepath.Join(src, "d"), 0o755)
		os.WriteFile(filepath.Join(src, "d", "f"), []byte("x"), 0o644)
		os.Symlink(outside, filepath.Join(dst, "d"))
		if _, err := Copy(src, dst); err == nil {
			t.Error("copied through a link in the destination")
		}
		if entries, _ := os.ReadDir(outside); len(entries) != 0 {
			t.Errorf("the copy wrote outside the destination: %v", entries)
		}
	})
	t.Run("missing source", func(t *testing.T) {
		if _, err := Copy(filepath.Join(t.TempDir(), "none"), t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("error %v, want fs.ErrNotExist", err)
		}
	})
}

// TestMeasure: Measure sums the regular files Copy would copy, follows no link, and refuses
// what Copy refuses.
func TestMeasure(t *testing.T) {
	src := t.TempDir()
	tree(t, src)
	size, empty, err := Measure(src)
	if err != nil || empty || size != int64(len("hello\n#!/bin/sh\nmine")) {
		t.Errorf("Measure = %d, %v, %v; want %d bytes", size, empty, err, len("hello\n#!/bin/sh\nmine"))
	}
	if size, empty, err := Measure(t.TempDir()); err != nil || !empty || size != 0 {
		t.Errorf("an empty directory: %d, %v, %v", size, empty, err)
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(src, link)
	if _, _, err := Measure(link); err == nil {
		t.Error("measured through a link")
	}
	if _, _, err := Measure(filepath.Join(src, "nothing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing directory: %v, want fs.ErrNotExist", err)
	}
	if err := syscall.Mkfifo(filepath.Join(src, "sub", "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Measure(src); !errors.Is(err, ErrUnsupported) || !strings.HasPrefix(err.Error(), "sub/pipe is a fifo") {
		t.Errorf("a fifo: %v, want ErrUnsupported naming sub/pipe", err)
	}
}
