package watch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// dirMask is what every watched directory reports.
	dirMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE |
		unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK
	// rootMask adds the watched directory's own end.
	rootMask = dirMask | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	// childResolve opens one name inside a watched directory: never through a symlink.
	childResolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
)

// addTree watches directory rel, open as dfd, and with a recursive watch the directories
// below it, each opened by name from its parent without following symlinks. With report,
// every entry found is reported as created: they appeared in a new directory before its
// watch was in place. Errors of a subdirectory that vanished or was swapped for something
// else meanwhile are ignored (its removal is reported by its parent's watch).
func (w *Watcher) addTree(dfd int, rel string, depth int, report bool) error {
	mask := uint32(dirMask)
	if depth == 0 && !report {
		mask = rootMask
	}
	wd, err := w.addWatch(dfd, mask)
	if err != nil {
		return fmt.Errorf("adding an inotify watch of %q: %w", rel, err)
	}
	if depth == 0 && !report {
		w.rootWd = wd
	}
	w.dirs[wd] = rel
	w.wds[rel] = wd
	if !w.recursive {
		return nil
	}
	ents, err := readDir(dfd)
	if err != nil {
		return fmt.Errorf("listing %q: %w", rel, err)
	}
	for _, e := range ents {
		p := joinRel(rel, e.name)
		if report {
			w.emit(Change{Path: p, Kind: Create, IsDir: e.dir})
		}
		if !e.dir || w.excluded(e.name) || depth+1 >= maxDepth {
			continue
		}
		cfd, err := openat2(dfd, e.name, unix.O_RDONLY|unix.O_DIRECTORY, childResolve)
		if err != nil {
			if gone(err) {
				continue
			}
			return fmt.Errorf("opening %q: %w", p, err)
		}
		err = w.addTree(cfd, p, depth+1, report)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// gone reports whether opening a listed directory failed because it is no longer one.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV)
}

// addWatch adds an inotify watch of the directory open as dfd, through its descriptor (the
// magic link /proc/self/fd/N names exactly the directory opened beneath the root).
func (w *Watcher) addWatch(dfd int, mask uint32) (int32, error) {
	wd, err := -1, error(os.ErrClosed)
	w.control(func(ifd int) {
		wd, err = unix.InotifyAddWatch(ifd, "/proc/self/fd/"+strconv.Itoa(dfd), mask)
	})
	return int32(wd), err
}

// addNew watches a directory that appeared at rel (created or moved in), and what it holds.
// A failure other than its disappearance loses its changes: that is reported as an overflow.
func (w *Watcher) addNew(rel string) {
	parent, name := splitRel(rel)
	pfd, err := openat2(w.root.fd, parent, unix.O_PATH|unix.O_DIRECTORY, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_MAGICLINKS)
	if err == nil {
		var cfd int
		cfd, err = openat2(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY, childResolve)
		unix.Close(pfd)
		if err == nil {
			depth := strings.Count(rel, "/") - strings.Count(w.rel, "/")
			if w.rel == "." {
				depth++
			}
			err = w.addTree(cfd, rel, depth, true)
			unix.Close(cfd)
		}
	}
	if err != nil && !gone(err) && !errors.Is(err, os.ErrClosed) {
		w.q.lost()
	}
}

// removeTree forgets the watches of directory rel and those below it (moved out of the tree).
func (w *Watcher) removeTree(rel string) {
	for wd, d := range w.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			w.control(func(fd int) { unix.InotifyRmWatch(fd, uint32(wd)) })
			delete(w.dirs, wd)
			delete(w.wds, d)
		}
	}
}

// renameTree moves the paths of the watches of directory from and those below it to to.
func (w *Watcher) renameTree(from, to string) {
	for wd, d := range w.dirs {
		if d == from || strings.HasPrefix(d, from+"/") {
			nd := to + d[len(from):]
			delete(w.wds, d)
			w.dirs[wd] = nd
			w.wds[nd] = wd
		}
	}
}

// control runs f with the inotify descriptor, unless it is closed: holding it open meanwhile,
// so that f never reaches a descriptor reused for something else.
func (w *Watcher) control(f func(fd int)) {
	rc, err := w.file.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) { f(int(fd)) })
}

// read is the reader goroutine: it turns inotify events into changes until the descriptor is
// closed, reading fails or the watched directory is gone, then ends the queue.
func (w *Watcher) read() {
	defer close(w.done)
	end := w.readLoop()
	w.q.close(end)
}

func (w *Watcher) readLoop() error {
	rc, err := w.file.SyscallConn()
	if err != nil {
		return fmt.Errorf("reading inotify: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf)
			if rerr == unix.EAGAIN {
				// Nothing more for now: a move out of a directory whose arrival has not
				// followed went out of the watched tree.
				w.flushMoved()
				return false
			}
			return true
		})
		switch {
		case err != nil:
			return errClosed
		case rerr == unix.EINTR:
			continue
		case rerr != nil:
			return fmt.Errorf("reading inotify: %w", rerr)
		}
		if err := w.handle(buf[:n]); err != nil {
			return err
		}
	}
}

// handle turns one read's inotify events into changes. It returns io.EOF once the watched
// directory itself is gone.
func (w *Watcher) handle(b []byte) error {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		size := unix.SizeofInotifyEvent + int(ev.Len)
		if size > len(b) {
			return fmt.Errorf("reading inotify: a truncated event")
		}
		name := string(b[unix.SizeofInotifyEvent:size])
		if i := strings.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		b = b[size:]
		mask, wd := ev.Mask, ev.Wd

		if w.moved != nil && (mask&unix.IN_MOVED_TO == 0 || ev.Cookie != w.moved.cookie) {
			w.flushMoved()
		}
		if mask&unix.IN_Q_OVERFLOW != 0 {
			w.q.lost()
			continue
		}
		if wd == w.rootWd && mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
			w.q.push(Change{Path: w.rel, Kind: Remove, IsDir: true})
			return io.EOF
		}
		dir, ok := w.dirs[wd]
		if mask&unix.IN_IGNORED != 0 {
			if ok {
				delete(w.dirs, wd)
				if w.wds[dir] == wd {
					delete(w.wds, dir)
				}
			}
			continue
		}
		if !ok || name == "" {
			continue // a directory already forgotten, or an event about a directory itself
		}
		p := joinRel(dir, name)
		isDir := mask&unix.IN_ISDIR != 0
		switch {
		case mask&unix.IN_CREATE != 0:
			w.emit(Change{Path: p, Kind: Create, IsDir: isDir})
			if isDir && w.recursive && !w.excluded(name) {
				w.addNew(p)
			}
		case mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0:
			w.emit(Change{Path: p, Kind: Write, IsDir: isDir})
		case mask&unix.IN_DELETE != 0:
			w.emit(Change{Path: p, Kind: Remove, IsDir: isDir})
		case mask&unix.IN_MOVED_FROM != 0:
			w.moved = &movedFrom{cookie: ev.Cookie, path: p, isDir: isDir}
		case mask&unix.IN_MOVED_TO != 0:
			from := w.moved
			w.moved = nil
			if from != nil {
				w.emit(Change{Path: p, Kind: Rename, IsDir: isDir, OldPath: from.path})
				if isDir && w.recursive {
					w.renameTree(from.path, p)
					if w.excluded(name) {
						w.removeTree(p)
					}
				}
				continue
			}
			w.emit(Change{Path: p, Kind: Rename, IsDir: isDir})
			if isDir && w.recursive && !w.excluded(name) {
				w.addNew(p)
			}
		}
	}
	return nil
}

// flushMoved reports a move out of a watched directory whose arrival did not follow: the file
// left the watched tree.
func (w *Watcher) flushMoved() {
	m := w.moved
	if m == nil {
		return
	}
	w.moved = nil
	w.emit(Change{Path: m.path, Kind: Remove, IsDir: m.isDir})
	if m.isDir && w.recursive {
		w.removeTree(m.path)
	}
}

// emit queues c if the request's globs let it through. A change of one of the workspace's
// in-flight writes (Options.TempPrefix) is not reported, and its rename into place is the
// creation of its target.
func (w *Watcher) emit(c Change) {
	if t := w.root.opts.TempPrefix; t != "" {
		if strings.HasPrefix(path.Base(c.Path), t) {
			return
		}
		if c.Kind == Rename && strings.HasPrefix(path.Base(c.OldPath), t) {
			c.Kind, c.OldPath = Create, ""
		}
	}
	if w.passes(path.Base(c.Path)) || c.OldPath != "" && w.passes(path.Base(c.OldPath)) {
		w.q.push(c)
	}
}

// passes reports whether a change of a path with base name name is reported.
func (w *Watcher) passes(name string) bool {
	return (len(w.include) == 0 || matchAny(w.include, name)) && !matchAny(w.exclude, name)
}

// excluded reports whether a recursive watch leaves directory name unwatched.
func (w *Watcher) excluded(name string) bool {
	return matchAny(w.exclude, name)
}

func matchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// dirent is one entry of a directory listing.
type dirent struct {
	name string
	dir  bool
}

// readDir lists the directory open as dfd (from its current offset), without following
// symlinks: an entry of unknown type is examined with fstatat on dfd.
func readDir(dfd int) ([]dirent, error) {
	var out []dirent
	buf := make([]byte, 16<<10)
	for {
		n, err := unix.Getdents(dfd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		for b := buf[:n]; len(b) > 0; {
			d := (*unix.Dirent)(unsafe.Pointer(&b[0]))
			if d.Reclen == 0 || int(d.Reclen) > len(b) {
				return nil, errors.New("a malformed directory entry")
			}
			rec := b[:d.Reclen]
			b = b[d.Reclen:]
			off := int(unsafe.Offsetof(d.Name))
			name := rec[off:]
			if i := strings.IndexByte(string(name), 0); i >= 0 {
				name = name[:i]
			}
			s := string(name)
			if s == "." || s == ".." || d.Ino == 0 {
				continue
			}
			isDir := d.Type == unix.DT_DIR
			if d.Type == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if unix.Fstatat(dfd, s, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
					isDir = st.Mode&unix.S_IFMT == unix.S_IFDIR
				}
			}
			out = append(out, dirent{name: s, dir: isDir})
		}
	}
}

// openat2 opens name beneath dirfd, retrying EINTR and the EAGAIN that RESOLVE_BENEATH returns
// when a concurrent rename may have raced with resolving "..".
func openat2(dirfd int, name string, flags int, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags) | unix.O_CLOEXEC, Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		if err == unix.EINTR || err == unix.EAGAIN && i < 128 {
			continue
		}
		return fd, err
	}
}

// joinRel joins a name to a relative directory path, where "." is the workspace root.
func joinRel(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

// splitRel splits a relative path other than "." into its directory ("." for the root) and
// final name.
func splitRel(rel string) (dir, name string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}
