package templatebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/rootdiff"
	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/internal/userdb"
)

// rootState is the root filesystem after the steps so far: a directory and its snapshot,
// plus the layers of cached steps not yet applied to it.
type rootState struct {
	// dir is the root directory, as of the steps before pending.
	dir string
	// remove is what to remove once dir is no longer needed; empty for the base root,
	// which the unpacked-image cache keeps.
	remove string
	// owned reports whether dir belongs to this build.
	owned bool
	// tree is dir's snapshot; nil until a step needs it.
	tree *rootdiff.Tree
	// pending are the layers of cached steps after dir.
	pending []v1.Layer
}

// materialize returns the root after every step so far, unpacking the base image and the
// layers so far when cached steps came after the last root made.
func (bd *build) materialize(ctx context.Context) (*rootState, error) {
	if len(bd.cur.pending) > 0 {
		var layers []v1.Layer
		for _, s := range bd.steps {
			if s.layer != nil {
				layers = append(layers, s.layer)
			}
		}
		img, err := bd.assemble(layers, nil, bd.cfg)
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(bd.o.Progress, "    (unpacking the cached steps' root)")
		r, err := rootfs.Unpack(ctx, img, filepath.Join(bd.work, "roots"), nil)
		if err != nil {
			return nil, fmt.Errorf("unpacking the root of the cached steps: %w", err)
		}
		bd.replaceRoot(&rootState{dir: r.Dir, remove: filepath.Dir(r.Dir), owned: true})
	}
	if bd.cur.tree == nil {
		t, err := rootdiff.Snapshot(bd.cur.dir)
		if err != nil {
			return nil, err
		}
		bd.cur.tree = t
	}
	return bd.cur, nil
}

// replaceRoot makes s the current root and removes the previous one if it is the build's.
func (bd *build) replaceRoot(s *rootState) {
	if old := bd.cur; old != nil && old.owned {
		rm := old.remove
		if rm == "" {
			rm = old.dir
		}
		removeAll(rm)
	}
	bd.cur = s
}

// copyRoot copies the root src into a new directory of the build for step i. cp -a keeps
// owners, modes, times, hard links, links and extended attributes, and never follows a
// link of the tree.
func (bd *build) copyRoot(src string, i int) (string, error) {
	dst := filepath.Join(bd.work, fmt.Sprintf("root-%d", i+1))
	var stderr bytes.Buffer
	cmd := exec.Command("cp", "-a", "--reflink=auto", "-T", src, dst)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		removeAll(dst)
		return "", fmt.Errorf("copying the root for step %d: %w: %s", i+1, err, strings.TrimSpace(stderr.String()))
	}
	return dst, nil
}

// diff writes the layer of what changed from before to dir into the cache under key, and
// returns dir's tree and whether nothing changed (then no layer is kept).
func (bd *build) diff(before *rootdiff.Tree, dir, key string) (*rootdiff.Tree, bool, error) {
	tmp, err := os.CreateTemp(bd.work, "layer-")
	if err != nil {
		return nil, false, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	pr, pw := io.Pipe()
	type result struct {
		tree *rootdiff.Tree
		st   rootdiff.Stats
		err  error
	}
	done := make(chan result, 1)
	go func() {
		t, st, err := rootdiff.Diff(before, dir, pw, rootdiff.Options{Epoch: bd.o.Epoch})
		pw.CloseWithError(err)
		done <- result{t, st, err}
	}()
	cerr := rootdiff.Compress(tmp, pr)
	pr.CloseWithError(errors.New("compression stopped"))
	r := <-done
	if r.err != nil {
		return nil, false, r.err
	}
	if cerr != nil {
		return nil, false, cerr
	}
	if err := tmp.Close(); err != nil {
		return nil, false, err
	}
	empty := r.st.Added+r.st.Modified+r.st.Deleted == 0
	layer := tmp.Name()
	if empty {
		layer = ""
	}
	if err := bd.cache.put(key, layer, empty); err != nil {
		return nil, false, err
	}
	return r.tree, empty, nil
}

// isDirIn reports whether p (absolute, inside the root dir) is a directory of the root,
// following the root's links inside it.
func isDirIn(dir, p string) (bool, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return false, err
	}
	defer r.Close()
	rel := strings.TrimPrefix(filepath.Clean(p), "/")
	if rel == "" {
		return true, nil
	}
	info, err := r.Stat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case !info.IsDir():
		return false, fmt.Errorf("%s is a %v in the image, not a directory", p, info.Mode().Type())
	}
	return true, nil
}

// makeWorkdir creates the WORKDIR of step s in the root dir, owned by the step's user
// (user, or the base image's baseUser), as BuildKit does.
func makeWorkdir(dir string, s dockerfile.Step, user, baseUser string) error {
	if user == "" {
		user = baseUser
	}
	uid, gid, err := userdb.LookupDir(dir, user)
	if err != nil {
		return fmt.Errorf("Dockerfile:%d: WORKDIR %s: %w", s.Line, s.Workdir, err)
	}
	if err := mkdirOwned(dir, s.Workdir, int(uid), int(gid)); err != nil {
		return fmt.Errorf("Dockerfile:%d: WORKDIR %s: %w", s.Line, s.Workdir, err)
	}
	return nil
}

// mkdirOwned creates the directory p (absolute) in the root dir with its missing parents,
// each new one mode 0755 and owned by uid:gid, following the root's links only inside it.
func mkdirOwned(dir, p string, uid, gid int) error {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return mkdirAllIn(r, strings.TrimPrefix(filepath.Clean(p), "/"), uid, gid)
}

// mkdirAllIn is mkdirOwned for a path relative to the open root r.
func mkdirAllIn(r *os.Root, rel string, uid, gid int) error {
	if rel == "" || rel == "." {
		return nil
	}
	cur := ""
	for _, part := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, part)
		info, err := r.Stat(cur)
		if err == nil {
			if !info.IsDir() {
				return fmt.Errorf("/%s is a %v in the image, not a directory", cur, info.Mode().Type())
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := r.Mkdir(cur, 0o755); err != nil {
			return err
		}
		if err := r.Chown(cur, uid, gid); err != nil {
			return err
		}
		if err := r.Chmod(cur, 0o755); err != nil { // the umask may have narrowed it
			return err
		}
	}
	return nil
}
