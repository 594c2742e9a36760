package rootdiff

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSnapshot(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	write(t, dir, "d/f", "hello")
	chown(t, dir, "d/f", 7, 8)
	chmod(t, dir, "d/f", 0o640)
	link(t, dir, "d/f", "z")
	link(t, dir, "d/f", "a")
	symlink(t, dir, "../../outside", "d/l")
	mknod(t, dir, "p", unix.S_IFIFO|0o600, 0, 0)
	mknod(t, dir, "c", unix.S_IFCHR|0o600, 1, 3)
	mknod(t, dir, "sock", unix.S_IFSOCK|0o600, 0, 0)
	mtime := time.Date(2010, 1, 2, 3, 4, 5, 678, time.UTC)
	setTime(t, dir, "d/f", mtime)

	tree, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "c", "d", "d/f", "d/l", "p", "z"}; !reflect.DeepEqual(tree.Names(), want) {
		t.Errorf("Names() = %q, want %q", tree.Names(), want)
	}
	if tree.Len() != 7 || tree.Sockets != 1 {
		t.Errorf("Len() = %d, Sockets = %d, want 7 and 1", tree.Len(), tree.Sockets)
	}
	sum := sha256.Sum256([]byte("hello"))
	f, _ := tree.Entry("d/f")
	if f.Kind != KindFile || f.Mode != 0o640 || f.UID != 7 || f.GID != 8 || f.Size != 5 ||
		!f.ModTime.Equal(mtime) || f.Nlink != 3 || f.FirstLink != "a" ||
		f.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("d/f: %+v", f)
	}
	if a, _ := tree.Entry("a"); a.Ino != f.Ino || a.FirstLink != "a" || a.Digest != f.Digest {
		t.Errorf("a: %+v", a)
	}
	if l, _ := tree.Entry("d/l"); l.Kind != KindSymlink || l.Target != "../../outside" || l.Size != 0 {
		t.Errorf("d/l: %+v", l)
	}
	if d, _ := tree.Entry("d"); d.Kind != KindDir || d.Mode != 0o755 || d.Nlink != 0 || d.FirstLink != "" {
		t.Errorf("d: %+v", d)
	}
	if p, _ := tree.Entry("p"); p.Kind != KindFifo || p.Mode != 0o600 {
		t.Errorf("p: %+v", p)
	}
	if c, _ := tree.Entry("c"); c.Kind != KindCharDevice || c.Major != 1 || c.Minor != 3 {
		t.Errorf("c: %+v", c)
	}
	if _, ok := tree.Entry("sock"); ok {
		t.Errorf("the socket is an entry")
	}
	if _, ok := tree.Entry("."); ok {
		t.Errorf("the root is an entry")
	}
	if _, err := Snapshot(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Snapshot of a missing directory: %v", err)
	}
}

func TestSnapshotDoesNotFollowLinks(t *testing.T) {
	outside := t.TempDir()
	write(t, outside, "secret", "s")
	dir := t.TempDir()
	symlink(t, dir, outside, "abs")
	symlink(t, dir, "../"+filepath.Base(outside), "rel")
	tree, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"abs", "rel"}; !reflect.DeepEqual(tree.Names(), want) {
		t.Errorf("Names() = %q, want %q", tree.Names(), want)
	}
}

func TestCompare(t *testing.T) {
	sorted := []string{"", "a", "a/b", "a/b/c", "a/c", "a-b", "a.b", "ab", "b", "b/.wh.x", "b/a"}
	for i := range sorted {
		for j := range sorted {
			got := Compare(sorted[i], sorted[j])
			if (got < 0) != (i < j) || (got == 0) != (i == j) {
				t.Errorf("Compare(%q, %q) = %d", sorted[i], sorted[j], got)
			}
		}
	}
	shuffled := []string{"a.b", "a/c", "b", "a-b", "a/b/c", "ab", "a", "b/a", "a/b", "", "b/.wh.x"}
	slices.SortFunc(shuffled, Compare)
	if !reflect.DeepEqual(shuffled, sorted) {
		t.Errorf("sorted %q, want %q", shuffled, sorted)
	}
}

// A copy of a tree made as a builder makes it (new inodes, same metadata) is unchanged.
func TestCopyIsUnchanged(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	write(t, src, "usr/bin/tool", "#!/bin/sh\n")
	chmod(t, src, "usr/bin/tool", 0o755)
	link(t, src, "usr/bin/tool", "usr/bin/tool2")
	write(t, src, "home/u/.profile", "x")
	chown(t, src, "home/u/.profile", 1000, 1000)
	chown(t, src, "home/u", 1000, 1000)
	symlink(t, src, "usr/bin", "bin")
	mknod(t, src, "run/fifo", unix.S_IFIFO|0o600, 0, 0)
	setTime(t, src, "usr/bin/tool", time.Date(2030, 1, 1, 0, 0, 0, 5, time.UTC))
	before, err := Snapshot(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "root")
	copyTree(t, src, dst)
	var buf bytes.Buffer
	after, st, err := Diff(before, dst, &buf, Options{Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(t, buf.Bytes()); len(got) != 0 || st != (Stats{}) {
		t.Errorf("layer of a copy: %q, %+v", got, st)
	}
	// Between the two trees only the inode identities differ.
	for _, n := range before.Names() {
		b, _ := before.Entry(n)
		a, _ := after.Entry(n)
		b.Dev, b.Ino, a.Dev, a.Ino = 0, 0, 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s:\n before %+v\n after  %+v", n, b, a)
		}
	}
	if after.Len() != before.Len() {
		t.Errorf("%d entries after, %d before", after.Len(), before.Len())
	}
}

// The tree Diff returns is the changed directory's snapshot, so it can be the next step's
// before.
func TestDiffReturnsTheAfterTree(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "same", "s")
	write(t, dir, "grows", "g")
	write(t, dir, "mode", "m")
	age(t, dir, old)
	before, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "grows", "gggg")
	chmod(t, dir, "mode", 0o600)
	write(t, dir, "new/file", "n")
	link(t, dir, "new/file", "new/link")
	after, _, err := Diff(before, dir, &bytes.Buffer{}, Options{Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after, snap) {
		for _, n := range snap.Names() {
			a, _ := after.Entry(n)
			s, _ := snap.Entry(n)
			if !reflect.DeepEqual(a, s) {
				t.Errorf("%s:\n from Diff     %+v\n from Snapshot %+v", n, a, s)
			}
		}
		t.Fatal("Diff's tree differs from a snapshot")
	}
	var buf bytes.Buffer
	if _, st, err := Diff(after, dir, &buf, Options{Epoch: epoch}); err != nil || st != (Stats{}) {
		t.Errorf("diff against Diff's own tree: %+v, %v", st, err)
	}
}

// openPath never goes through a symbolic link, and only opens the inode the walk saw.
func TestOpenPathRefusesLinksAndSwaps(t *testing.T) {
	outside := t.TempDir()
	write(t, outside, "f", "outside")
	for _, tc := range []struct {
		name string
		swap func(t *testing.T, dir string)
	}{
		{"a directory of the path replaced by a link", func(t *testing.T, d string) {
			rename(t, d, "d", "moved")
			symlink(t, d, outside, "d")
		}},
		{"the file replaced by a link", func(t *testing.T, d string) {
			remove(t, d, "d/f")
			symlink(t, d, filepath.Join(outside, "f"), "d/f")
		}},
		{"the file replaced by another file", func(t *testing.T, d string) {
			// Kept under another name, so that the new file cannot reuse its inode number.
			rename(t, d, "d/f", "d/kept")
			write(t, d, "d/f", "inside")
		}},
		{"the file replaced by a fifo", func(t *testing.T, d string) {
			remove(t, d, "d/f")
			if err := unix.Mkfifo(filepath.Join(d, "d/f"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"the file replaced by a directory", func(t *testing.T, d string) {
			remove(t, d, "d/f")
			mkdir(t, d, "d/f", 0o755)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "d/f", "inside")
			tree, err := Snapshot(dir)
			if err != nil {
				t.Fatal(err)
			}
			root, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			e := tree.entries["d/f"]
			f, err := openPath(root, e)
			if err != nil {
				t.Fatalf("before the swap: %v", err)
			}
			f.Close()
			tc.swap(t, dir)
			f, err = openPath(root, e)
			if err == nil {
				f.Close()
				t.Fatal("opened the swapped path")
			}
		})
	}
}
