package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// ErrEscape reports an archive entry whose name or link target leaves the root.
var ErrEscape = errors.New("entry escapes the root")

// treeStats counts what writeTree wrote.
type treeStats struct {
	files, dirs, links, devices int
	bytes                       int64
}

// progressEvery is how many entries writeTree writes between progress reports.
const progressEvery = 2000

// dirMeta is a directory's metadata, applied once everything below it is written.
type dirMeta struct {
	name     string
	mode     fs.FileMode
	uid, gid int
	mtime    time.Time
}

// writeTree writes the flattened image archive r (mutate.Extract's stream: one entry per
// path, upper layers first, whiteouts applied) into the empty directory dir.
//
// Every name and hard link target must stay inside dir (ErrEscape otherwise); all writes go
// through an os.Root on dir, so no entry, and no symbolic link an earlier entry made, can
// make it write outside. Symbolic links are made as they are: their targets, absolute ones
// included, are resolved inside the sandbox, never on the host. Regular files, directories
// and links keep their mode bits (without set-user-ID and set-group-ID: sandboxes run with
// no_new_privs, and on the host such files would be a way up for whoever reaches them), and,
// when running as root, their owner and group. Device nodes and FIFOs are not made (gVisor
// gives each sandbox its own /dev). Directories get their mode and times last, so that a
// read-only directory can still be filled.
//
// progress, if set, is called after every progressEvery entries.
func writeTree(ctx context.Context, r io.Reader, dir string, progress func(treeStats)) (treeStats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return treeStats{}, err
	}
	defer root.Close()
	w := &treeWriter{root: root, chown: os.Geteuid() == 0}
	tr := tar.NewReader(r)
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return w.st, err
		}
		if progress != nil && n%progressEvery == 0 {
			progress(w.st)
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return w.st, fmt.Errorf("reading the image: %w", err)
		}
		if err := w.entry(h, tr); err != nil {
			return w.st, err
		}
	}
	// mutate.Extract ends its archive properly even when flattening failed (a layer that
	// did not read, a name it refuses) and reports the failure only after the end marker.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return w.st, fmt.Errorf("reading the image: %w", err)
	}
	if err := w.linkAll(); err != nil {
		return w.st, err
	}
	return w.st, w.setDirs()
}

// treeWriter writes the entries of an archive under root.
type treeWriter struct {
	root      *os.Root
	chown     bool // set owners and groups (when running as root)
	st        treeStats
	dirs      []dirMeta     // directories, whose mode and times are set last
	hardLinks []*tar.Header // hard links, made after every other entry
}

// entry writes the entry h, whose data is data, or notes it for later.
func (w *treeWriter) entry(h *tar.Header, data io.Reader) error {
	name, err := entryName(h.Name)
	if err != nil {
		return err
	}
	mode := fs.FileMode(h.Mode).Perm()
	switch h.Typeflag {
	case tar.TypeDir:
		if h.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		if name != "." {
			if err := mkdir(w.root, name); err != nil {
				return err
			}
		}
		w.dirs = append(w.dirs, dirMeta{name: name, mode: mode, uid: h.Uid, gid: h.Gid, mtime: h.ModTime})
		w.st.dirs++
	case tar.TypeReg:
		if err := parent(w.root, name); err != nil {
			return err
		}
		if err := writeFile(w.root, name, data, h, mode, w.chown); err != nil {
			return err
		}
		w.st.files++
		w.st.bytes += h.Size
	case tar.TypeSymlink:
		if err := parent(w.root, name); err != nil {
			return err
		}
		if err := w.root.Symlink(h.Linkname, name); err != nil {
			return fmt.Errorf("creating link %s: %w", name, err)
		}
		if w.chown {
			if err := w.root.Lchown(name, h.Uid, h.Gid); err != nil {
				return fmt.Errorf("setting the owner of %s: %w", name, err)
			}
		}
		w.st.links++
	case tar.TypeLink:
		// The target may come later in the stream (it can be in a lower layer).
		w.hardLinks = append(w.hardLinks, h)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		w.st.devices++
	default:
		return fmt.Errorf("entry %s: unsupported type %q", name, h.Typeflag)
	}
	return nil
}

// linkAll makes the hard links.
func (w *treeWriter) linkAll() error {
	for _, h := range w.hardLinks {
		name, _ := entryName(h.Name)
		target, err := entryName(h.Linkname)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", name, err)
		}
		if err := parent(w.root, name); err != nil {
			return err
		}
		if err := w.root.Link(target, name); err != nil {
			return fmt.Errorf("creating hard link %s to %s: %w", name, target, err)
		}
		w.st.links++
	}
	return nil
}

// setDirs gives the directories their mode, owner and times, deepest first, so that setting a
// directory's times does not change its parent's.
func (w *treeWriter) setDirs() error {
	slices.SortStableFunc(w.dirs, func(a, b dirMeta) int {
		return strings.Count(b.name, "/") - strings.Count(a.name, "/")
	})
	for _, d := range w.dirs {
		if err := setDir(w.root, d, w.chown); err != nil {
			return err
		}
	}
	return nil
}

// entryName returns an archive name relative to the root ("." for the root itself), or
// ErrEscape if it leaves it.
func entryName(n string) (string, error) {
	clean := path.Clean("/" + n) // a leading / or ./ means the root
	if clean == "/" {
		return ".", nil
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: %q", ErrEscape, n)
		}
	}
	return clean[1:], nil
}

// mkdir makes directory name, with its parents, unless it is one already.
func mkdir(root *os.Root, name string) error {
	if err := root.MkdirAll(name, 0o755); err != nil {
		return fmt.Errorf("creating directory %s: %w", name, err)
	}
	info, err := root.Lstat(name)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("creating directory %s: a %v is there", name, info.Mode().Type())
	}
	return nil
}

// parent makes the parent directories of name that no entry made yet (their own entries,
// from lower layers, may come later and then set their modes).
func parent(root *os.Root, name string) error {
	if d := path.Dir(name); d != "." {
		return mkdir(root, d)
	}
	return nil
}

// writeFile writes regular file name from r.
func writeFile(root *os.Root, name string, r io.Reader, h *tar.Header, mode fs.FileMode, chown bool) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	if _, err := io.CopyN(f, r, h.Size); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if chown {
		if err := f.Chown(h.Uid, h.Gid); err != nil {
			f.Close()
			return fmt.Errorf("setting the owner of %s: %w", name, err)
		}
	}
	if err := f.Chmod(mode); err != nil { // after Chown, which clears set-id bits anyway
		f.Close()
		return fmt.Errorf("setting the mode of %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	// Python compares a module's mtime with its compiled file's: keep them.
	if err := root.Chtimes(name, h.ModTime, h.ModTime); err != nil {
		return fmt.Errorf("setting the times of %s: %w", name, err)
	}
	return nil
}

// setDir applies a directory entry's owner, mode and times.
func setDir(root *os.Root, d dirMeta, chown bool) error {
	f, err := root.Open(d.name)
	if err != nil {
		return err
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.IsDir() {
		return fmt.Errorf("setting the mode of directory %s: it is no longer a directory", d.name)
	}
	if chown {
		if err := f.Chown(d.uid, d.gid); err != nil {
			return fmt.Errorf("setting the owner of %s: %w", d.name, err)
		}
	}
	if err := f.Chmod(d.mode); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", d.name, err)
	}
	if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
		return fmt.Errorf("setting the times of %s: %w", d.name, err)
	}
	return nil
}
