package rootdiff

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	// old is the time of every entry of a before tree (see age): earlier than epoch, so
	// layers keep it.
	old = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	// epoch is the layers' clamping time; what a test changes gets the wall-clock time,
	// later than epoch, so layers record epoch for it.
	epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown, mknod)")
	}
}

func mkdir(t *testing.T, dir, name string, mode fs.FileMode) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, dir, name string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, dir, name string, uid, gid int) {
	t.Helper()
	if err := os.Lchown(filepath.Join(dir, name), uid, gid); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, dir, target, name string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func link(t *testing.T, dir, oldname, newname string) {
	t.Helper()
	if err := os.Link(filepath.Join(dir, oldname), filepath.Join(dir, newname)); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func rename(t *testing.T, dir, from, to string) {
	t.Helper()
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		t.Fatal(err)
	}
}

// mknod makes a special file; mode holds the type (unix.S_IFIFO...) and permissions.
func mknod(t *testing.T, dir, name string, mode uint32, major, minor uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, name), mode, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, filepath.Join(dir, name), mode&0o7777, 0); err != nil {
		t.Fatal(err)
	}
}

// setTime sets the access and modification times of name, a symbolic link itself included.
func setTime(t *testing.T, dir, name string, tm time.Time) {
	t.Helper()
	ts := unix.NsecToTimespec(tm.UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, name), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

// age sets the times of dir and everything under it to tm.
func age(t *testing.T, dir string, tm time.Time) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		setTime(t, dir, rel, tm)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// copyTree copies src to dst (which must not exist) as a builder would: modes, owners,
// times, symbolic links, fifos and hard links kept, every inode new.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	type inode struct{ dev, ino uint64 }
	copied := map[inode]string{}
	var dirs []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := os.Mkdir(to, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, rel)
		case unix.S_IFREG:
			k := inode{uint64(st.Dev), uint64(st.Ino)}
			if first, ok := copied[k]; ok {
				return os.Link(first, to)
			}
			copied[k] = to
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(to, data, 0o600); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case unix.S_IFIFO:
			if err := unix.Mkfifo(to, 0o600); err != nil {
				return err
			}
		default:
			return fmt.Errorf("copyTree: %s: unexpected type %#o", p, st.Mode&unix.S_IFMT)
		}
		if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if err := unix.Fchmodat(unix.AT_FDCWD, to, st.Mode&0o7777, 0); err != nil {
				return err
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			ts := []unix.Timespec{st.Atim, st.Mtim}
			return unix.UtimesNanoAt(unix.AT_FDCWD, to, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Directory times last, deepest first: filling a directory changes its times.
	for i := len(dirs) - 1; i >= 0; i-- {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(src, dirs[i]), &st); err != nil {
			t.Fatal(err)
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dst, dirs[i]), ts, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// diffOf snapshots dir after before(dir) and age, applies change(dir) and diffs.
func diffOf(t *testing.T, before, change func(t *testing.T, dir string)) ([]byte, Stats, error) {
	t.Helper()
	dir := t.TempDir()
	if before != nil {
		before(t, dir)
	}
	age(t, dir, old)
	snap, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if change != nil {
		change(t, dir)
	}
	var buf bytes.Buffer
	_, st, err := Diff(snap, dir, &buf, Options{Epoch: epoch})
	return buf.Bytes(), st, err
}

// summary describes the entries of a layer, one line each, and checks what every header
// must be: numeric owners only, no access or change times, times clamped to epoch and in
// whole seconds, PAX records only for what USTAR cannot hold.
func summary(t *testing.T, layer []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner names %q:%q", h.Name, h.Uname, h.Gname)
		}
		if !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s: access or change time recorded", h.Name)
		}
		if h.ModTime.After(epoch) || h.ModTime.Nanosecond() != 0 {
			t.Errorf("%s: time %v, want whole seconds no later than %v", h.Name, h.ModTime, epoch)
		}
		for k := range h.PAXRecords {
			if k != "path" && k != "linkpath" && k != "uid" && k != "gid" {
				t.Errorf("%s: PAX record %q", h.Name, k)
			}
		}
		when := ""
		switch {
		case h.ModTime.Equal(old):
			when = " @old"
		case !h.ModTime.Equal(epoch):
			when = " @" + h.ModTime.UTC().Format(time.RFC3339)
		}
		owner := fmt.Sprintf("%d:%d", h.Uid, h.Gid)
		var line string
		switch {
		case strings.HasPrefix(filepath.Base(h.Name), WhiteoutPrefix):
			if h.Typeflag != tar.TypeReg || h.Size != 0 || h.Mode != 0 || !h.ModTime.Equal(epoch) || owner != "0:0" {
				t.Errorf("whiteout %s: %+v", h.Name, h)
			}
			line = h.Name + " whiteout"
		case h.Typeflag == tar.TypeDir:
			line = fmt.Sprintf("%s dir %04o %s%s", h.Name, h.Mode, owner, when)
		case h.Typeflag == tar.TypeReg:
			line = fmt.Sprintf("%s file %04o %s %q%s", h.Name, h.Mode, owner, body, when)
		case h.Typeflag == tar.TypeSymlink:
			line = fmt.Sprintf("%s symlink %04o %s -> %s%s", h.Name, h.Mode, owner, h.Linkname, when)
		case h.Typeflag == tar.TypeLink:
			line = fmt.Sprintf("%s link -> %s%s", h.Name, h.Linkname, when)
		case h.Typeflag == tar.TypeFifo:
			line = fmt.Sprintf("%s fifo %04o %s%s", h.Name, h.Mode, owner, when)
		default:
			line = fmt.Sprintf("%s type %q", h.Name, h.Typeflag)
		}
		out = append(out, line)
	}
	return out
}
