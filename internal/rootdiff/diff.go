package rootdiff

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// WhiteoutPrefix marks, in a layer, the deletion of the entry named by the rest of the
// base name (OCI image layer specification).
const WhiteoutPrefix = ".wh."

// Options control how Diff writes a layer.
type Options struct {
	// Epoch is the latest time the layer records: later modification times are clamped
	// to it (as BuildKit does with SOURCE_DATE_EPOCH), so that what a step creates gets
	// the same time in every build, while older times (from the base image or the build
	// context) are kept. Times are recorded to the second. The zero value means the Unix
	// epoch, 1970-01-01.
	Epoch time.Time
}

// epoch returns the clamping time, to the second.
func (o Options) epoch() time.Time {
	if o.Epoch.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return o.Epoch.Truncate(time.Second).UTC()
}

// clamp returns t as the layer records it.
func clamp(t, epoch time.Time) time.Time {
	t = t.Truncate(time.Second).UTC()
	if t.After(epoch) {
		return epoch
	}
	return t
}

// Stats counts what Diff wrote.
type Stats struct {
	// Added is the number of entries written that the before tree did not have.
	Added int
	// Modified is the number of entries written that the before tree had (changed, or
	// written again because another name of their inode changed).
	Modified int
	// Deleted is the number of whiteouts written (a deleted directory is one).
	Deleted int
	// HardLinks is the number of entries (among Added and Modified) written as hard links
	// to an earlier entry.
	HardLinks int
	// Bytes is the size of the regular files' content written.
	Bytes int64
	// Sockets is the number of sockets in the changed tree, which a layer cannot hold:
	// they are left out (and one that replaced an entry deletes it).
	Sockets int
}

// Diff writes to w, as an uncompressed tar layer, what changed from before to afterDir, and
// returns afterDir's tree (every regular file hashed), which can serve as the next step's
// before (see Snapshot).
//
// The layer holds every entry of afterDir that is new or differs from before in kind, mode,
// owner, group, content, link target, hard-link group or modification time (as clamped),
// with its content, and a whiteout (.wh.NAME, an empty regular file) for every entry of
// before that is gone, but not for those under a deleted directory (one whiteout of the
// directory hides them) or under a directory replaced by something else (the replacement
// hides them). When one name of a set of hard links is written, all are: the first in layer
// order as the file, the others as tar hard links to it. Entries are in layer order
// (Compare), owners numeric, times clamped to o.Epoch, no access or change times, no
// extended attributes; PAX records appear only where USTAR cannot hold a value (long or
// non-ASCII names, large ids). A nil before writes all of afterDir.
//
// Diff fails, naming the path, on a device node anywhere in afterDir (ErrDevice), on an
// entry to write whose name starts with .wh. (ErrWhiteoutName), and if afterDir changes
// while it is read (ErrChanged). On error, what was written to w is not a layer.
func Diff(before *Tree, afterDir string, w io.Writer, o Options) (*Tree, Stats, error) {
	after, st, err := diff(before, afterDir, w, o)
	if err != nil {
		return nil, st, fmt.Errorf("diffing %s: %w", afterDir, err)
	}
	return after, st, nil
}

// item is one entry of the layer: an entry of the after tree, or a whiteout.
type item struct {
	name     string // the name in the layer, without a trailing slash
	e        *Entry // nil for a whiteout
	existed  bool   // the before tree had this name
	linkedTo string // for a hard link, the name it links to
}

func diff(before *Tree, afterDir string, w io.Writer, o Options) (*Tree, Stats, error) {
	if before == nil {
		before = &Tree{entries: map[string]*Entry{}}
	}
	epoch := o.epoch()
	after := &Tree{entries: map[string]*Entry{}}
	s := &scanner{tree: after, refuseDevices: true, hash: func(e *Entry) bool {
		// Only a file whose metadata matches needs its content compared; the others are
		// written, and hashed then.
		b := before.entries[e.Name]
		return b != nil && b.Kind == KindFile && b.Size == e.Size && b.Mode == e.Mode &&
			b.UID == e.UID && b.GID == e.GID && clamp(b.ModTime, epoch).Equal(clamp(e.ModTime, epoch))
	}}
	if err := s.scan(afterDir); err != nil {
		return nil, Stats{}, err
	}
	groups := after.groups()
	st := Stats{Sockets: after.Sockets}

	write := map[string]bool{}
	for name, a := range after.entries {
		if changed(before, after, before.entries[name], a, epoch) {
			write[name] = true
		}
	}
	for _, g := range groups {
		if slices.ContainsFunc(g, func(n string) bool { return write[n] }) {
			for _, n := range g {
				write[n] = true
			}
		}
	}
	var items []item
	for name := range write {
		if strings.HasPrefix(path.Base(name), WhiteoutPrefix) {
			return nil, st, fmt.Errorf("/%s: %w", name, ErrWhiteoutName)
		}
		a := after.entries[name]
		it := item{name: name, e: a, existed: before.entries[name] != nil}
		if a.FirstLink != "" && a.FirstLink != name {
			it.linkedTo = a.FirstLink
		}
		items = append(items, it)
	}
	for name := range before.entries {
		if after.entries[name] != nil {
			continue
		}
		dir := path.Dir(name)
		if p := after.entries[dir]; dir == "." || (p != nil && p.Kind == KindDir) {
			items = append(items, item{name: path.Join(dir, WhiteoutPrefix+path.Base(name))})
		}
	}
	slices.SortFunc(items, func(a, b item) int { return Compare(a.name, b.name) })

	root, err := os.OpenFile(afterDir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, st, err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	for _, it := range items {
		if err := writeItem(tw, root, after, it, epoch, &st); err != nil {
			return nil, st, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, st, err
	}
	return after, st, nil
}

// changed reports whether a, of the after tree, must be written over b, of the before tree
// (nil if it had no such name).
func changed(before, after *Tree, b, a *Entry, epoch time.Time) bool {
	switch {
	case b == nil, b.Kind != a.Kind, b.Mode != a.Mode, b.UID != a.UID, b.GID != a.GID,
		!clamp(b.ModTime, epoch).Equal(clamp(a.ModTime, epoch)):
		return true
	case a.Kind != KindDir && before.linkKey(b.Name) != after.linkKey(a.Name):
		return true
	}
	switch a.Kind {
	case KindFile:
		return b.Size != a.Size || a.Digest == "" || a.Digest != b.Digest
	case KindSymlink:
		return b.Target != a.Target
	case KindCharDevice, KindBlockDevice:
		return b.Major != a.Major || b.Minor != a.Minor
	}
	return false
}

// writeItem writes one entry of the layer.
func writeItem(tw *tar.Writer, root *os.File, after *Tree, it item, epoch time.Time, st *Stats) error {
	h := &tar.Header{Name: it.name, ModTime: epoch, Format: tar.FormatPAX}
	if it.e == nil {
		h.Typeflag = tar.TypeReg
		st.Deleted++
		return tw.WriteHeader(h)
	}
	e := it.e
	if it.existed {
		st.Modified++
	} else {
		st.Added++
	}
	h.Mode, h.Uid, h.Gid, h.ModTime = int64(e.Mode), e.UID, e.GID, clamp(e.ModTime, epoch)
	if it.linkedTo != "" {
		h.Typeflag, h.Linkname = tar.TypeLink, it.linkedTo
		st.HardLinks++
		e.Digest = after.entries[it.linkedTo].Digest
		return tw.WriteHeader(h)
	}
	switch e.Kind {
	case KindDir:
		h.Typeflag, h.Name = tar.TypeDir, it.name+"/"
	case KindSymlink:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
	case KindFifo:
		h.Typeflag = tar.TypeFifo
	case KindFile:
		h.Typeflag, h.Size = tar.TypeReg, e.Size
		f, err := openPath(root, e)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("writing /%s: %w", e.Name, err)
		}
		d, err := digest(f, e, tw)
		if err != nil {
			return err
		}
		if e.Digest != "" && e.Digest != d {
			return fmt.Errorf("/%s: %w (its content changed)", e.Name, ErrChanged)
		}
		e.Digest = d
		st.Bytes += e.Size
		return nil
	default:
		return fmt.Errorf("/%s: a %s cannot be written to a layer", e.Name, e.Kind)
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("writing /%s: %w", e.Name, err)
	}
	return nil
}
