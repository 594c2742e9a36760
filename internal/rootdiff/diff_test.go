package rootdiff

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDiff checks the layer of each kind of change. Before trees have their times at old,
// so summary shows " @old" for an entry the change left at that time, and nothing for one
// the change touched (its time is now, clamped to epoch).
func TestDiff(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, dir string)
		change func(t *testing.T, dir string)
		want   []string
		stats  Stats
	}{
		{
			name: "no change gives an empty layer",
			before: func(t *testing.T, d string) {
				write(t, d, "a/b", "x")
				symlink(t, d, "a/b", "l")
				link(t, d, "a/b", "h")
				mknod(t, d, "p", unix.S_IFIFO|0o600, 0, 0)
			},
		},
		{
			name:   "added files, in the root and in a directory",
			before: func(t *testing.T, d string) { mkdir(t, d, "d", 0o755) },
			change: func(t *testing.T, d string) {
				write(t, d, "new", "x")
				write(t, d, "d/new", "yy")
			},
			want: []string{
				"d/ dir 0755 0:0",
				`d/new file 0644 0:0 "yy"`,
				`new file 0644 0:0 "x"`,
			},
			stats: Stats{Added: 2, Modified: 1, Bytes: 3},
		},
		{
			name:   "content rewritten with another size",
			before: func(t *testing.T, d string) { write(t, d, "f", "old") },
			change: func(t *testing.T, d string) { write(t, d, "f", "newer") },
			want:   []string{`f file 0644 0:0 "newer"`},
			stats:  Stats{Modified: 1, Bytes: 5},
		},
		{
			name:   "content rewritten with the same size and the time set back",
			before: func(t *testing.T, d string) { write(t, d, "f", "aaaa") },
			change: func(t *testing.T, d string) {
				write(t, d, "f", "bbbb")
				setTime(t, d, "f", old)
			},
			want:  []string{`f file 0644 0:0 "bbbb" @old`},
			stats: Stats{Modified: 1, Bytes: 4},
		},
		{
			name:   "time only (touch)",
			before: func(t *testing.T, d string) { write(t, d, "f", "same") },
			change: func(t *testing.T, d string) { setTime(t, d, "f", time.Now()) },
			want:   []string{`f file 0644 0:0 "same"`},
			stats:  Stats{Modified: 1, Bytes: 4},
		},
		{
			name:   "mode only",
			before: func(t *testing.T, d string) { write(t, d, "f", "body") },
			change: func(t *testing.T, d string) { chmod(t, d, "f", 0o600) },
			want:   []string{`f file 0600 0:0 "body" @old`},
			stats:  Stats{Modified: 1, Bytes: 4},
		},
		{
			name: "owner only, of a file and of a directory",
			before: func(t *testing.T, d string) {
				write(t, d, "f", "body")
				write(t, d, "d/inside", "i")
			},
			change: func(t *testing.T, d string) {
				chown(t, d, "f", 1000, 2000)
				chown(t, d, "d", 0, 50)
			},
			want: []string{
				"d/ dir 0755 0:50 @old",
				`f file 0644 1000:2000 "body" @old`,
			},
			stats: Stats{Modified: 2, Bytes: 4},
		},
		{
			name: "set-id and sticky bits",
			before: func(t *testing.T, d string) {
				write(t, d, "f", "x")
				mkdir(t, d, "tmp", 0o755)
			},
			change: func(t *testing.T, d string) {
				chmod(t, d, "f", 0o755|os.ModeSetuid|os.ModeSetgid)
				chmod(t, d, "tmp", 0o777|os.ModeSticky)
			},
			want: []string{
				`f file 6755 0:0 "x" @old`,
				"tmp/ dir 1777 0:0 @old",
			},
			stats: Stats{Modified: 2, Bytes: 1},
		},
		{
			name: "deleted file",
			before: func(t *testing.T, d string) {
				write(t, d, "d/f", "f")
				write(t, d, "d/g", "g")
			},
			change: func(t *testing.T, d string) { remove(t, d, "d/f") },
			want:   []string{"d/ dir 0755 0:0", "d/.wh.f whiteout"},
			stats:  Stats{Modified: 1, Deleted: 1},
		},
		{
			name: "deleted directory tree is one whiteout",
			before: func(t *testing.T, d string) {
				write(t, d, "t/a/b/c", "c")
				write(t, d, "t/x", "x")
				symlink(t, d, "x", "t/l")
				write(t, d, "keep", "k")
			},
			change: func(t *testing.T, d string) { remove(t, d, "t") },
			want:   []string{".wh.t whiteout"},
			stats:  Stats{Deleted: 1},
		},
		{
			name:   "renamed file keeps its time",
			before: func(t *testing.T, d string) { write(t, d, "a", "x") },
			change: func(t *testing.T, d string) { rename(t, d, "a", "b") },
			want:   []string{".wh.a whiteout", `b file 0644 0:0 "x" @old`},
			stats:  Stats{Added: 1, Deleted: 1, Bytes: 1},
		},
		{
			name: "renamed directory",
			before: func(t *testing.T, d string) {
				write(t, d, "src/a", "a")
				write(t, d, "src/sub/b", "b")
			},
			change: func(t *testing.T, d string) { rename(t, d, "src", "dst") },
			want: []string{
				".wh.src whiteout",
				"dst/ dir 0755 0:0 @old",
				`dst/a file 0644 0:0 "a" @old`,
				"dst/sub/ dir 0755 0:0 @old",
				`dst/sub/b file 0644 0:0 "b" @old`,
			},
			stats: Stats{Added: 4, Deleted: 1, Bytes: 2},
		},
		{
			name:   "file replaced by a directory",
			before: func(t *testing.T, d string) { write(t, d, "x", "file") },
			change: func(t *testing.T, d string) {
				remove(t, d, "x")
				write(t, d, "x/child", "c")
			},
			want:  []string{"x/ dir 0755 0:0", `x/child file 0644 0:0 "c"`},
			stats: Stats{Added: 1, Modified: 1, Bytes: 1},
		},
		{
			name: "directory replaced by a file: no whiteouts for its children",
			before: func(t *testing.T, d string) {
				write(t, d, "x/a", "a")
				write(t, d, "x/b/c", "c")
			},
			change: func(t *testing.T, d string) {
				remove(t, d, "x")
				write(t, d, "x", "f")
			},
			want:  []string{`x file 0644 0:0 "f"`},
			stats: Stats{Modified: 1, Bytes: 1},
		},
		{
			name: "directory replaced by a symbolic link",
			before: func(t *testing.T, d string) {
				write(t, d, "x/a", "a")
				mkdir(t, d, "y", 0o755)
			},
			change: func(t *testing.T, d string) {
				remove(t, d, "x")
				symlink(t, d, "y", "x")
			},
			want:  []string{"x symlink 0777 0:0 -> y"},
			stats: Stats{Modified: 1},
		},
		{
			name: "directory deleted and made again",
			before: func(t *testing.T, d string) {
				write(t, d, "d/a", "a")
				write(t, d, "d/b", "b")
			},
			change: func(t *testing.T, d string) {
				remove(t, d, "d")
				write(t, d, "d/c", "c")
			},
			want: []string{
				"d/ dir 0755 0:0",
				"d/.wh.a whiteout",
				"d/.wh.b whiteout",
				`d/c file 0644 0:0 "c"`,
			},
			stats: Stats{Added: 1, Modified: 1, Deleted: 2, Bytes: 1},
		},
		{
			name: "symbolic links are recorded, never followed",
			before: func(t *testing.T, d string) {
				write(t, d, "d/secret", "s")
			},
			change: func(t *testing.T, d string) {
				symlink(t, d, "nowhere", "dangling")
				symlink(t, d, "../../../../etc/passwd", "out")
				symlink(t, d, "/etc/shadow", "abs")
				symlink(t, d, "/", "root")
				symlink(t, d, "..", "up")
				symlink(t, d, "d", "dirlink")
			},
			want: []string{
				"abs symlink 0777 0:0 -> /etc/shadow",
				"dangling symlink 0777 0:0 -> nowhere",
				"dirlink symlink 0777 0:0 -> d",
				"out symlink 0777 0:0 -> ../../../../etc/passwd",
				"root symlink 0777 0:0 -> /",
				"up symlink 0777 0:0 -> ..",
			},
			stats: Stats{Added: 6},
		},
		{
			name:   "symbolic link retargeted",
			before: func(t *testing.T, d string) { symlink(t, d, "a", "l") },
			change: func(t *testing.T, d string) {
				remove(t, d, "l")
				symlink(t, d, "b", "l")
				setTime(t, d, "l", old)
			},
			want:  []string{"l symlink 0777 0:0 -> b @old"},
			stats: Stats{Modified: 1},
		},
		{
			name:   "hard link added to an unchanged file",
			before: func(t *testing.T, d string) { write(t, d, "a", "x") },
			change: func(t *testing.T, d string) { link(t, d, "a", "b") },
			want:   []string{`a file 0644 0:0 "x" @old`, "b link -> a @old"},
			stats:  Stats{Added: 1, Modified: 1, HardLinks: 1, Bytes: 1},
		},
		{
			name:   "hard link named before the original links to the first name",
			before: func(t *testing.T, d string) { write(t, d, "z", "x") },
			change: func(t *testing.T, d string) { link(t, d, "z", "a") },
			want:   []string{`a file 0644 0:0 "x" @old`, "z link -> a @old"},
			stats:  Stats{Added: 1, Modified: 1, HardLinks: 1, Bytes: 1},
		},
		{
			name: "hard-linked new files",
			change: func(t *testing.T, d string) {
				write(t, d, "n/one", "1")
				link(t, d, "n/one", "n/two")
				link(t, d, "n/one", "top")
			},
			want: []string{
				"n/ dir 0755 0:0",
				`n/one file 0644 0:0 "1"`,
				"n/two link -> n/one",
				"top link -> n/one",
			},
			stats: Stats{Added: 4, HardLinks: 2, Bytes: 1},
		},
		{
			name: "hard-linked file rewritten through one name",
			before: func(t *testing.T, d string) {
				write(t, d, "a", "1")
				link(t, d, "a", "b")
			},
			change: func(t *testing.T, d string) { write(t, d, "b", "2") },
			want:   []string{`a file 0644 0:0 "2"`, "b link -> a"},
			stats:  Stats{Modified: 2, HardLinks: 1, Bytes: 1},
		},
		{
			name: "one name of a hard link deleted",
			before: func(t *testing.T, d string) {
				write(t, d, "a", "1")
				link(t, d, "a", "b")
			},
			change: func(t *testing.T, d string) { remove(t, d, "b") },
			want:   []string{".wh.b whiteout"},
			stats:  Stats{Deleted: 1},
		},
		{
			name: "hard link replaced by a copy",
			before: func(t *testing.T, d string) {
				write(t, d, "a", "1")
				link(t, d, "a", "b")
			},
			change: func(t *testing.T, d string) {
				remove(t, d, "b")
				write(t, d, "b", "1")
				setTime(t, d, "b", old)
			},
			want:  []string{`b file 0644 0:0 "1" @old`},
			stats: Stats{Modified: 1, Bytes: 1},
		},
		{
			name:   "fifo",
			change: func(t *testing.T, d string) { mknod(t, d, "p", unix.S_IFIFO|0o640, 0, 0) },
			want:   []string{"p fifo 0640 0:0"},
			stats:  Stats{Added: 1},
		},
		{
			name:   "sockets are left out, and one replacing a file deletes it",
			before: func(t *testing.T, d string) { write(t, d, "s", "x") },
			change: func(t *testing.T, d string) {
				remove(t, d, "s")
				mknod(t, d, "s", unix.S_IFSOCK|0o644, 0, 0)
				mknod(t, d, "other", unix.S_IFSOCK|0o644, 0, 0)
			},
			want:  []string{".wh.s whiteout"},
			stats: Stats{Deleted: 1, Sockets: 2},
		},
		{
			name: "long names and large ids",
			change: func(t *testing.T, d string) {
				name := strings.Repeat("a", 120) + "/" + strings.Repeat("b", 150)
				write(t, d, name, "x")
				chown(t, d, name, 3000000, 4000000)
				symlink(t, d, "/"+name, "l")
			},
			want: []string{
				strings.Repeat("a", 120) + "/ dir 0755 0:0",
				strings.Repeat("a", 120) + "/" + strings.Repeat("b", 150) + ` file 0644 3000000:4000000 "x"`,
				"l symlink 0777 0:0 -> /" + strings.Repeat("a", 120) + "/" + strings.Repeat("b", 150),
			},
			stats: Stats{Added: 3, Bytes: 1},
		},
		{
			name: "layer order puts a directory's entries right after it",
			change: func(t *testing.T, d string) {
				write(t, d, "a-b", "1")
				write(t, d, "a/b", "2")
				write(t, d, "a.b", "3")
			},
			want: []string{
				"a/ dir 0755 0:0",
				`a/b file 0644 0:0 "2"`,
				`a-b file 0644 0:0 "1"`,
				`a.b file 0644 0:0 "3"`,
			},
			stats: Stats{Added: 4, Bytes: 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			layer, st, err := diffOf(t, tc.before, tc.change)
			if err != nil {
				t.Fatal(err)
			}
			got := summary(t, layer)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("layer:\n got  %q\n want %q", got, tc.want)
			}
			if st != tc.stats {
				t.Errorf("stats %+v, want %+v", st, tc.stats)
			}
		})
	}
}

func TestDiffRefuses(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, dir string)
		change func(t *testing.T, dir string)
		is     error
		want   string
	}{
		{
			name:   "a character device",
			change: func(t *testing.T, d string) { mknod(t, d, "d/null", unix.S_IFCHR|0o666, 1, 3) },
			is:     ErrDevice,
			want:   "a build step may not create device nodes: /d/null is a character device",
		},
		{
			name:   "a block device",
			change: func(t *testing.T, d string) { mknod(t, d, "sda", unix.S_IFBLK|0o600, 8, 0) },
			is:     ErrDevice,
			want:   "/sda is a block device",
		},
		{
			name:   "a device already there before the step",
			before: func(t *testing.T, d string) { mknod(t, d, "zero", unix.S_IFCHR|0o666, 1, 5) },
			is:     ErrDevice,
			want:   "/zero is a character device",
		},
		{
			name:   "a name taken for a whiteout",
			change: func(t *testing.T, d string) { write(t, d, "etc/.wh.passwd", "") },
			is:     ErrWhiteoutName,
			want:   "/etc/.wh.passwd: names starting with .wh. are reserved",
		},
		{
			name:   "an opaque-directory marker",
			change: func(t *testing.T, d string) { write(t, d, "usr/.wh..wh..opq", "") },
			is:     ErrWhiteoutName,
			want:   "/usr/.wh..wh..opq",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mkdirs := func(t *testing.T, d string) {
				mkdir(t, d, "d", 0o755)
				if tc.before != nil {
					tc.before(t, d)
				}
			}
			_, _, err := diffOf(t, mkdirs, tc.change)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %v with %q", err, tc.is, tc.want)
			}
		})
	}
	t.Run("a missing directory", func(t *testing.T) {
		_, _, err := Diff(nil, filepath.Join(t.TempDir(), "gone"), &bytes.Buffer{}, Options{})
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "diffing ") {
			t.Fatalf("error %v", err)
		}
	})
}

func TestDiffTimes(t *testing.T) {
	later := time.Date(2022, 5, 6, 7, 8, 9, 123456789, time.UTC)
	for _, tc := range []struct {
		name         string
		epoch        time.Time
		before, then time.Time // the file's time before and after the step
		want         []string
	}{
		{"times after the epoch all clamp to it, so a touch changes nothing", epoch, later, later.Add(time.Hour), nil},
		{"a time moved before the epoch is recorded", epoch, later, old, []string{`f file 0644 0:0 "x" @old`}},
		{"the zero epoch is the Unix epoch", time.Time{}, later, old, nil},
		{"a time before the epoch is kept to the second", later, old, old.Add(1500 * time.Millisecond), []string{`f file 0644 0:0 "x" @2001-02-03T04:05:07Z`}},
		{"sub-second changes are not recorded", later, old, old.Add(300 * time.Millisecond), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "f", "x")
			setTime(t, dir, "f", tc.before)
			snap, err := Snapshot(dir)
			if err != nil {
				t.Fatal(err)
			}
			setTime(t, dir, "f", tc.then)
			var buf bytes.Buffer
			if _, _, err := Diff(snap, dir, &buf, Options{Epoch: tc.epoch}); err != nil {
				t.Fatal(err)
			}
			if got := summaryAt(t, buf.Bytes(), tc.epoch); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("layer %q, want %q", got, tc.want)
			}
		})
	}
}

// summaryAt is summary for a layer clamped to another epoch than the tests' usual one.
func summaryAt(t *testing.T, layer []byte, at time.Time) []string {
	t.Helper()
	saved := epoch
	if at.IsZero() {
		at = time.Unix(0, 0)
	}
	epoch = at.Truncate(time.Second)
	defer func() { epoch = saved }()
	return summary(t, layer)
}

func TestNilBeforeWritesEverything(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a/b", "b")
	symlink(t, dir, "a/b", "l")
	age(t, dir, old)
	var buf bytes.Buffer
	after, st, err := Diff(nil, dir, &buf, Options{Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a/ dir 0755 0:0 @old", `a/b file 0644 0:0 "b" @old`, "l symlink 0777 0:0 -> a/b @old"}
	if got := summary(t, buf.Bytes()); !reflect.DeepEqual(got, want) {
		t.Errorf("layer %q, want %q", got, want)
	}
	if st != (Stats{Added: 3, Bytes: 1}) || after.Len() != 3 {
		t.Errorf("stats %+v, %d entries", st, after.Len())
	}
}
