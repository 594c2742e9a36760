// Package seed copies a template image's /workspace into a sandbox's workspace when the
// sandbox server starts. The workspace is a tmpfs mounted over the image's /workspace, which
// it hides; the host binds the image's directory read-only elsewhere in the sandbox, and the
// server copies it in before it listens, so that a warm sandbox already holds the files and
// an allocation waits for nothing.
//
// The copy keeps directories, regular files (contents and mode bits) and symbolic links (as
// links, never followed), and, run as root with CAP_CHOWN, the owners the image gave them. It
// refuses devices, fifos and sockets. Both trees are opened as an os.Root, so that neither a
// link in the image nor one made meanwhile leads the copy outside them. Hard links become
// separate files.
package seed

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
)

// ErrUnsupported is wrapped by Copy's error for an entry that is neither a directory, a
// regular file nor a symbolic link (a device, a fifo, a socket).
var ErrUnsupported = errors.New("not a directory, regular file or symbolic link")

// Stats is what Copy copied.
type Stats struct {
	Dirs, Files, Links int
	// Bytes is the regular files' total size.
	Bytes int64
}

// Copy copies the tree under the directory src into the existing directory dst: what src
// holds, not src itself (dst keeps its own mode and owner, the workspace's). An entry of dst
// in the way is an error (fs.ErrExist): dst is meant to be an empty workspace. Owners are
// kept when the process runs as root; otherwise the copies are its user's. On error, what
// was copied so far stays.
func Copy(src, dst string) (Stats, error) {
	s, err := os.OpenRoot(src)
	if err != nil {
		return Stats{}, fmt.Errorf("opening the seed %s: %w", src, err)
	}
	defer s.Close()
	d, err := os.OpenRoot(dst)
	if err != nil {
		return Stats{}, fmt.Errorf("opening the workspace %s: %w", dst, err)
	}
	defer d.Close()
	c := &copier{src: s, dst: d, chown: os.Geteuid() == 0}
	err = c.dirContents(".")
	return c.stats, err
}

// copier copies one tree; it is used by one goroutine.
type copier struct {
	src, dst *os.Root
	chown    bool // keep owners (the process is root)
	stats    Stats
}

// dirContents copies the entries of directory name (relative to both roots, which both have
// it).
func (c *copier) dirContents(name string) error {
	f, err := c.src.Open(name)
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	for _, e := range entries {
		if err := c.entry(path.Join(name, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// entry copies name, of whatever type it has in the source.
func (c *copier) entry(name string) error {
	fi, err := c.src.Lstat(name)
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	switch t := fi.Mode().Type(); {
	case t == fs.ModeDir:
		return c.dir(name, fi)
	case t.IsRegular():
		return c.file(name, fi)
	case t == fs.ModeSymlink:
		return c.link(name, fi)
	default:
		return fmt.Errorf("%s is a %s: %w", name, typeName(t), ErrUnsupported)
	}
}

// dir makes directory name, copies its contents, and only then gives it its owner and mode,
// which may forbid the writes of the copy.
func (c *copier) dir(name string, fi fs.FileInfo) error {
	if err := c.dst.Mkdir(name, 0o700); err != nil {
		return fmt.Errorf("making directory %s: %w", name, err)
	}
	c.stats.Dirs++
	if err := c.dirContents(name); err != nil {
		return err
	}
	if err := c.own(name, fi, c.dst.Lchown); err != nil {
		return err
	}
	if err := c.dst.Chmod(name, chmodBits(fi.Mode())); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", name, err)
	}
	return nil
}

// file copies regular file name: contents, owner, then mode (a change of owner clears the
// set-id bits).
func (c *copier) file(name string, fi fs.FileInfo) error {
	in, err := c.src.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	defer in.Close()
	out, err := c.dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	n, err := io.Copy(out, in)
	if err == nil {
		err = c.own(name, fi, func(_ string, uid, gid int) error { return out.Chown(uid, gid) })
	}
	if err == nil {
		if err = out.Chmod(chmodBits(fi.Mode())); err != nil {
			err = fmt.Errorf("setting the mode of %s: %w", name, err)
		}
	}
	if cerr := out.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying %s: %w", name, err)
	}
	c.stats.Files++
	c.stats.Bytes += n
	return nil
}

// link copies symbolic link name as a link to the same target, which is not followed.
func (c *copier) link(name string, fi fs.FileInfo) error {
	target, err := c.src.Readlink(name)
	if err != nil {
		return fmt.Errorf("reading link %s: %w", name, err)
	}
	if err := c.dst.Symlink(target, name); err != nil {
		return fmt.Errorf("making link %s: %w", name, err)
	}
	c.stats.Links++
	return c.own(name, fi, c.dst.Lchown)
}

// own gives name the owner fi has, through chown (which must not follow a link), if owners
// are kept.
func (c *copier) own(name string, fi fs.FileInfo, chown func(name string, uid, gid int) error) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !c.chown || !ok {
		return nil
	}
	if err := chown(name, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("giving %s to %d:%d: %w", name, st.Uid, st.Gid, err)
	}
	return nil
}

// chmodBits are the permission, set-id and sticky bits of m, as Chmod takes them.
func chmodBits(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// typeName names a file type Copy refuses.
func typeName(t fs.FileMode) string {
	switch {
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "block device"
	case t&fs.ModeNamedPipe != 0:
		return "fifo"
	case t&fs.ModeSocket != 0:
		return "socket"
	}
	return "file of type " + t.String()
}

// Measure returns the total size of the regular files under the directory dir (hard links
// count once per name, as Copy makes them separate files) and whether dir holds nothing. It
// follows no link, dir itself included, and refuses (ErrUnsupported) what Copy refuses, so
// that a tree it accepts is one Copy copies, space permitting.
func Measure(dir string) (size int64, empty bool, err error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return 0, false, err
	}
	if t := fi.Mode().Type(); t != fs.ModeDir {
		if t == fs.ModeSymlink {
			target, _ := os.Readlink(dir)
			return 0, false, fmt.Errorf("%s is a symbolic link (to %q), not a directory", dir, target)
		}
		return 0, false, fmt.Errorf("%s is not a directory", dir)
	}
	empty = true
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		empty = false
		switch t := d.Type(); {
		case t.IsDir(), t == fs.ModeSymlink:
			return nil
		case t.IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			size += info.Size()
			return nil
		default:
			rel, _ := filepath.Rel(dir, p)
			return fmt.Errorf("%s is a %s: %w", rel, typeName(t), ErrUnsupported)
		}
	})
	if err != nil {
		return 0, false, err
	}
	return size, empty, nil
}
