package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
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

// The OCI image spec's whiteouts: a file named whiteoutPrefix+NAME in a layer deletes NAME
// of the layers below; opaqueWhiteout in a directory hides everything the layers below hold
// in it.
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// writeLayers applies the layers (uncompressed tar archives, lowest first) in order to the
// empty directory dir, as a container runtime does: each layer's entries replace what lower
// layers put at their names, its whiteouts delete, and a hard link may name a file of its own
// layer or of a lower one, even one that a higher layer deletes later (a flattened archive
// could not make that link: its target's content would be gone).
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
func writeLayers(ctx context.Context, layers []opener, dir string, progress func(treeStats)) (treeStats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return treeStats{}, err
	}
	defer root.Close()
	w := &treeWriter{root: root, chown: os.Geteuid() == 0, dirs: map[string]dirMeta{}, progress: progress}
	for i, open := range layers {
		// Opened one at a time: a registry's blob is fetched as it is applied.
		r, err := open()
		if err != nil {
			return w.st, fmt.Errorf("layer %d: %w", i+1, err)
		}
		if err := w.layer(ctx, r); err != nil {
			return w.st, fmt.Errorf("layer %d: %w", i+1, err)
		}
	}
	return w.st, w.setDirs()
}

// opener opens a layer's uncompressed archive.
type opener func() (io.ReadCloser, error)

// writeTree is writeLayers of the one archive r.
func writeTree(ctx context.Context, r io.Reader, dir string, progress func(treeStats)) (treeStats, error) {
	return writeLayers(ctx, []opener{func() (io.ReadCloser, error) { return io.NopCloser(r), nil }}, dir, progress)
}

// treeWriter writes the entries of the layers under root.
type treeWriter struct {
	root     *os.Root
	chown    bool // set owners and groups (when running as root)
	progress func(treeStats)
	st       treeStats
	entries  int                // entries applied so far, for progress
	dirs     map[string]dirMeta // directories by name, whose mode and times are set last
	// The layer being applied: the names it wrote (an opaque whiteout keeps them), and its
	// hard links whose target comes later in it.
	written   map[string]bool
	hardLinks []*tar.Header
}

// layer applies one layer archive r, then closes it.
func (w *treeWriter) layer(ctx context.Context, r io.ReadCloser) error {
	defer r.Close()
	w.written, w.hardLinks = map[string]bool{}, nil
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the image: %w", err)
		}
		if err := w.apply(h, tr); err != nil {
			return err
		}
		if w.entries++; w.progress != nil && w.entries%progressEvery == 0 {
			w.progress(w.st)
		}
	}
	// A layer's content is checked against its digest once it is read to its end, past the
	// archive's end marker.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("reading the image: %w", err)
	}
	if err := r.Close(); err != nil {
		return fmt.Errorf("reading the image: %w", err)
	}
	return w.linkAll()
}

// apply applies entry h of the current layer, whose data is data: a whiteout deletes, any
// other entry replaces what is at its name (a directory over a directory keeps its content).
func (w *treeWriter) apply(h *tar.Header, data io.Reader) error {
	name, err := entryName(h.Name)
	if err != nil {
		return err
	}
	base, parentDir := path.Base(name), path.Dir(name)
	switch {
	case base == opaqueWhiteout:
		return w.hideLower(parentDir)
	case strings.HasPrefix(base, whiteoutPrefix):
		target := path.Join(parentDir, strings.TrimPrefix(base, whiteoutPrefix))
		if _, err := entryName(target); err != nil || target == "." {
			return fmt.Errorf("%w: whiteout %q", ErrEscape, h.Name)
		}
		return w.remove(target)
	}
	if name != "." {
		if err := w.replace(name, h.Typeflag == tar.TypeDir); err != nil {
			return err
		}
	}
	w.written[name] = true
	return w.entry(name, h, data)
}

// replace removes what lower layers put at name, unless both it and the new entry are
// directories.
func (w *treeWriter) replace(name string, dir bool) error {
	info, err := w.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("replacing %s: %w", name, err)
	case dir && info.IsDir():
		return nil
	}
	return w.remove(name)
}

// remove deletes name and everything below it, with the metadata of the directories there.
func (w *treeWriter) remove(name string) error {
	if err := w.root.RemoveAll(name); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	for d := range w.dirs {
		if d == name || strings.HasPrefix(d, name+"/") {
			delete(w.dirs, d)
		}
	}
	return nil
}

// hideLower deletes what lower layers put in directory dir (an opaque whiteout), keeping what
// the current layer wrote there.
func (w *treeWriter) hideLower(dir string) error {
	f, err := w.root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opaque directory %s: %w", dir, err)
	}
	children, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("opaque directory %s: %w", dir, err)
	}
	for _, c := range children {
		p := path.Join(dir, c.Name())
		switch {
		case !w.written[p]:
			if err := w.remove(p); err != nil {
				return err
			}
		case c.IsDir():
			if err := w.hideLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// entry writes the entry h named name, whose data is data, or notes it for later.
func (w *treeWriter) entry(name string, h *tar.Header, data io.Reader) error {
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
		w.dirs[name] = dirMeta{name: name, mode: mode, uid: h.Uid, gid: h.Gid, mtime: h.ModTime}
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
		// The target is in a lower layer or earlier in this one, or, in an archive written
		// out of order, later in this one.
		if err := w.link(h); errors.Is(err, fs.ErrNotExist) {
			w.hardLinks = append(w.hardLinks, h)
		} else if err != nil {
			return err
		}
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		w.st.devices++
	default:
		return fmt.Errorf("entry %s: unsupported type %q", name, h.Typeflag)
	}
	return nil
}

// link makes hard link h.
func (w *treeWriter) link(h *tar.Header) error {
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
	return nil
}

// linkAll makes the current layer's hard links whose target came after them.
func (w *treeWriter) linkAll() error {
	for _, h := range w.hardLinks {
		if err := w.link(h); err != nil {
			return err
		}
	}
	w.hardLinks = nil
	return nil
}

// setDirs gives the directories their mode, owner and times, deepest first, so that setting a
// directory's times does not change its parent's.
func (w *treeWriter) setDirs() error {
	dirs := slices.Collect(maps.Values(w.dirs))
	slices.SortFunc(dirs, func(a, b dirMeta) int {
		if n := strings.Count(b.name, "/") - strings.Count(a.name, "/"); n != 0 {
			return n
		}
		return strings.Compare(a.name, b.name)
	})
	for _, d := range dirs {
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
