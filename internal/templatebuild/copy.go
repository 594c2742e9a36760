package templatebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/dockerignore"
	"github.com/fusebox-dev/fusebox/internal/userdb"
)

// copySources are the files a COPY or ADD step copies, read from the build context.
type copySources struct {
	context string // the build context directory
	matches []match
	// digest covers the matches' names and every entry's name, type, mode, size, content
	// and link target: what the step's layer depends on besides the step itself (times
	// are not: as in Docker, touching a file does not invalidate the cache).
	digest string
}

// match is one source after pattern expansion.
type match struct {
	rel     string  // the path in the context
	entries []entry // the match itself (rel ""), then for a directory everything under it
	// archive, for an ADD of an archive, is how it is unpacked (archiveKind): "tar" or its
	// compression.
	archive string
}

// entry is one file to copy.
type entry struct {
	rel    string // relative to the match, "" for the match itself
	mode   fs.FileMode
	mtime  time.Time
	size   int64
	target string // a link's target
	digest string // a regular file's content digest
}

func (e entry) isDir() bool  { return e.mode.IsDir() }
func (e entry) isLink() bool { return e.mode&fs.ModeSymlink != 0 }

// collectSources expands the sources of the COPY or ADD step s in the build context dir and
// reads them. Everything is read through an os.Root of the context: a path (or a link on
// the way) that leaves it is refused, naming the line.
func collectSources(dir string, s dockerfile.Step) (*copySources, error) {
	fail := func(src string, format string, args ...any) error {
		return fmt.Errorf("Dockerfile:%d: %s %s: %s", s.Line, s.Kind, src, fmt.Sprintf(format, args...))
	}
	ignore, err := dockerignore.Read(dir)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: %s: %w", s.Line, s.Kind, err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("opening the build context: %w", err)
	}
	defer r.Close()
	cs := &copySources{context: dir}
	for _, src := range s.Sources {
		rels, err := expand(r, src)
		if err != nil {
			return nil, fail(src, "%v", explain(err))
		}
		rels = slices.DeleteFunc(rels, ignore.Excluded)
		if len(rels) == 0 {
			return nil, fail(src, "no file of the build context matches (or %s excludes what does)", dockerignore.File)
		}
		for _, rel := range rels {
			m, err := readMatch(r, rel, s.Kind == dockerfile.KindAdd, ignore)
			if err != nil {
				return nil, fail(src, "%v", explain(err))
			}
			cs.matches = append(cs.matches, m)
		}
	}
	if len(cs.matches) > 1 && !strings.HasSuffix(s.Dest, "/") {
		return nil, fmt.Errorf("Dockerfile:%d: %s: %d sources need a destination directory ending in /, not %s", s.Line, s.Kind, len(cs.matches), s.Dest)
	}
	h := sha256.New()
	for _, m := range cs.matches {
		fmt.Fprintf(h, "match %s\n", strconv.Quote(m.rel))
		if m.archive != "" {
			fmt.Fprintf(h, "unpack %s\n", m.archive)
		}
		for _, e := range m.entries {
			fmt.Fprintf(h, "%s %o %d %s %s\n", strconv.Quote(e.rel), uint32(e.mode), e.size, e.digest, strconv.Quote(e.target))
		}
	}
	cs.digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return cs, nil
}

// explain turns os.Root's refusal of a path into what it means here.
func explain(err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("it leaves the build context (through a link or ..): %w", err)
	}
	return err
}

// hasMeta reports whether a path element holds a pattern character.
func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// expand returns the context paths the source pattern src matches, in order; a source
// without pattern characters is returned as it is (readMatch reports a missing one).
func expand(r *os.Root, src string) ([]string, error) {
	if !hasMeta(src) {
		return []string{src}, nil
	}
	cur := []string{"."}
	for _, part := range strings.Split(src, "/") {
		var next []string
		for _, d := range cur {
			if !hasMeta(part) {
				next = append(next, path.Join(d, part))
				continue
			}
			f, err := r.Open(d)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			names, err := f.Readdirnames(-1)
			f.Close()
			if err != nil {
				continue // not a directory
			}
			slices.Sort(names)
			for _, n := range names {
				if ok, _ := path.Match(part, n); ok {
					next = append(next, path.Join(d, n))
				}
			}
		}
		cur = next
	}
	var out []string
	for _, p := range cur {
		if _, err := r.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// readMatch reads the source rel: the match itself (a link to it followed, inside the
// context), and for a directory everything under it (links copied as links) that ignore
// does not leave out; a directory left out is kept only for what ignore re-includes under
// it. With add, a file that is a tar archive is marked to be unpacked, as Docker's ADD does.
func readMatch(r *os.Root, rel string, add bool, ignore *dockerignore.Matcher) (match, error) {
	info, err := r.Stat(rel)
	if err != nil {
		return match{}, err
	}
	m := match{rel: rel}
	top, err := readEntry(r, rel, "", info)
	if err != nil {
		return match{}, err
	}
	m.entries = append(m.entries, top)
	if add && !info.IsDir() {
		if m.archive, err = archiveKind(r, rel); err != nil {
			return match{}, err
		}
	}
	if !info.IsDir() {
		return m, nil
	}
	var walk func(sub string) error
	walk = func(sub string) error {
		f, err := r.Open(path.Join(rel, sub))
		if err != nil {
			return err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return err
		}
		slices.Sort(names)
		for _, n := range names {
			name := path.Join(sub, n)
			excluded := ignore.Excluded(path.Join(rel, name))
			info, err := r.Lstat(path.Join(rel, name))
			if err != nil {
				return err
			}
			if excluded && !(info.IsDir() && ignore.Exceptions()) {
				continue
			}
			e, err := readEntry(r, path.Join(rel, name), name, info)
			if err != nil {
				return err
			}
			at := len(m.entries)
			m.entries = append(m.entries, e)
			if info.IsDir() {
				if err := walk(name); err != nil {
					return err
				}
				if excluded && len(m.entries) == at+1 {
					m.entries = m.entries[:at] // left out, and nothing under it re-included
				}
			}
		}
		return nil
	}
	return m, walk("")
}

// readEntry describes the file at p (context path), named rel in its match.
func readEntry(r *os.Root, p, rel string, info fs.FileInfo) (entry, error) {
	e := entry{rel: rel, mode: info.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), mtime: info.ModTime()}
	switch {
	case info.IsDir():
	case info.Mode()&fs.ModeSymlink != 0:
		t, err := r.Readlink(p)
		if err != nil {
			return entry{}, err
		}
		e.target = t
	case info.Mode().IsRegular():
		f, err := r.Open(p)
		if err != nil {
			return entry{}, err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return entry{}, fmt.Errorf("reading %s: %w", p, err)
		}
		e.size, e.digest = n, "sha256:"+hex.EncodeToString(h.Sum(nil))
	default:
		return entry{}, fmt.Errorf("%s is a %v: only files, directories and links can be copied", p, info.Mode().Type())
	}
	return e, nil
}

// applyCopy copies the sources of step s into the root dir.
func applyCopy(dir string, s dockerfile.Step, cs *copySources) error {
	fail := func(err error) error {
		return fmt.Errorf("Dockerfile:%d: %s %s: %w", s.Line, s.Kind, s.Dest, explainImage(err))
	}
	img, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer img.Close()
	ctxRoot, err := os.OpenRoot(cs.context)
	if err != nil {
		return err
	}
	defer ctxRoot.Close()
	uid, gid := 0, 0
	if s.Chown != "" {
		u, g, err := userdb.Lookup(img, s.Chown)
		if err != nil {
			return fmt.Errorf("Dockerfile:%d: %s --chown=%s: %w", s.Line, s.Kind, s.Chown, err)
		}
		uid, gid = int(u), int(g)
	}
	w := &copyWriter{img: img, ctx: ctxRoot, uid: uid, gid: gid, chowned: s.Chown != "", chmod: s.Chmod}
	destDir := strings.HasSuffix(s.Dest, "/")
	dest := strings.TrimPrefix(path.Clean(s.Dest), "/")
	if dest == "" {
		dest = "."
	}
	for _, m := range cs.matches {
		top := m.entries[0]
		if m.archive != "" {
			// Unpacked into the destination, a directory whatever its spelling.
			if err := mkdirAllIn(img, dest, uid, gid); err != nil {
				return fail(err)
			}
			if err := w.unpack(m.rel, dest, m.archive, top); err != nil {
				return fail(err)
			}
			continue
		}
		var target string
		switch {
		case top.isDir():
			// A directory's content is copied, not the directory itself.
			target = dest
			if err := mkdirAllIn(img, dest, uid, gid); err != nil {
				return fail(err)
			}
		case destDir:
			target = path.Join(dest, path.Base(m.rel))
			if err := mkdirAllIn(img, dest, uid, gid); err != nil {
				return fail(err)
			}
		default:
			target = dest
			if info, err := img.Stat(dest); err == nil && info.IsDir() {
				target = path.Join(dest, path.Base(m.rel))
			} else if err := mkdirAllIn(img, path.Dir(dest), uid, gid); err != nil {
				return fail(err)
			}
		}
		for _, e := range m.entries {
			if e.rel == "" && e.isDir() {
				continue
			}
			if err := w.write(path.Join(m.rel, e.rel), path.Join(target, e.rel), e); err != nil {
				return fail(err)
			}
		}
	}
	if err := w.setDirTimes(); err != nil {
		return fail(err)
	}
	return nil
}

// explainImage turns os.Root's refusal of a path of the image into what it means here.
func explainImage(err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("the destination path goes through an absolute link of the image, which COPY does not follow yet: %w", err)
	}
	return err
}

// copyWriter writes entries into the image's root.
type copyWriter struct {
	img, ctx *os.Root
	uid, gid int
	chowned  bool // --chown: uid and gid own what an archive unpacks too
	chmod    *uint32
	dirs     []dirTime // directories written, whose times are set last
}

type dirTime struct {
	name  string
	mtime time.Time
}

// mode returns the mode to give e: --chmod's, or its own.
func (w *copyWriter) mode(e entry) fs.FileMode {
	if w.chmod == nil {
		return e.mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	return unixMode(int64(*w.chmod))
}

// unixMode is the fs.FileMode of a Unix mode's permission, set-id and sticky bits.
func unixMode(mode int64) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// write copies the context path src, described by e, to dst in the image.
func (w *copyWriter) write(src, dst string, e entry) error {
	existing, err := w.img.Lstat(dst)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if e.isDir() {
		if exists && !existing.IsDir() {
			if err := w.img.Remove(dst); err != nil {
				return err
			}
			exists = false
		}
		if !exists {
			if err := w.img.Mkdir(dst, 0o700); err != nil {
				return err
			}
		}
		if err := w.img.Chown(dst, w.uid, w.gid); err != nil {
			return err
		}
		if err := w.img.Chmod(dst, w.mode(e)); err != nil {
			return err
		}
		w.dirs = append(w.dirs, dirTime{dst, e.mtime})
		return nil
	}
	if exists {
		if existing.IsDir() {
			return fmt.Errorf("/%s is a directory in the image: cannot copy %s over it", dst, src)
		}
		if err := w.img.Remove(dst); err != nil {
			return err
		}
	}
	if e.isLink() {
		if err := w.img.Symlink(e.target, dst); err != nil {
			return err
		}
		return w.img.Lchown(dst, w.uid, w.gid)
	}
	in, err := w.ctx.Open(src)
	if err != nil {
		return explain(err)
	}
	defer in.Close()
	out, err := w.img.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != e.digest {
		out.Close()
		return fmt.Errorf("%s changed during the build", src)
	}
	if err := out.Chown(w.uid, w.gid); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(w.mode(e)); err != nil { // after Chown, which clears set-id bits
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return w.img.Chtimes(dst, e.mtime, e.mtime)
}

// setDirTimes gives the directories written their sources' times, deepest first, once
// nothing more is written into them.
func (w *copyWriter) setDirTimes() error {
	slices.SortStableFunc(w.dirs, func(a, b dirTime) int {
		return strings.Count(b.name, "/") - strings.Count(a.name, "/")
	})
	for _, d := range w.dirs {
		if err := w.img.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}
