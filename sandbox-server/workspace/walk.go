package workspace

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"unicode/utf8"
)

// walkEntry is one entry met by walk.
type walkEntry struct {
	rel   string      // path relative to the workspace root
	name  string      // final element of rel
	depth int         // 1 for the start directory's children
	info  fs.FileInfo // from lstat: a symlink is described as a symlink
	dir   *dirHandle  // the directory holding the entry, for single-component opens
}

// walkFunc is called for each entry. For a directory it says whether to descend into it;
// errStopWalk ends the walk without error.
type walkFunc func(e *walkEntry) (descend bool, err error)

var errStopWalk = errors.New("stop walk")

// walk visits the entries below directory start (which may be reached through symlinks inside
// the root) depth-first, names sorted within each directory, so entries come in path order
// segment by segment (a directory's entries right after it). It never follows symlinks while
// walking, descends at most maxDepth levels (0: maxWalkDepth), and skips names that are not
// valid UTF-8 (they cannot travel in a protobuf string). Every directory is opened by its
// single name on its parent's descriptor, refusing symlinks (RESOLVE_NO_SYMLINKS on Linux), so
// a directory swapped for a symlink mid-walk is skipped, never followed.
func (w *Workspace) walk(ctx context.Context, start string, maxDepth int, fn walkFunc) error {
	if maxDepth <= 0 || maxDepth > maxWalkDepth {
		maxDepth = maxWalkDepth
	}
	d, err := w.root.openList(start)
	if err != nil {
		return err
	}
	defer d.close()
	err = walkDir(ctx, d, start, 1, maxDepth, fn)
	if err == errStopWalk {
		return nil
	}
	return err
}

func walkDir(ctx context.Context, d *dirHandle, rel string, depth, maxDepth int, fn walkFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	infos, err := d.readDir()
	if err != nil {
		return err
	}
	slices.SortFunc(infos, func(a, b fs.FileInfo) int { return strings.Compare(a.Name(), b.Name()) })
	for _, info := range infos {
		name := info.Name()
		if !utf8.ValidString(name) {
			continue
		}
		e := walkEntry{rel: joinRel(rel, name), name: name, depth: depth, info: info, dir: d}
		descend, err := fn(&e)
		if err != nil {
			return err
		}
		if !descend || !info.IsDir() || depth >= maxDepth {
			continue
		}
		sub, err := d.openSubdir(name, e.rel)
		if err == errSkip {
			continue // removed or swapped since it was listed
		}
		if err != nil {
			return err
		}
		err = walkDir(ctx, sub, e.rel, depth+1, maxDepth, fn)
		sub.close()
		if err != nil {
			return err
		}
	}
	return nil
}
