//go:build linux

package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Path resolution on Linux is done by the kernel: openat2 with RESOLVE_BENEATH follows ".."
// and symlinks only while they stay below the directory it starts from, and fails with EXDEV
// otherwise (an absolute symlink target is always an escape). RESOLVE_NO_MAGICLINKS refuses
// /proc-style links. Nothing is resolved by component-wise openat with O_NOFOLLOW|O_DIRECTORY,
// as os.Root does: the pinned gVisor follows a symlink for exactly that flag combination
// (gVisor issue 14786), which let the server write, read and remove outside the workspace.
const (
	resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS
	// resolveName opens a single name, never through a symlink: walks and MkdirAll use it so
	// that a directory swapped for a symlink is not descended into.
	resolveName = resolveBeneath | unix.RESOLVE_NO_SYMLINKS
)

// errNoOpenat2 is the refusal of Open on a kernel without openat2.
var errNoOpenat2 = errors.New("kernel lacks openat2 (Linux >= 5.6 or a current gVisor needed): refusing to serve an unjailed workspace")

// rootDir is the workspace root: an O_PATH descriptor from which every client path is
// resolved with openat2.
type rootDir struct {
	mu sync.RWMutex // guards fd: held for reading by every use, for writing by close
	fd int          // -1 once closed
}

func openRootDir(dir string) (*rootDir, error) {
	fd, err := openat(unix.AT_FDCWD, dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	// Probe openat2 once: without it there is no safe way to resolve paths here.
	probe, err := openat2(fd, ".", unix.O_PATH|unix.O_DIRECTORY, resolveBeneath)
	if err != nil {
		unix.Close(fd)
		if err == unix.ENOSYS {
			return nil, errNoOpenat2
		}
		return nil, fmt.Errorf("probing openat2: %w", err)
	}
	unix.Close(probe)
	return &rootDir{fd: fd}, nil
}

func (r *rootDir) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fd < 0 {
		return os.ErrClosed
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// open resolves rel beneath the root with openat2.
func (r *rootDir) open(rel string, flags int, resolve uint64) (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.fd < 0 {
		return -1, &fs.PathError{Op: "openat2", Path: rel, Err: os.ErrClosed}
	}
	fd, err := openat2(r.fd, rel, flags, resolve)
	if err != nil {
		return -1, openErr(rel, err)
	}
	return fd, nil
}

// openDir opens directory rel (which may run through symlinks inside the root) as an O_PATH
// handle for single-name *at operations.
func (r *rootDir) openDir(rel string) (*dirHandle, error) {
	fd, err := r.open(rel, unix.O_PATH|unix.O_DIRECTORY, resolveBeneath)
	if err != nil {
		return nil, err
	}
	return &dirHandle{fd: fd}, nil
}

// openList opens directory rel for reading its entries (a walk's start).
func (r *rootDir) openList(rel string) (*dirHandle, error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, resolveBeneath)
	if err != nil {
		return nil, err
	}
	return &dirHandle{fd: fd}, nil
}

// openRead opens rel for reading, following symlinks (a final one too) inside the root.
func (r *rootDir) openRead(rel string) (handle, error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_NONBLOCK, resolveBeneath)
	if err != nil {
		return nil, err
	}
	return &rawFile{fd: fd, name: rel}, nil
}

// stat describes rel, following symlinks (a final one too) inside the root.
func (r *rootDir) stat(rel string) (fs.FileInfo, error) {
	fd, err := r.open(rel, unix.O_PATH, resolveBeneath)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: rel, Err: err}
	}
	return newStatInfo(rel, &st), nil
}

// mkdirAll creates directory rel and its missing parents with permission bits mode (minus the
// umask). Each missing component is made with mkdirat on its parent's descriptor and opened
// without following symlinks; a symlink in the way is followed only if it stays beneath the
// root, by resolving the whole prefix again from the root.
func (r *rootDir) mkdirAll(rel string, mode uint32) error {
	fd, err := r.open(rel, unix.O_PATH|unix.O_DIRECTORY, resolveBeneath)
	if err == nil {
		unix.Close(fd) // the common case: it exists
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.fd < 0 {
		return &fs.PathError{Op: "mkdir", Path: rel, Err: os.ErrClosed}
	}
	parent := r.fd
	defer func() {
		if parent != r.fd {
			unix.Close(parent)
		}
	}()
	prefix := "."
	for name := range strings.SplitSeq(rel, "/") {
		prefix = joinRel(prefix, name)
		err := ignoringEINTR(func() error { return unix.Mkdirat(parent, name, mode) })
		if err != nil && err != unix.EEXIST {
			return &fs.PathError{Op: "mkdirat", Path: prefix, Err: err}
		}
		next, err := openat2(parent, name, unix.O_PATH|unix.O_DIRECTORY, resolveName)
		if err == unix.ELOOP || err == unix.ENOTDIR {
			// A symlink (or a file) is in the way.
			next, err = openat2(r.fd, prefix, unix.O_PATH|unix.O_DIRECTORY, resolveBeneath)
		}
		if err != nil {
			return openErr(prefix, err)
		}
		if parent != r.fd {
			unix.Close(parent)
		}
		parent = next
	}
	return nil
}

// openErr describes a failed openat2 of rel; EXDEV, the kernel's verdict on a path leaving the
// directory it was resolved from, becomes ErrEscape.
func openErr(rel string, err error) error {
	if err == unix.EXDEV {
		return &fs.PathError{Op: "openat2", Path: rel, Err: ErrEscape}
	}
	return &fs.PathError{Op: "openat2", Path: rel, Err: err}
}

// openat2 opens path beneath dirfd. EAGAIN, which RESOLVE_BENEATH returns when a concurrent
// rename or mount anywhere in the system may have raced with resolving "..", is retried.
func openat2(dirfd int, path string, flags int, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags) | unix.O_CLOEXEC, Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, path, &how)
		if err == unix.EINTR || err == unix.EAGAIN && i < 128 {
			continue
		}
		return fd, err
	}
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// CheckJail verifies, in a fresh temporary directory under dir, that the kernel confines path
// resolution the way this package relies on: openat2 with RESOLVE_BENEATH refuses a symlink
// to "/" (EXDEV) and RESOLVE_NO_SYMLINKS refuses one inside, a plain O_NOFOLLOW open of a
// symlink fails (ELOOP), and O_PATH|O_NOFOLLOW|O_DIRECTORY on a symlink gives ENOTDIR. It
// removes the temporary directory. fusebox-sandbox calls it at start and refuses to serve a
// workspace it cannot jail.
func CheckJail(dir string) (err error) {
	tmp, err := os.MkdirTemp(dir, ".fusebox-jailcheck-")
	if err != nil {
		return fmt.Errorf("checking the path jail: %w", err)
	}
	parent, err := openat(unix.AT_FDCWD, filepath.Dir(tmp), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("checking the path jail: opening %s: %w", dir, err)
	}
	defer unix.Close(parent)
	defer func() {
		// Removed through descriptors, never following the links made here.
		if rerr := removeAllAt(parent, filepath.Base(tmp), tmp); rerr != nil && err == nil {
			err = fmt.Errorf("checking the path jail: removing %s: %w", tmp, rerr)
		}
	}()
	fd, err := openat2(parent, filepath.Base(tmp), unix.O_PATH|unix.O_DIRECTORY, resolveName)
	if err == unix.ENOSYS {
		return fmt.Errorf("checking the path jail: %w", errNoOpenat2)
	}
	if err != nil {
		return fmt.Errorf("checking the path jail: opening %s: %w", tmp, err)
	}
	defer unix.Close(fd)
	d := &dirHandle{fd: fd}
	for _, mk := range []func() error{
		func() error { return d.symlink("/", "out") },
		func() error { return d.mkdir("d", 0o700) },
		func() error { return d.symlink("d", "in") },
	} {
		if err := mk(); err != nil {
			return fmt.Errorf("checking the path jail: %w", err)
		}
	}

	checks := []struct {
		what string
		open func() (int, error)
		want syscall.Errno // 0: must open
	}{
		{"openat2(RESOLVE_BENEATH) of a directory", func() (int, error) {
			return openat2(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, resolveBeneath)
		}, 0},
		{"openat2(RESOLVE_BENEATH) of a symlink to /", func() (int, error) {
			return openat2(fd, "out", unix.O_RDONLY|unix.O_DIRECTORY, resolveBeneath)
		}, unix.EXDEV},
		{"openat2(RESOLVE_BENEATH) through a symlink to /", func() (int, error) {
			return openat2(fd, "out/tmp", unix.O_PATH|unix.O_DIRECTORY, resolveBeneath)
		}, unix.EXDEV},
		{"openat2(RESOLVE_NO_SYMLINKS) of a symlink to a directory", func() (int, error) {
			return openat2(fd, "in", unix.O_RDONLY|unix.O_DIRECTORY, resolveName)
		}, unix.ELOOP},
		{"openat(O_NOFOLLOW) of a symlink", func() (int, error) {
			return openat(fd, "in", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}, unix.ELOOP},
		{"openat(O_PATH|O_NOFOLLOW|O_DIRECTORY) of a symlink", func() (int, error) {
			return openat(fd, "out", unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		}, unix.ENOTDIR},
	}
	for _, c := range checks {
		got, err := c.open()
		if err == nil {
			unix.Close(got)
		}
		switch {
		case err == unix.ENOSYS:
			return fmt.Errorf("checking the path jail: %s: %w", c.what, errNoOpenat2)
		case c.want == 0 && err != nil:
			return fmt.Errorf("checking the path jail: %s: %w", c.what, err)
		case c.want != 0 && err == nil:
			return fmt.Errorf("checking the path jail: %s succeeded, want %v: the kernel does not confine paths; refusing to serve the workspace", c.what, c.want)
		case c.want != 0 && err != c.want:
			return fmt.Errorf("checking the path jail: %s: got %v, want %v", c.what, err, c.want)
		}
	}
	return nil
}
