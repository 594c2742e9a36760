//go:build !linux

package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// rootDir is the workspace root as an os.Root. The sandbox server runs on Linux, where
// root_linux.go resolves paths with openat2; this portable version keeps the package
// building and testable elsewhere.
type rootDir struct {
	r *os.Root
}

func openRootDir(dir string) (*rootDir, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &rootDir{r: r}, nil
}

func (r *rootDir) close() error { return r.r.Close() }

func (r *rootDir) openDir(rel string) (*dirHandle, error) {
	sub, err := r.r.OpenRoot(rel)
	if err != nil {
		return nil, tagEscape(err)
	}
	return &dirHandle{top: r.r, rel: rel, r: sub}, nil
}

func (r *rootDir) openList(rel string) (*dirHandle, error) {
	d, err := r.openDir(rel)
	if isNotDir(err) {
		// os.Root reports a non-directory with an untyped error and the host path.
		return nil, &fs.PathError{Op: "open", Path: rel, Err: syscall.ENOTDIR}
	}
	return d, err
}

func (r *rootDir) openRead(rel string) (handle, error) {
	f, err := r.r.OpenFile(rel, os.O_RDONLY, 0)
	if err != nil {
		return nil, tagEscape(err)
	}
	return osFile{f}, nil
}

func (r *rootDir) stat(rel string) (fs.FileInfo, error) {
	fi, err := r.r.Stat(rel)
	return fi, tagEscape(err)
}

func (r *rootDir) mkdirAll(rel string, mode uint32) error {
	return tagEscape(r.r.MkdirAll(rel, goMode(mode)))
}

// CheckJail is a no-op here: os.Root confines paths on this platform. See root_linux.go.
func CheckJail(dir string) error { return nil }

// osRootEscapeMsg is the text of os.Root's unexported escape error (os.errPathEscapes). A test
// asserts that os.Root still uses it, so a change in a Go release fails loudly rather than
// silently turning escapes into I/O errors.
const osRootEscapeMsg = "path escapes from parent"

// isRootEscape reports whether err, anywhere in its chain, is os.Root's escape error.
func isRootEscape(err error) bool {
	for err != nil {
		if err.Error() == osRootEscapeMsg {
			return true
		}
		switch e := err.(type) {
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				if isRootEscape(inner) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// tagEscape tags os.Root's escape errors with ErrEscape.
func tagEscape(err error) error {
	if err != nil && isRootEscape(err) && !errors.Is(err, ErrEscape) {
		return fmt.Errorf("%w: %w", ErrEscape, err)
	}
	return err
}
