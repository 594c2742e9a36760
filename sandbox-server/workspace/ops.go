package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"syscall"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

func isExist(err error) bool { return errors.Is(err, fs.ErrExist) }

// Stat describes one path: the path itself (a symlink as a symlink), or with follow_symlinks
// what a final symlink points to (which must be inside the workspace).
func (w *Workspace) Stat(ctx context.Context, req *sandboxv1.StatRequest) (*sandboxv1.StatResponse, error) {
	rel, err := w.Resolve(req.GetPath())
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.GetFollowSymlinks() {
		fi, err := w.root.stat(rel)
		if err != nil {
			return nil, wrap("stat", rel, err)
		}
		return &sandboxv1.StatResponse{Info: toFileInfo(rel, fi, "")}, nil
	}
	dir, name := splitRel(rel)
	d, err := w.root.openDir(dir)
	if err != nil {
		return nil, wrap("stat", rel, err)
	}
	defer d.close()
	fi, err := d.lstat(name)
	if err != nil {
		return nil, wrap("stat", rel, err)
	}
	var target string
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err = d.readlink(name); err != nil {
			return nil, wrap("reading link", rel, err)
		}
	}
	return &sandboxv1.StatResponse{Info: toFileInfo(rel, fi, target)}, nil
}

// List describes the entries of a directory (empty path: the root), or with recursive those of
// its subdirectories down to max_depth levels (0: no limit), in path order (a directory's
// entries right after it). Symlinks are listed, not followed. At most max_entries entries are
// returned (capped at MaxListEntries); truncated says that more exist.
func (w *Workspace) List(ctx context.Context, req *sandboxv1.ListRequest) (*sandboxv1.ListResponse, error) {
	rel, err := w.resolveOrRoot(req.GetPath())
	if err != nil {
		return nil, err
	}
	depth := 1
	if req.GetRecursive() {
		depth = int(req.GetMaxDepth())
	}
	limit := capLimit(req.GetMaxEntries(), w.maxList)
	resp := &sandboxv1.ListResponse{}
	err = w.walk(ctx, rel, depth, func(e *walkEntry) (bool, error) {
		return collect(&resp.Entries, &resp.Truncated, limit, e)
	})
	if err != nil {
		return nil, wrap("listing", rel, err)
	}
	return resp, nil
}

// collect is a walk step that appends e's description to *entries, or, once limit are there,
// sets *truncated and stops the walk.
func collect(entries *[]*sandboxv1.FileInfo, truncated *bool, limit int, e *walkEntry) (bool, error) {
	if len(*entries) == limit {
		*truncated = true
		return false, errStopWalk
	}
	*entries = append(*entries, entryInfo(e))
	return true, nil
}

// entryInfo describes a walked entry, reading a symlink's target relative to its directory.
func entryInfo(e *walkEntry) *sandboxv1.FileInfo {
	var target string
	if e.info.Mode()&fs.ModeSymlink != 0 {
		target, _ = e.dir.readlink(e.name) // best effort: the link may have gone
	}
	return toFileInfo(e.rel, e.info, target)
}

// capLimit returns the client's limit, or the server's when the client's is zero or larger.
func capLimit(client uint32, server int) int {
	if client == 0 || int64(client) > int64(server) {
		return server
	}
	return int(client)
}

// Mkdir creates a directory (mode 0755 when zero, minus the umask), or with parents the
// directory and its missing parents, succeeding if it already exists.
func (w *Workspace) Mkdir(ctx context.Context, req *sandboxv1.MkdirRequest) error {
	rel, err := w.Resolve(req.GetPath())
	if err != nil {
		return err
	}
	mode, err := parseMode(req.GetMode(), defaultDirMode)
	if err != nil {
		return fmt.Errorf("creating directory %q: %w", rel, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if req.GetParents() {
		return wrap("creating directory", rel, w.root.mkdirAll(rel, mode))
	}
	dir, name := splitRel(rel)
	d, err := w.root.openDir(dir)
	if err == nil {
		err = d.mkdir(name, mode)
		d.close()
	}
	return wrap("creating directory", rel, err)
}

// Remove removes a file, a symlink (not its target) or an empty directory, or with recursive
// a whole tree. With missing_ok a missing path is not an error. The workspace root itself
// cannot be removed.
func (w *Workspace) Remove(ctx context.Context, req *sandboxv1.RemoveRequest) error {
	rel, err := w.resolveNonRoot("removing", req.GetPath())
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, name := splitRel(rel)
	d, err := w.root.openDir(dir)
	if err == nil {
		switch {
		case !req.GetRecursive():
			err = d.remove(name)
		case req.GetMissingOk():
			err = d.removeAll(name)
		default:
			// removeAll succeeds on a missing path.
			if _, err = d.lstat(name); err == nil {
				err = d.removeAll(name)
			}
		}
		d.close()
	}
	if req.GetMissingOk() && errors.Is(err, fs.ErrNotExist) && !isEscape(err) {
		return nil
	}
	return wrap("removing", rel, err)
}

// Rename moves from to to. Without overwrite an existing destination is fs.ErrExist (checked
// just before the rename: a file created concurrently by a command may still be replaced).
// With overwrite a file or symlink is replaced atomically, and an empty directory is replaced
// by a directory (removed, then renamed over: not atomic); replacing a non-empty directory is
// ENOTEMPTY, a directory by a file EISDIR. Neither side may be the workspace root.
func (w *Workspace) Rename(ctx context.Context, req *sandboxv1.RenameRequest) error {
	from, err := w.resolveNonRoot("renaming", req.GetFrom())
	if err != nil {
		return err
	}
	to, err := w.resolveNonRoot("renaming", req.GetTo())
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	fromDir, fromName := splitRel(from)
	fd, err := w.root.openDir(fromDir)
	if err != nil {
		return wrap("renaming", from, err)
	}
	defer fd.close()
	toDir, toName := splitRel(to)
	td := fd
	if toDir != fromDir {
		if td, err = w.root.openDir(toDir); err != nil {
			return wrap(fmt.Sprintf("renaming %q to", from), to, err)
		}
		defer td.close()
	}
	if !req.GetOverwrite() {
		// Atomic: a file created at to by a command meanwhile is never replaced.
		if err := fd.renameNoReplace(fromName, td, toName); err != nil {
			if errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("renaming %q to %q: %w", from, to, &fs.PathError{Op: "rename", Path: to, Err: syscall.EEXIST})
			}
			return wrap(fmt.Sprintf("renaming %q to", from), to, err)
		}
		return nil
	}
	dst, err := td.lstat(toName)
	switch {
	case err == nil && dst.IsDir():
		// Like os.Rename, never replace a directory by renaming over it; the proto allows
		// replacing an empty one with a directory, so remove it first (rmdir fails if it is
		// not empty).
		src, err := fd.lstat(fromName)
		if err != nil {
			return wrap("renaming", from, err)
		}
		if !src.IsDir() {
			return fmt.Errorf("renaming %q to %q: %w", from, to, &fs.PathError{Op: "rename", Path: to, Err: syscall.EISDIR})
		}
		if err := td.remove(toName); err != nil {
			return wrap(fmt.Sprintf("renaming %q to", from), to, err)
		}
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return wrap(fmt.Sprintf("renaming %q to", from), to, err)
	}
	if err := fd.rename(fromName, td, toName); err != nil {
		return wrap(fmt.Sprintf("renaming %q to", from), to, err)
	}
	return nil
}

// Symlink creates a symlink at path with the given target, which must be relative and resolve
// inside the workspace from the link's directory. An existing path is fs.ErrExist.
func (w *Workspace) Symlink(ctx context.Context, req *sandboxv1.SymlinkRequest) error {
	rel, err := w.resolveNonRoot("creating symlink", req.GetPath())
	if err != nil {
		return err
	}
	if err := checkLinkTarget(rel, req.GetTarget()); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, name := splitRel(rel)
	d, err := w.root.openDir(dir)
	if err == nil {
		err = d.symlink(req.GetTarget(), name)
		d.close()
	}
	return wrap("creating symlink", rel, err)
}

// Find walks from path (empty: the root) without following symlinks and returns the entries
// below it whose base name matches the name glob (empty: all) and whose type matches (zero:
// all), down to max_depth levels (0: no limit; 1: direct children), in path order. At most
// max_results entries are returned (capped at MaxFindResults); truncated says more exist.
func (w *Workspace) Find(ctx context.Context, req *sandboxv1.FindRequest) (*sandboxv1.FindResponse, error) {
	rel, err := w.resolveOrRoot(req.GetPath())
	if err != nil {
		return nil, err
	}
	name := req.GetName()
	if _, err := path.Match(name, ""); err != nil {
		return nil, fmt.Errorf("finding in %q: %w: name glob %q: %w", rel, ErrInvalidPath, short(name), err)
	}
	typ := req.GetType()
	limit := capLimit(req.GetMaxResults(), w.maxFind)
	resp := &sandboxv1.FindResponse{}
	err = w.walk(ctx, rel, int(req.GetMaxDepth()), func(e *walkEntry) (bool, error) {
		if typ != sandboxv1.FileType_FILE_TYPE_UNSPECIFIED && fileType(e.info.Mode()) != typ {
			return true, nil
		}
		if name != "" {
			if ok, _ := path.Match(name, e.name); !ok {
				return true, nil
			}
		}
		return collect(&resp.Entries, &resp.Truncated, limit, e)
	})
	if err != nil {
		return nil, wrap("finding in", rel, err)
	}
	return resp, nil
}
