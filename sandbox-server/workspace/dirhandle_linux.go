//go:build linux

package workspace

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// dirHandle is one directory of the workspace, opened with openat2 beneath the root (see
// root_linux.go), in which files are created, replaced, removed and opened by single-component
// names with *at system calls on the raw descriptor. A single name never leaves the directory:
// every call here either does not follow a final symlink (O_NOFOLLOW without O_DIRECTORY,
// AT_SYMLINK_NOFOLLOW, renameat, unlinkat, mkdirat, symlinkat, readlinkat) or refuses one
// (openat2 with RESOLVE_NO_SYMLINKS). It is also fast: inside gVisor every system call is
// expensive, and os.File adds several per file (fcntl to switch blocking mode twice, epoll
// registration).
//
// Nothing is fsynced: the workspace is memory-backed and dies with the sandbox.
type dirHandle struct {
	fd int // O_PATH, or O_RDONLY for a directory being walked (getdents needs a readable fd)
}

func (d *dirHandle) close() { unix.Close(d.fd) }

// createTemp creates a new, exclusive temp file with permission bits perm (minus the umask).
func (d *dirHandle) createTemp(perm uint32) (string, handle, error) {
	for range 8 {
		name := tempName()
		fd, err := openat(d.fd, name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
		if err == syscall.EEXIST {
			continue // a name collision; try another name
		}
		if err != nil {
			return "", nil, &fs.PathError{Op: "openat", Path: name, Err: err}
		}
		return name, &rawFile{fd: fd, name: name}, nil
	}
	return "", nil, &fs.PathError{Op: "openat", Path: tempPrefix + "*", Err: syscall.EEXIST}
}

// commit renames tmp over name, replacing a file or symlink (never following it).
func (d *dirHandle) commit(tmp, name string) error {
	return d.rename(tmp, d, name)
}

// discard removes tmp, ignoring errors: it is cleanup after another failure.
func (d *dirHandle) discard(tmp string) {
	_ = unix.Unlinkat(d.fd, tmp, 0)
}

// openRead opens name for reading without following a symlink; errFollow says that name is a
// symlink, to be opened through the root instead. O_NONBLOCK keeps the open of a FIFO from
// hanging (it is then refused as not a regular file).
func (d *dirHandle) openRead(name string) (handle, error) {
	fd, err := openat(d.fd, name, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err == syscall.ELOOP {
		return nil, errFollow
	}
	if err != nil {
		return nil, &fs.PathError{Op: "openat", Path: name, Err: err}
	}
	return &rawFile{fd: fd, name: name}, nil
}

// lstat describes name itself (a symlink as a symlink).
func (d *dirHandle) lstat(name string) (fs.FileInfo, error) {
	var st unix.Stat_t
	err := ignoringEINTR(func() error { return unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	if err != nil {
		return nil, &fs.PathError{Op: "fstatat", Path: name, Err: err}
	}
	return newStatInfo(name, &st), nil
}

// readlink returns the target of symlink name.
func (d *dirHandle) readlink(name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		var n int
		err := ignoringEINTR(func() (err error) { n, err = unix.Readlinkat(d.fd, name, buf); return err })
		if err != nil {
			return "", &fs.PathError{Op: "readlinkat", Path: name, Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// mkdir creates directory name with permission bits mode (minus the umask).
func (d *dirHandle) mkdir(name string, mode uint32) error {
	if err := ignoringEINTR(func() error { return unix.Mkdirat(d.fd, name, mode) }); err != nil {
		return &fs.PathError{Op: "mkdirat", Path: name, Err: err}
	}
	return nil
}

// symlink creates symlink name with the given target.
func (d *dirHandle) symlink(target, name string) error {
	if err := ignoringEINTR(func() error { return unix.Symlinkat(target, d.fd, name) }); err != nil {
		return &os.LinkError{Op: "symlinkat", Old: target, New: name, Err: err}
	}
	return nil
}

// rename renames name to toName in directory to, replacing a file or symlink there (never
// following either name).
func (d *dirHandle) rename(name string, to *dirHandle, toName string) error {
	if err := ignoringEINTR(func() error { return unix.Renameat(d.fd, name, to.fd, toName) }); err != nil {
		return &os.LinkError{Op: "renameat", Old: name, New: toName, Err: err}
	}
	return nil
}

// renameNoReplace is rename that fails with EEXIST, atomically, when toName exists
// (renameat2 RENAME_NOREPLACE). Where the filesystem does not support the flag (EINVAL) it
// falls back to a check and a rename, which a concurrent create can race.
func (d *dirHandle) renameNoReplace(name string, to *dirHandle, toName string) error {
	err := ignoringEINTR(func() error { return unix.Renameat2(d.fd, name, to.fd, toName, unix.RENAME_NOREPLACE) })
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if _, lerr := to.lstat(toName); lerr == nil {
			err = unix.EEXIST
		} else {
			err = ignoringEINTR(func() error { return unix.Renameat(d.fd, name, to.fd, toName) })
		}
	}
	if err != nil {
		return &os.LinkError{Op: "renameat2", Old: name, New: toName, Err: err}
	}
	return nil
}

// remove removes a file, a symlink or an empty directory, as os.Remove does: unlink first,
// then rmdir, reporting the rmdir error unless name is not a directory.
func (d *dirHandle) remove(name string) error {
	err := ignoringEINTR(func() error { return unix.Unlinkat(d.fd, name, 0) })
	if err == nil {
		return nil
	}
	err1 := ignoringEINTR(func() error { return unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR) })
	if err1 == nil {
		return nil
	}
	if err1 != unix.ENOTDIR {
		err = err1
	}
	if err == unix.EEXIST {
		err = unix.ENOTEMPTY // some file systems say EEXIST for a non-empty directory
	}
	return &fs.PathError{Op: "remove", Path: name, Err: err}
}

// removeAll removes name and, if it is a directory, everything below it; a missing name is
// not an error. Symlinks are removed, never followed, even one swapped in for a directory
// while the tree is being removed.
func (d *dirHandle) removeAll(name string) error {
	return removeAllAt(d.fd, name, name)
}

// removeAllAt is removeAll of name in directory parent; rel names it in errors.
func removeAllAt(parent int, name, rel string) error {
	err := ignoringEINTR(func() error { return unix.Unlinkat(parent, name, 0) })
	if err == nil || err == unix.ENOENT {
		return nil
	}
	// EISDIR: a directory. EPERM or EACCES: perhaps a directory in a parent we may not write.
	if err != unix.EISDIR && err != unix.EPERM && err != unix.EACCES {
		return &fs.PathError{Op: "unlinkat", Path: rel, Err: err}
	}
	unlinkErr := err
	// Retried a few times: a command may be creating entries while the tree is removed.
	for attempt := 0; ; attempt++ {
		fd, err := openat2(parent, name, unix.O_RDONLY|unix.O_DIRECTORY, resolveName)
		switch err {
		case nil:
		case unix.ENOENT:
			return nil
		case unix.ELOOP: // swapped for a symlink: remove the link
			err := ignoringEINTR(func() error { return unix.Unlinkat(parent, name, 0) })
			if err != nil && err != unix.ENOENT {
				return &fs.PathError{Op: "unlinkat", Path: rel, Err: err}
			}
			return nil
		case unix.ENOTDIR:
			return &fs.PathError{Op: "unlinkat", Path: rel, Err: unlinkErr}
		default:
			return &fs.PathError{Op: "openat2", Path: rel, Err: err}
		}
		names, err := readNames(fd)
		if err != nil {
			unix.Close(fd)
			return &fs.PathError{Op: "getdents", Path: rel, Err: err}
		}
		var childErr error
		for _, n := range names {
			if err := removeAllAt(fd, n, rel+"/"+n); err != nil && childErr == nil {
				childErr = err
			}
		}
		unix.Close(fd)
		if childErr != nil {
			return childErr
		}
		err = ignoringEINTR(func() error { return unix.Unlinkat(parent, name, unix.AT_REMOVEDIR) })
		switch {
		case err == nil || err == unix.ENOENT:
			return nil
		case (err == unix.ENOTEMPTY || err == unix.EEXIST) && attempt < 8:
			continue
		default:
			return &fs.PathError{Op: "rmdir", Path: rel, Err: err}
		}
	}
}

// readDir describes the entries of a handle opened to walk it, from fstatat on its descriptor
// without following symlinks; entries removed since the directory was read are left out.
// (os.File.ReadDir is not used: for a file not opened through an os.Root, its DirEntry.Info
// lstats the directory's name joined with the entry's, a path resolved from the working
// directory.)
func (d *dirHandle) readDir() ([]fs.FileInfo, error) {
	names, err := readNames(d.fd)
	if err != nil {
		return nil, &fs.PathError{Op: "getdents", Path: ".", Err: err}
	}
	infos := make([]fs.FileInfo, 0, len(names))
	for _, name := range names {
		fi, err := d.lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		infos = append(infos, fi)
	}
	return infos, nil
}

// readNames returns the names in directory fd (read from its current offset), without "." and
// "..".
func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 16<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openSubdir opens directory name of a handle being walked, for listing. It never follows a
// symlink: a name that is now a symlink, missing, or not a directory (swapped since it was
// listed) is errSkip.
func (d *dirHandle) openSubdir(name, rel string) (*dirHandle, error) {
	fd, err := openat2(d.fd, name, unix.O_RDONLY|unix.O_DIRECTORY, resolveName)
	switch err {
	case nil:
		return &dirHandle{fd: fd}, nil
	case unix.ELOOP, unix.ENOENT, unix.ENOTDIR, unix.EXDEV:
		return nil, errSkip
	default:
		return nil, &fs.PathError{Op: "openat2", Path: rel, Err: err}
	}
}

func openat(dirfd int, name string, flags int, perm uint32) (int, error) {
	for {
		fd, err := syscall.Openat(dirfd, name, flags, perm)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

// rawFile is a file descriptor used with plain system calls: os.NewFile would add an fcntl.
type rawFile struct {
	fd   int
	name string
}

func (f *rawFile) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Write(f.fd, p[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "write", Path: f.name, Err: err}
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) Read(p []byte) (int, error) {
	for {
		n, err := syscall.Read(f.fd, p)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, &fs.PathError{Op: "read", Path: f.name, Err: err}
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func (f *rawFile) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Pread(f.fd, p[n:], off+int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "pread", Path: f.name, Err: err}
		}
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) chmod(m uint32) error {
	for {
		err := syscall.Fchmod(f.fd, m)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: "fchmod", Path: f.name, Err: err}
		}
		return nil
	}
}

func (f *rawFile) stat() (int64, fs.FileMode, error) {
	var st syscall.Stat_t
	for {
		err := syscall.Fstat(f.fd, &st)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, 0, &fs.PathError{Op: "fstat", Path: f.name, Err: err}
		}
		return st.Size, statMode(st.Mode), nil
	}
}

func (f *rawFile) Close() error {
	// close is not retried on EINTR: on Linux the descriptor is gone either way.
	if err := syscall.Close(f.fd); err != nil {
		return &fs.PathError{Op: "close", Path: f.name, Err: err}
	}
	return nil
}

// statMode converts st_mode to an fs.FileMode.
func statMode(m uint32) fs.FileMode {
	fm := goMode(m & 0o7777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		fm |= fs.ModeDir
	case syscall.S_IFLNK:
		fm |= fs.ModeSymlink
	case syscall.S_IFIFO:
		fm |= fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		fm |= fs.ModeSocket
	case syscall.S_IFCHR:
		fm |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		fm |= fs.ModeDevice
	default:
		fm |= fs.ModeIrregular
	}
	return fm
}

// statInfo is an fs.FileInfo from a stat system call.
type statInfo struct {
	name string
	st   unix.Stat_t
}

func newStatInfo(rel string, st *unix.Stat_t) *statInfo {
	_, name := splitRel(rel)
	return &statInfo{name: name, st: *st}
}

func (s *statInfo) Name() string       { return s.name }
func (s *statInfo) Size() int64        { return s.st.Size }
func (s *statInfo) Mode() fs.FileMode  { return statMode(s.st.Mode) }
func (s *statInfo) ModTime() time.Time { return time.Unix(s.st.Mtim.Unix()) }
func (s *statInfo) IsDir() bool        { return s.Mode().IsDir() }
func (s *statInfo) Sys() any           { return &s.st }
