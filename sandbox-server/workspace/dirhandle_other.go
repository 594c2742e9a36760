//go:build !linux

package workspace

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// dirHandle is one directory of the workspace as a sub-root. The sandbox server runs on Linux,
// where dirhandle_linux.go uses raw *at system calls; this portable version keeps the package
// building and testable elsewhere.
type dirHandle struct {
	top *os.Root // the workspace root, for renames between directories
	rel string   // this directory's path in top
	r   *os.Root
}

func (d *dirHandle) close() { d.r.Close() }

func (d *dirHandle) createTemp(perm uint32) (string, handle, error) {
	for range 8 {
		name := tempName()
		f, err := d.r.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, goMode(perm))
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", nil, err
		}
		return name, osFile{f}, nil
	}
	return "", nil, &fs.PathError{Op: "openat", Path: tempPrefix + "*", Err: fs.ErrExist}
}

func (d *dirHandle) commit(tmp, name string) error { return d.r.Rename(tmp, name) }

func (d *dirHandle) discard(tmp string) { _ = d.r.Remove(tmp) }

// openRead opens a file that is not a symlink; errFollow says that name is a symlink.
func (d *dirHandle) openRead(name string) (handle, error) {
	fi, err := d.r.Lstat(name)
	if err != nil {
		return nil, tagEscape(err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, errFollow
	}
	f, err := d.r.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, tagEscape(err)
	}
	return osFile{f}, nil
}

func (d *dirHandle) lstat(name string) (fs.FileInfo, error) {
	fi, err := d.r.Lstat(name)
	return fi, tagEscape(err)
}

func (d *dirHandle) readlink(name string) (string, error) {
	t, err := d.r.Readlink(name)
	return t, tagEscape(err)
}

func (d *dirHandle) mkdir(name string, mode uint32) error {
	return tagEscape(d.r.Mkdir(name, goMode(mode)))
}

func (d *dirHandle) symlink(target, name string) error {
	return tagEscape(d.r.Symlink(target, name))
}

func (d *dirHandle) rename(name string, to *dirHandle, toName string) error {
	return tagEscape(d.top.Rename(joinRel(d.rel, name), joinRel(to.rel, toName)))
}

// renameNoReplace is rename that fails with EEXIST when toName exists (a check, then the
// rename: not atomic here; the Linux build uses renameat2 RENAME_NOREPLACE).
func (d *dirHandle) renameNoReplace(name string, to *dirHandle, toName string) error {
	if _, err := to.lstat(toName); err == nil {
		return &os.LinkError{Op: "rename", Old: name, New: toName, Err: syscall.EEXIST}
	}
	return d.rename(name, to, toName)
}

func (d *dirHandle) remove(name string) error {
	err := d.r.Remove(name)
	if errors.Is(err, syscall.EEXIST) {
		err = &fs.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
	}
	return tagEscape(err)
}

func (d *dirHandle) removeAll(name string) error { return tagEscape(d.r.RemoveAll(name)) }

func (d *dirHandle) readDir() ([]fs.FileInfo, error) {
	f, err := d.r.Open(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// A file opened through a Root lstats each entry relative to the directory descriptor.
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	infos := make([]fs.FileInfo, 0, len(entries))
	for _, de := range entries {
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the directory was read
		}
		if err != nil {
			return nil, err
		}
		infos = append(infos, fi)
	}
	return infos, nil
}

func (d *dirHandle) openSubdir(name, rel string) (*dirHandle, error) {
	sub, err := d.r.OpenRoot(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || isRootEscape(err) || isNotDir(err) {
			return nil, errSkip // removed or swapped since it was listed
		}
		return nil, err
	}
	return &dirHandle{top: d.top, rel: rel, r: sub}, nil
}

// isNotDir reports whether err says that a path is not a directory: ENOTDIR, or the untyped
// error os.Root.OpenRoot returns for a non-directory.
func isNotDir(err error) bool {
	var pe *fs.PathError
	return errors.Is(err, syscall.ENOTDIR) || errors.As(err, &pe) && pe.Err.Error() == syscall.ENOTDIR.Error()
}

// osFile adapts an *os.File opened through the root to handle.
type osFile struct{ *os.File }

func (f osFile) chmod(m uint32) error { return f.Chmod(goMode(m)) }

func (f osFile) stat() (int64, fs.FileMode, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	return fi.Size(), fi.Mode(), nil
}
