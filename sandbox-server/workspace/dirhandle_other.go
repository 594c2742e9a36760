//go:build !linux

package workspace

import (
	"errors"
	"io/fs"
	"os"
)

// readFlags opens files for reading.
const readFlags = os.O_RDONLY

// dirHandle is one directory of the workspace as a sub-root. The sandbox server runs on Linux,
// where dirhandle_linux.go uses raw *at system calls; this portable version keeps the package
// building and testable elsewhere.
type dirHandle struct {
	r *os.Root
}

func openDirHandle(root *os.Root, rel string) (*dirHandle, error) {
	r, err := root.OpenRoot(rel)
	if err != nil {
		return nil, err
	}
	return &dirHandle{r: r}, nil
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

func (d *dirHandle) openRead(name string) (handle, error) { return nil, errFollow }
