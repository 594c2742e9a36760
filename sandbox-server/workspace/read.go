package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"syscall"

	"github.com/fusebox-dev/fusebox/internal/binpack"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// streamChunkBytes is the data size of one ReadStream chunk: large, because under gVisor
// each read of the file is a round through the sentry (the chunk leaves in 16 KiB HTTP/2
// frames whatever its size).
const streamChunkBytes = 1 << 20

// ReadPlan resolves plain paths and globs to regular files and packs them into ReadFiles
// batches of at most the batch limit (req.MaxBatchBytes when nonzero and smaller than
// MaxBatchBytes); larger files are to be streamed. A plain directory stands for every regular
// file below it. Symlinks met while walking are followed beneath the root when they name a
// regular file inside the workspace (dangling and escaping ones are skipped) and never
// descended into; a directory matching a glob is not expanded. A plain path that leaves the
// workspace, lexically or through a symlink, is ErrEscape. Patterns matching nothing and plain
// paths that do not exist (or are neither regular files nor directories) are listed in Missing.
// Every file appears once, under the first name it was found by; batches are deterministic.
func (w *Workspace) ReadPlan(ctx context.Context, req *sandboxv1.GetReadFilesPlanRequest) (*sandboxv1.ReadFilesPlan, error) {
	type entry struct {
		pattern string
		rel     string
		g       *glob // nil for a plain path
	}
	entries := make([]entry, 0, len(req.GetPaths()))
	for _, p := range req.GetPaths() {
		rel, err := w.Resolve(p)
		if err != nil {
			return nil, fmt.Errorf("planning read: %w", err)
		}
		e := entry{pattern: p, rel: rel}
		if hasMeta(rel) {
			if e.g, err = compileGlob(rel); err != nil {
				return nil, fmt.Errorf("planning read: %w", err)
			}
		}
		entries = append(entries, e)
	}

	pl := planner{w: w, seen: make(map[string]bool)}
	plan := &sandboxv1.ReadFilesPlan{}
	for _, e := range entries {
		before := len(pl.files)
		var err error
		if e.g != nil {
			err = pl.addGlob(ctx, e.g)
		} else {
			err = pl.addPath(ctx, e.rel)
		}
		if errors.Is(err, errMissing) {
			plan.Missing = append(plan.Missing, e.pattern)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("planning read of %q: %w", short(e.pattern), err)
		}
		if e.g != nil && len(pl.files) == before && !pl.matchedSeen {
			plan.Missing = append(plan.Missing, e.pattern)
		}
	}

	limit := uint64(w.maxBatchBytes)
	if b := req.GetMaxBatchBytes(); b != 0 && b < limit {
		limit = b
	}
	plan.Batches, plan.Streamed, plan.TotalBytes = packBatches(pl.files, limit)
	return plan, nil
}

var errMissing = errors.New("missing")

// planner collects the regular files of a plan.
type planner struct {
	w           *Workspace
	seen        map[string]bool
	files       []*sandboxv1.PlannedFile
	matchedSeen bool // the current glob matched a file already planned
}

func (pl *planner) add(rel string, fi fs.FileInfo) error {
	if pl.seen[rel] {
		pl.matchedSeen = true
		return nil
	}
	if len(pl.files) >= pl.w.maxFind {
		return fmt.Errorf("%w: more than %d files", ErrLimit, pl.w.maxFind)
	}
	pl.seen[rel] = true
	pl.files = append(pl.files, &sandboxv1.PlannedFile{Path: rel, Size: uint64(max(fi.Size(), 0)), Mode: unixMode(fi.Mode())})
	return nil
}

// addPath plans a plain path: a regular file, or every regular file below a directory.
func (pl *planner) addPath(ctx context.Context, rel string) error {
	fi, err := pl.w.root.stat(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !isEscape(err) {
			return errMissing
		}
		return wrap("stat", rel, err)
	}
	switch {
	case fi.Mode().IsRegular():
		return pl.add(rel, fi)
	case fi.IsDir():
		return wrap("walking", rel, pl.w.walk(ctx, rel, 0, func(e *walkEntry) (bool, error) {
			return true, pl.addWalked(e)
		}))
	default:
		return errMissing
	}
}

// addGlob plans the regular files matching g, walking from its literal prefix.
func (pl *planner) addGlob(ctx context.Context, g *glob) error {
	pl.matchedSeen = false
	start := g.literalPrefix()
	fi, err := pl.w.root.stat(start)
	if isEscape(err) {
		return wrap("stat", start, err)
	}
	if err != nil || !fi.IsDir() {
		return nil // nothing can match
	}
	err = pl.w.walk(ctx, start, 0, func(e *walkEntry) (bool, error) {
		if e.info.IsDir() {
			return g.mayMatchBelow(e.rel), nil
		}
		if !g.match(e.rel) {
			return false, nil
		}
		return false, pl.addWalked(e)
	})
	return wrap("walking", start, err)
}

// addWalked plans a walked entry if it is a regular file or a symlink to one inside the root.
func (pl *planner) addWalked(e *walkEntry) error {
	switch {
	case e.info.Mode().IsRegular():
		return pl.add(e.rel, e.info)
	case e.info.Mode()&fs.ModeSymlink != 0:
		fi, err := pl.w.root.stat(e.rel)
		if err != nil || !fi.Mode().IsRegular() {
			return nil // dangling, escaping, or not a file
		}
		return pl.add(e.rel, fi)
	}
	return nil
}

// packBatches packs files into batches of at most limit bytes (package binpack: first fit
// over the files in decreasing size, ties in path order); files over limit are streamed.
// First fit only looks at the most recent batches, so packing stays linear for any number of
// files. Batches, the files in each and the streamed files are sorted by path.
func packBatches(files []*sandboxv1.PlannedFile, limit uint64) ([]*sandboxv1.ReadBatch, []*sandboxv1.PlannedFile, uint64) {
	const lookBack = 64
	var total uint64
	for _, f := range files {
		total += f.Size
	}
	byPath := func(a, b *sandboxv1.PlannedFile) int { return strings.Compare(a.Path, b.Path) }
	files = slices.SortedFunc(slices.Values(files), byPath)
	// Sizes come from stat and limit from MaxBatchBytes (an int64): both fit an int64.
	bins, streamed := binpack.FirstFitDecreasing(files, func(f *sandboxv1.PlannedFile) int64 { return int64(f.Size) },
		binpack.Bins{Capacity: int64(limit), LookBack: lookBack})
	batches := make([]*sandboxv1.ReadBatch, 0, len(bins))
	for _, b := range bins {
		batch := &sandboxv1.ReadBatch{Files: b}
		for _, f := range b {
			batch.TotalBytes += f.Size
		}
		slices.SortFunc(batch.Files, byPath)
		batches = append(batches, batch)
	}
	slices.SortFunc(batches, func(a, b *sandboxv1.ReadBatch) int { return byPath(a.Files[0], b.Files[0]) })
	slices.SortFunc(streamed, byPath)
	return batches, streamed, total
}

// ReadFiles returns the contents of regular files (symlinks inside the workspace are
// followed). Their total may not exceed MaxBatchBytes: sizes are checked while reading, so a
// file that grew since it was planned still cannot push a response over the limit.
func (w *Workspace) ReadFiles(ctx context.Context, req *sandboxv1.ReadFilesRequest) (*sandboxv1.ReadFilesResponse, error) {
	rels := make([]string, 0, len(req.GetPaths()))
	for _, p := range req.GetPaths() {
		rel, err := w.Resolve(p)
		if err != nil {
			return nil, fmt.Errorf("reading files: %w", err)
		}
		rels = append(rels, rel)
	}
	cache := newDirCache(w.root)
	defer cache.close()
	resp := &sandboxv1.ReadFilesResponse{Files: make([]*sandboxv1.FileContent, 0, len(rels))}
	budget := w.maxBatchBytes
	for _, rel := range rels {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		data, mode, err := w.readSmall(cache, rel, budget)
		if err != nil {
			return nil, wrap("reading", rel, err)
		}
		budget -= int64(len(data))
		resp.Files = append(resp.Files, &sandboxv1.FileContent{Path: rel, Data: data, Mode: unixMode(mode)})
	}
	return resp, nil
}

// readSmall reads one regular file of at most budget bytes (and MaxFileBytes).
func (w *Workspace) readSmall(cache *dirCache, rel string, budget int64) ([]byte, fs.FileMode, error) {
	h, err := w.openRegular(cache, rel)
	if err != nil {
		return nil, 0, err
	}
	defer h.Close()
	size, mode, _ := h.stat() // checked by openRegular
	limit := min(budget, w.maxFileBytes)
	if size > limit {
		return nil, 0, fmt.Errorf("%w: %d bytes, %d left in this batch", ErrLimit, size, limit)
	}
	// One byte of room beyond the size lets the read that sees EOF need no reallocation.
	buf := make([]byte, 0, size+1)
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return nil, 0, fmt.Errorf("%w: grew over %d bytes left in this batch", ErrLimit, limit)
			}
			buf = slices.Grow(buf, min(max(len(buf), 4096), int(limit+1)-len(buf)))
		}
		n, err := h.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, err
		}
	}
	if int64(len(buf)) > limit {
		return nil, 0, fmt.Errorf("%w: grew over %d bytes left in this batch", ErrLimit, limit)
	}
	return buf, mode, nil
}

// openRegular opens rel for reading through its cached parent directory, following a final
// symlink beneath the root, and refuses anything but a regular file.
func (w *Workspace) openRegular(cache *dirCache, rel string) (handle, error) {
	if rel == "." {
		return nil, &fs.PathError{Op: "read", Path: rel, Err: syscall.EISDIR}
	}
	dir, name := splitRel(rel)
	d, err := cache.get(dir, false)
	if err != nil {
		return nil, err
	}
	h, err := d.openRead(name)
	if err == errFollow {
		h, err = w.root.openRead(rel)
	}
	if err != nil {
		return nil, err
	}
	if err := checkRegular(h, rel); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// checkRegular refuses directories (EISDIR) and other non-regular files.
func checkRegular(h handle, rel string) error {
	_, mode, err := h.stat()
	switch {
	case err != nil:
		return err
	case mode.IsDir():
		return &fs.PathError{Op: "read", Path: rel, Err: syscall.EISDIR}
	case !mode.IsRegular():
		return fmt.Errorf("%w: %q is not a regular file", ErrInvalidArgument, rel)
	}
	return nil
}

// FileReader is a regular file opened for streaming out (OpenStream): its size when it was
// opened, and its bytes from the offset asked for up to that size, in order.
type FileReader struct {
	h         handle
	rel       string
	size, off int64
}

// OpenStream opens the regular file req names for streaming out from req.Offset (an offset
// past the end reads nothing). The caller closes it.
func (w *Workspace) OpenStream(req *sandboxv1.ReadFileStreamRequest) (*FileReader, error) {
	rel, err := w.Resolve(req.GetPath())
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return nil, &fs.PathError{Op: "read", Path: rel, Err: syscall.EISDIR}
	}
	h, err := w.root.openRead(rel)
	if err != nil {
		return nil, wrap("reading", rel, err)
	}
	if err := checkRegular(h, rel); err != nil {
		h.Close()
		return nil, wrap("reading", rel, err)
	}
	size, _, _ := h.stat()
	if size > w.maxFileBytes {
		h.Close()
		return nil, fmt.Errorf("reading %q: %w: %d bytes, the limit is %d", rel, ErrLimit, size, w.maxFileBytes)
	}
	return &FileReader{h: h, rel: rel, size: size, off: int64(min(req.GetOffset(), uint64(size)))}, nil
}

// Size is the file's size when it was opened.
func (r *FileReader) Size() int64 { return r.size }

// Left is how many bytes remain to be read, up to the size the file had when it was opened.
func (r *FileReader) Left() int64 { return r.size - r.off }

// Read reads the next bytes into p, up to the size the file had when it was opened, and
// returns io.EOF after the last (or when the file shrank).
func (r *FileReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	n, err := r.h.ReadAt(p[:min(int64(len(p)), r.size-r.off)], r.off)
	r.off += int64(n)
	switch {
	case err == io.EOF && n > 0:
		err = nil // the file shrank: the next Read says so
	case err == nil && n == 0:
		err = io.EOF
	case err != nil && err != io.EOF:
		err = wrap("reading", r.rel, err)
	}
	return n, err
}

// Close closes the file.
func (r *FileReader) Close() error { return r.h.Close() }

// ReadStream sends one regular file from req.Offset in chunks of streamChunkBytes, up to the
// size it had when opened; the first chunk carries that size (a single empty chunk is sent
// when there is nothing to read). The chunks share one buffer: send must be done with a
// chunk's data when it returns, as gRPC's SendMsg is (it has encoded the message into its own
// buffer by then, and the data server installs no stats handler or binary log that could
// read it later).
func (w *Workspace) ReadStream(ctx context.Context, req *sandboxv1.ReadFileStreamRequest, send func(*sandboxv1.ReadFileChunk) error) error {
	r, err := w.OpenStream(req)
	if err != nil {
		return err
	}
	defer r.Close()
	first := true
	buf := make([]byte, min(streamChunkBytes, r.Left()))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := r.Read(buf)
		if err != nil && err != io.EOF {
			return err
		}
		if n > 0 || first {
			chunk := &sandboxv1.ReadFileChunk{Data: buf[:n]}
			if first {
				chunk.Size = uint64(r.size)
				first = false
			}
			if serr := send(chunk); serr != nil {
				return serr
			}
		}
		if err == io.EOF || n == 0 {
			return nil
		}
	}
}
