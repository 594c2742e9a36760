package rootdiff

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/fusebox-dev/fusebox/internal/rootfs"
)

// layerFile compresses the layer archive data into a file and returns it as a v1.Layer.
func layerFile(t *testing.T, data []byte) (v1.Layer, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layer.tar.gz")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := Compress(f, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := Layer(p)
	if err != nil {
		t.Fatal(err)
	}
	return l, p
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func TestLayer(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a/b", strings.Repeat("content ", 1000))
	var raw bytes.Buffer
	if _, _, err := Diff(nil, dir, &raw, Options{Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	l, p := layerFile(t, raw.Bytes())
	gz, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.Digest(); err != nil || d.String() != sha(gz) {
		t.Errorf("Digest() = %v, %v; want %s", d, err, sha(gz))
	}
	if d, err := l.DiffID(); err != nil || d.String() != sha(raw.Bytes()) {
		t.Errorf("DiffID() = %v, %v; want %s", d, err, sha(raw.Bytes()))
	}
	if mt, err := l.MediaType(); err != nil || mt != types.OCILayer {
		t.Errorf("MediaType() = %v, %v", mt, err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(back, raw.Bytes()) {
		t.Errorf("Uncompressed() differs from the archive (%v)", err)
	}
	var again bytes.Buffer
	if err := Compress(&again, bytes.NewReader(raw.Bytes())); err != nil || !bytes.Equal(again.Bytes(), gz) {
		t.Errorf("compressing twice gives other bytes (%v)", err)
	}

	if err := os.WriteFile(p, raw.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Layer(p); err == nil || !strings.Contains(err.Error(), "not gzip-compressed") {
		t.Errorf("Layer of an uncompressed file: %v", err)
	}
	if _, err := Layer(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("Layer of a missing file: no error")
	}
}

// The same change made at other wall-clock times, in another directory, with files created
// in another order, gives the same bytes.
func TestReproducible(t *testing.T) {
	build := func(t *testing.T, now time.Time, reverse bool) ([]byte, v1.Hash) {
		dir := t.TempDir()
		write(t, dir, "etc/conf", "a")
		write(t, dir, "usr/lib/x", "x")
		write(t, dir, "old/gone", "g")
		age(t, dir, old)
		before, err := Snapshot(dir)
		if err != nil {
			t.Fatal(err)
		}
		steps := []func(){
			func() { write(t, dir, "etc/conf", "bb") },
			func() { write(t, dir, "app/main.py", "print(1)\n") },
			func() { write(t, dir, "app/data/one", "1") },
			func() { write(t, dir, "app/data/two", "2") },
			func() { symlink(t, dir, "/app/main.py", "usr/lib/main") },
			func() { remove(t, dir, "old") },
			func() { chmod(t, dir, "usr/lib/x", 0o600) },
		}
		if reverse {
			slices.Reverse(steps)
		}
		for _, s := range steps {
			s()
		}
		link(t, dir, "app/data/one", "app/one")
		// What the step touched has the time it ran at (to the nanosecond).
		for _, n := range []string{".", "etc", "etc/conf", "app", "app/main.py", "app/data", "app/data/one", "app/data/two", "usr/lib", "usr/lib/main"} {
			setTime(t, dir, n, now)
		}
		var raw bytes.Buffer
		if _, _, err := Diff(before, dir, &raw, Options{Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		l, _ := layerFile(t, raw.Bytes())
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return raw.Bytes(), d
	}
	a, da := build(t, time.Date(2024, 3, 4, 5, 6, 7, 8, time.UTC), false)
	b, db := build(t, time.Date(2025, 6, 7, 8, 9, 10, 999999999, time.UTC), true)
	if !bytes.Equal(a, b) {
		t.Errorf("layers differ:\n%q\n%q", summary(t, a), summary(t, b))
	}
	if da != db {
		t.Errorf("layer digests differ: %s, %s", da, db)
	}
	want := []string{
		"app/ dir 0755 0:0",
		"app/data/ dir 0755 0:0",
		`app/data/one file 0644 0:0 "1"`,
		`app/data/two file 0644 0:0 "2"`,
		`app/main.py file 0644 0:0 "print(1)\n"`,
		"app/one link -> app/data/one",
		"etc/ dir 0755 0:0",
		`etc/conf file 0644 0:0 "bb"`,
		".wh.old whiteout",
		"usr/lib/ dir 0755 0:0",
		"usr/lib/main symlink 0777 0:0 -> /app/main.py",
		`usr/lib/x file 0600 0:0 "x" @old`,
	}
	got := summary(t, a)
	slices.SortFunc(want, func(x, y string) int { return Compare(strings.Fields(x)[0], strings.Fields(y)[0]) })
	if !slices.Equal(got, want) {
		t.Errorf("layer:\n got  %q\n want %q", got, want)
	}
}

// A base layer of the before tree and the diff layer over it, unpacked by internal/rootfs,
// give back the changed tree.
func TestRoundTripThroughRootfs(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	write(t, dir, "usr/bin/tool", "#!/bin/sh\necho tool\n")
	chmod(t, dir, "usr/bin/tool", 0o755)
	link(t, dir, "usr/bin/tool", "usr/bin/tool-alias")
	write(t, dir, "etc/passwd", "root:x:0:0::/root:/bin/sh\n")
	write(t, dir, "etc/old.conf", "old")
	write(t, dir, "etc/same-size", "1111")
	write(t, dir, "var/cache/a/b/c", "c")
	write(t, dir, "var/cache/d", "d")
	write(t, dir, "home/u/.bashrc", "export A=1\n")
	chown(t, dir, "home/u/.bashrc", 1000, 1000)
	chown(t, dir, "home/u", 1000, 1000)
	chmod(t, dir, "home/u", 0o700)
	symlink(t, dir, "usr/bin", "bin")
	symlink(t, dir, "/etc/passwd", "etc/abs-link")
	write(t, dir, "opt/dir/file", "f")
	write(t, dir, "x", "file becoming a directory")
	write(t, dir, "y/z", "directory becoming a file")
	mkdir(t, dir, "tmp", 0o777|os.ModeSticky)
	age(t, dir, old)

	var base bytes.Buffer
	before, _, err := Diff(nil, dir, &base, Options{Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}

	write(t, dir, "etc/passwd", "root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\n")
	link(t, dir, "etc/passwd", "etc/passwd-")
	remove(t, dir, "etc/old.conf")
	write(t, dir, "etc/same-size", "2222")
	setTime(t, dir, "etc/same-size", old)
	remove(t, dir, "var/cache")
	write(t, dir, "var/cache/new", "n")
	chmod(t, dir, "home/u/.bashrc", 0o600)
	chown(t, dir, "home/u/.bashrc", 1000, 100)
	rename(t, dir, "opt/dir", "opt/dir2")
	remove(t, dir, "x")
	write(t, dir, "x/child", "c")
	remove(t, dir, "y")
	write(t, dir, "y", "now a file")
	remove(t, dir, "usr/bin/tool-alias")
	symlink(t, dir, "../usr/bin/tool", "var/tool-link")
	write(t, dir, "new/deep/er/file", "deep")
	write(t, dir, "tmp/scratch", "s")

	var top bytes.Buffer
	after, _, err := Diff(before, dir, &top, Options{Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	baseLayer, _ := layerFile(t, base.Bytes())
	topLayer, _ := layerFile(t, top.Bytes())
	img, err := mutate.AppendLayers(empty.Image, baseLayer, topLayer)
	if err != nil {
		t.Fatal(err)
	}
	root, err := rootfs.Unpack(t.Context(), img, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Snapshot(root.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Names(), after.Names()) {
		t.Fatalf("unpacked names:\n %q\nwant\n %q", got.Names(), after.Names())
	}
	for _, n := range after.Names() {
		w, _ := after.Entry(n)
		g, _ := got.Entry(n)
		if g.Kind != w.Kind || g.Mode != w.Mode || g.UID != w.UID || g.GID != w.GID || g.Size != w.Size ||
			g.Target != w.Target || g.Digest != w.Digest || g.FirstLink != w.FirstLink {
			t.Errorf("%s:\n unpacked %+v\n want     %+v", n, g, w)
		}
		// internal/rootfs sets the times of files and directories, not of links.
		if w.Kind != KindSymlink && !g.ModTime.Equal(clamp(w.ModTime, epoch)) {
			t.Errorf("%s: unpacked time %v, want %v", n, g.ModTime, clamp(w.ModTime, epoch))
		}
	}
}
