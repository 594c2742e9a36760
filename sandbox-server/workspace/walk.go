package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"
)

// walkEntry is one entry met by walk.
type walkEntry struct {
	rel   string      // path relative to the workspace root
	name  string      // final element of rel
	depth int         // 1 for the start directory's children
	info  fs.FileInfo // from lstat: a symlink is described as a symlink
	dir   *os.Root    // the directory holding the entry, for single-component opens
}

// walkFunc is called for each entry. For a directory it says whether to descend into it;
// errStopWalk ends the walk without error.
type walkFunc func(e *walkEntry) (descend bool, err error)

var errStopWalk = errors.New("stop walk")

// walk visits the entries below directory start (which may be reached through symlinks inside
// the root) depth-first, names sorted within each directory, so entries come in path order
// segment by segment (a directory's entries right after it). It never follows symlinks while
// walking, descends at most maxDepth levels (0: maxWalkDepth), and skips names that are not
// valid UTF-8 (they cannot travel in a protobuf string). Every directory is opened as a sub-root
// of its parent, so a directory swapped for a symlink mid-walk cannot lead out of the workspace.
func (w *Workspace) walk(ctx context.Context, start string, maxDepth int, fn walkFunc) error {
	if maxDepth <= 0 || maxDepth > maxWalkDepth {
		maxDepth = maxWalkDepth
	}
	r, err := w.root.OpenRoot(start)
	if err != nil {
		if isNotDir(err) {
			// os.Root reports a non-directory with an untyped error and the host path.
			return &fs.PathError{Op: "open", Path: start, Err: syscall.ENOTDIR}
		}
		return err
	}
	defer r.Close()
	err = walkDir(ctx, r, start, 1, maxDepth, fn)
	if err == errStopWalk {
		return nil
	}
	return err
}

func walkDir(ctx context.Context, r *os.Root, rel string, depth, maxDepth int, fn walkFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	// A file opened through a Root lstats each entry relative to the directory descriptor.
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, de := range entries {
		name := de.Name()
		if !utf8.ValidString(name) {
			continue
		}
		info, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the directory was read
		}
		if err != nil {
			return err
		}
		e := walkEntry{rel: joinRel(rel, name), name: name, depth: depth, info: info, dir: r}
		descend, err := fn(&e)
		if err != nil {
			return err
		}
		if !descend || !info.IsDir() || depth >= maxDepth {
			continue
		}
		sub, err := r.OpenRoot(name)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || isRootEscape(err) || isNotDir(err) {
				continue // removed or swapped since it was listed
			}
			return err
		}
		err = walkDir(ctx, sub, e.rel, depth+1, maxDepth, fn)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// isNotDir reports whether err says that a path is not a directory: ENOTDIR, or the untyped
// error os.Root.OpenRoot returns for a non-directory.
func isNotDir(err error) bool {
	var pe *fs.PathError
	return errors.Is(err, syscall.ENOTDIR) || errors.As(err, &pe) && pe.Err.Error() == syscall.ENOTDIR.Error()
}
