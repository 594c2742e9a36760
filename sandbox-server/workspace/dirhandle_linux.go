//go:build linux

package workspace

import (
	"io"
	"io/fs"
	"os"
	"syscall"
)

// readFlags opens files for reading; O_NONBLOCK keeps opening a FIFO from hanging (it is then
// refused as not a regular file) and means nothing for regular files.
const readFlags = os.O_RDONLY | syscall.O_NONBLOCK

// dirHandle is one directory of the workspace, opened through the os.Root, in which files are
// created, replaced and opened by single-component names with *at system calls on the raw
// descriptor. A single name component opened with O_NOFOLLOW, or renamed with renameat (which
// never follows the final component), cannot leave the directory, so this is exactly as
// confined as os.Root, which does the same internally. It exists for speed: inside gVisor every
// system call is expensive, and os.File adds several per file (fcntl to switch blocking mode
// twice, epoll registration) on top of os.Root's per-component opens.
//
// Nothing is fsynced: the workspace is memory-backed and dies with the sandbox.
type dirHandle struct {
	f  *os.File // owns fd
	fd int
}

// openDirHandle opens directory rel of root; rel may run through symlinks inside the root.
func openDirHandle(root *os.Root, rel string) (*dirHandle, error) {
	// O_NONBLOCK keeps os from toggling the descriptor's blocking mode (and Fd from toggling it
	// back); it means nothing for a directory.
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	return &dirHandle{f: f, fd: int(f.Fd())}, nil
}

func (d *dirHandle) close() { d.f.Close() }

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
	for {
		err := syscall.Renameat(d.fd, tmp, d.fd, name)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &os.LinkError{Op: "renameat", Old: tmp, New: name, Err: err}
		}
		return nil
	}
}

// discard removes tmp, ignoring errors: it is cleanup after another failure.
func (d *dirHandle) discard(tmp string) {
	_ = syscall.Unlinkat(d.fd, tmp)
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
