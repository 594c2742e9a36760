// Package rootdiff turns what a build step changed in a root filesystem into a
// reproducible OCI layer. A builder snapshots the root before the step (Snapshot), runs the
// step with a copy of that root as its writable root, then writes the difference (Diff) as
// an uncompressed tar layer: added and changed entries with their content, deleted ones as
// whiteouts. Compress and Layer make the go-containerregistry layer from it.
//
// The same change gives the same bytes whenever and wherever it is made: entries sorted by
// name, times clamped to an epoch, numeric owners only, no access or change times, hard
// links to the first name in sort order, gzip at a fixed level. Inode numbers and times
// later than the epoch never reach the layer.
//
// Reading never follows a symbolic link: directories are walked with openat(2) and
// O_NOFOLLOW from a descriptor of the root, links are read as links, files are opened one
// path component at a time with O_NOFOLLOW (and O_NONBLOCK, so a fifo swapped in cannot
// block), and each open file is checked (fstat) to have the type and inode number the walk
// recorded. What a step leaves in its root cannot make the builder read outside it, and a
// step cannot plant a device node in a layer (Diff refuses them).
package rootdiff

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Kind is the type of a filesystem entry.
type Kind uint8

// The kinds of entries. Sockets are not entries: a layer cannot hold them.
const (
	// KindDir is a directory.
	KindDir Kind = iota + 1
	// KindFile is a regular file.
	KindFile
	// KindSymlink is a symbolic link.
	KindSymlink
	// KindFifo is a named pipe.
	KindFifo
	// KindCharDevice is a character device node (recorded by Snapshot, refused by Diff).
	KindCharDevice
	// KindBlockDevice is a block device node (recorded by Snapshot, refused by Diff).
	KindBlockDevice
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindDir:
		return "directory"
	case KindFile:
		return "file"
	case KindSymlink:
		return "symbolic link"
	case KindFifo:
		return "fifo"
	case KindCharDevice:
		return "character device"
	case KindBlockDevice:
		return "block device"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Entry is what a Tree records of one filesystem entry.
type Entry struct {
	// Name is the slash-separated path relative to the root, without a leading ./ or /.
	Name string
	// Kind is the entry's type.
	Kind Kind
	// Mode holds the permission, set-user-ID, set-group-ID and sticky bits (st_mode & 07777).
	Mode uint32
	// UID and GID are the numeric owner and group.
	UID, GID int
	// Size is a regular file's size; 0 for other kinds.
	Size int64
	// ModTime is the modification time, to the nanosecond.
	ModTime time.Time
	// Target is a symbolic link's target, as stored (never resolved).
	Target string
	// Major and Minor are a device's numbers.
	Major, Minor uint32
	// Dev and Ino identify the inode; with Nlink, they find hard links. They are only
	// compared within one tree, never between trees (a copy has other inode numbers).
	Dev, Ino uint64
	// Nlink is the inode's link count (0 for directories).
	Nlink uint64
	// FirstLink is, for an entry that shares its inode with other entries of the tree (hard
	// links), the first of their names in layer order (possibly Name itself); empty
	// otherwise.
	FirstLink string
	// Digest is a regular file's content digest, "sha256:HEX". Snapshot always fills it;
	// a Tree returned by Diff has it for every regular file too.
	Digest string
}

// Tree records every entry under a directory, the directory itself excluded (a layer does
// not carry its root's attributes, as in Docker and BuildKit).
type Tree struct {
	entries map[string]*Entry
	// Sockets is the number of sockets found, which are left out.
	Sockets int
}

// Len returns the number of entries.
func (t *Tree) Len() int { return len(t.entries) }

// Entry returns the entry named name (slash-separated, relative to the root).
func (t *Tree) Entry(name string) (Entry, bool) {
	e, ok := t.entries[name]
	if !ok {
		return Entry{}, false
	}
	return *e, true
}

// Names returns the entries' names in layer order (see Compare).
func (t *Tree) Names() []string {
	names := make([]string, 0, len(t.entries))
	for n := range t.entries {
		names = append(names, n)
	}
	slices.SortFunc(names, Compare)
	return names
}

// Compare orders names as a layer lists them: component by component, so that a directory
// comes just before everything under it ("a", "a/b", "a-b", where plain string order would
// put "a-b" between "a" and "a/b").
func Compare(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		ca, cb := a[i], b[i]
		switch {
		case ca == cb:
			continue
		case ca == '/':
			return -1
		case cb == '/':
			return 1
		case ca < cb:
			return -1
		default:
			return 1
		}
	}
	return len(a) - len(b)
}

// linkKey identifies name's inode across trees: the first name of its hard-link group, or
// its own name.
func (t *Tree) linkKey(name string) string {
	if e := t.entries[name]; e != nil && e.FirstLink != "" {
		return e.FirstLink
	}
	return name
}

// groups returns the hard-link groups (names sorted in layer order), and sets FirstLink.
func (t *Tree) groups() [][]string {
	type inode struct{ dev, ino uint64 }
	byInode := map[inode][]string{}
	for _, e := range t.entries {
		if e.Kind != KindDir && e.Nlink > 1 {
			k := inode{e.Dev, e.Ino}
			byInode[k] = append(byInode[k], e.Name)
		}
	}
	var out [][]string
	for _, names := range byInode {
		if len(names) < 2 {
			continue // its other names are outside the tree
		}
		slices.SortFunc(names, Compare)
		for _, n := range names {
			t.entries[n].FirstLink = names[0]
		}
		out = append(out, names)
	}
	return out
}

// Snapshot records every entry under dir, hashing every regular file's content.
//
// Hashing costs a read of the whole tree, but it is what finds a file rewritten with the
// same size within one timestamp tick (the kernel's file times are coarse-grained, and a step
// can also set them back): a fingerprint of size, times and inode would miss it. Diff only
// hashes the files of the changed tree whose metadata matches, and the Tree it returns can
// serve as the next step's before when the next root is a copy that keeps modes, owners,
// times and hard links, so each file is read about once per step.
func Snapshot(dir string) (*Tree, error) {
	t := &Tree{entries: map[string]*Entry{}}
	s := &scanner{tree: t, hash: func(*Entry) bool { return true }}
	if err := s.scan(dir); err != nil {
		return nil, fmt.Errorf("snapshotting %s: %w", dir, err)
	}
	t.groups()
	return t, nil
}

// scanner walks a directory tree into a Tree without following symbolic links.
type scanner struct {
	tree *Tree
	// hash reports whether to hash the regular file e during the walk.
	hash func(e *Entry) bool
	// refuseDevices makes a device node an error.
	refuseDevices bool
}

func (s *scanner) scan(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	return s.dir(d, "")
}

// dir records the entries of the open directory d, whose name is rel ("" for the root).
func (s *scanner) dir(d *os.File, rel string) error {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("reading directory /%s: %w", rel, err)
	}
	slices.Sort(names)
	dfd := int(d.Fd())
	for _, n := range names {
		name := path.Join(rel, n)
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("reading /%s: %w", name, err)
		}
		e := &Entry{
			Name: name, Mode: uint32(st.Mode) & 0o7777, UID: int(st.Uid), GID: int(st.Gid),
			ModTime: time.Unix(st.Mtim.Unix()), Dev: uint64(st.Dev), Ino: uint64(st.Ino), Nlink: uint64(st.Nlink),
		}
		switch uint32(st.Mode) & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Kind, e.Nlink = KindDir, 0
			s.tree.entries[name] = e
			if err := s.subdir(dfd, n, e); err != nil {
				return err
			}
		case unix.S_IFREG:
			e.Kind, e.Size = KindFile, st.Size
			s.tree.entries[name] = e
			if s.hash(e) {
				f, err := openAt(dfd, n, e)
				if err != nil {
					return err
				}
				e.Digest, err = digest(f, e, io.Discard)
				f.Close()
				if err != nil {
					return err
				}
			}
		case unix.S_IFLNK:
			e.Kind = KindSymlink
			if e.Target, err = readlinkAt(dfd, n); err != nil {
				return fmt.Errorf("reading link /%s: %w", name, err)
			}
			s.tree.entries[name] = e
		case unix.S_IFIFO:
			e.Kind = KindFifo
			s.tree.entries[name] = e
		case unix.S_IFCHR, unix.S_IFBLK:
			e.Kind = KindCharDevice
			if uint32(st.Mode)&unix.S_IFMT == unix.S_IFBLK {
				e.Kind = KindBlockDevice
			}
			if s.refuseDevices {
				return fmt.Errorf("%w: /%s is a %s", ErrDevice, name, e.Kind)
			}
			e.Major, e.Minor = unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
			s.tree.entries[name] = e
		case unix.S_IFSOCK:
			s.tree.Sockets++
		default:
			return fmt.Errorf("/%s: unknown file type %#o", name, uint32(st.Mode)&unix.S_IFMT)
		}
	}
	return nil
}

// subdir walks the directory n of the directory dfd, which the walk recorded as e.
func (s *scanner) subdir(dfd int, n string, e *Entry) error {
	fd, err := unix.Openat(dfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening directory /%s: %w", e.Name, err)
	}
	d := os.NewFile(uintptr(fd), e.Name)
	defer d.Close()
	if err := same(d, e); err != nil {
		return err
	}
	return s.dir(d, e.Name)
}

// openAt opens the regular file n of the directory dfd, which the walk recorded as e. It
// never follows a link, never blocks on a fifo, and checks that it opened e's inode.
func openAt(dfd int, n string, e *Entry) (*os.File, error) {
	fd, err := unix.Openat(dfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /%s: %w", e.Name, err)
	}
	f := os.NewFile(uintptr(fd), e.Name)
	if err := same(f, e); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openPath opens the regular file e from the root directory root, one component at a time
// with O_NOFOLLOW, so that no symbolic link in the path is followed.
func openPath(root *os.File, e *Entry) (*os.File, error) {
	parts := strings.Split(e.Name, "/")
	dfd := int(root.Fd())
	for _, p := range parts[:len(parts)-1] {
		fd, err := unix.Openat(dfd, p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if dfd != int(root.Fd()) {
			unix.Close(dfd)
		}
		if err != nil {
			return nil, fmt.Errorf("opening /%s: %w: %w", e.Name, ErrChanged, err)
		}
		dfd = fd
	}
	f, err := openAt(dfd, parts[len(parts)-1], e)
	if dfd != int(root.Fd()) {
		unix.Close(dfd)
	}
	return f, err
}

// same checks that the open file f is the inode the walk recorded as e.
func same(f *os.File, e *Entry) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading /%s: %w", e.Name, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	want := map[Kind]fs.FileMode{KindDir: fs.ModeDir, KindFile: 0}[e.Kind]
	if !ok || uint64(st.Ino) != e.Ino || uint64(st.Dev) != e.Dev || fi.Mode().Type() != want {
		return fmt.Errorf("/%s: %w", e.Name, ErrChanged)
	}
	return nil
}

// digest copies the content of e, open as f, to w and returns its digest. The file must
// still have the size the walk recorded.
func digest(f *os.File, e *Entry, w io.Writer) (string, error) {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, w), io.LimitReader(f, e.Size))
	if err != nil {
		return "", fmt.Errorf("reading /%s: %w", e.Name, err)
	}
	var one [1]byte
	if m, _ := f.Read(one[:]); n != e.Size || m != 0 {
		return "", fmt.Errorf("/%s: %w (its size changed)", e.Name, ErrChanged)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// readlinkAt reads the target of the symbolic link n of the directory dfd.
func readlinkAt(dfd int, n string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		m, err := unix.Readlinkat(dfd, n, buf)
		if err != nil {
			return "", err
		}
		if m < size {
			return string(buf[:m]), nil
		}
	}
}

// Errors Snapshot and Diff can fail with, for errors.Is.
var (
	// ErrDevice: the changed tree holds a character or block device node.
	ErrDevice = errors.New("a build step may not create device nodes")
	// ErrWhiteoutName: an entry to write has a name starting with .wh., which layers
	// reserve for whiteouts.
	ErrWhiteoutName = errors.New("names starting with .wh. are reserved for whiteouts")
	// ErrChanged: the tree changed while it was being read.
	ErrChanged = errors.New("changed while being read")
)
