package workspace

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// fileJob is one validated file of a WriteFiles batch.
type fileJob struct {
	rel, dir, name string
	data           []byte
	mode           uint32
}

// linkJob is one validated symlink of a WriteFiles batch.
type linkJob struct {
	rel, dir, target string
}

// WriteFiles applies a batch: mkdirs (MkdirAll, mode 0755), then files, then symlinks. Every
// path, mode, symlink target and limit is checked before anything is written, so invalid input
// anywhere rejects the whole batch untouched. Each file is written atomically (temp file, then
// rename over the destination) and replaces an existing file or symlink; each symlink likewise
// replaces an existing file or symlink. Missing parent directories of files and symlinks are
// created. The batch as a whole is not atomic: after an I/O error or cancellation the files
// written so far stay. When a path appears twice among the files, the last one wins.
func (w *Workspace) WriteFiles(ctx context.Context, req *sandboxv1.WriteFilesRequest) (*sandboxv1.WriteFilesResponse, error) {
	dirs := make([]string, 0, len(req.GetMkdirs()))
	for _, p := range req.GetMkdirs() {
		rel, err := w.Resolve(p)
		if err != nil {
			return nil, fmt.Errorf("writing files: mkdir: %w", err)
		}
		dirs = append(dirs, rel)
	}
	jobs, total, err := w.fileJobs(req.GetFiles())
	if err != nil {
		return nil, err
	}
	links := make([]linkJob, 0, len(req.GetSymlinks()))
	for _, s := range req.GetSymlinks() {
		rel, err := w.resolveNonRoot("writing symlink", s.GetPath())
		if err != nil {
			return nil, fmt.Errorf("writing files: symlink: %w", err)
		}
		if err := checkLinkTarget(rel, s.GetTarget()); err != nil {
			return nil, fmt.Errorf("writing files: %w", err)
		}
		dir, _ := splitRel(rel)
		links = append(links, linkJob{rel: rel, dir: dir, target: s.GetTarget()})
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	resp := &sandboxv1.WriteFilesResponse{}
	for _, d := range dirs {
		if err := w.root.mkdirAll(d, defaultDirMode); err != nil {
			return nil, wrap("creating directory", d, err)
		}
		resp.DirsCreated++
	}
	cache := newDirCache(w.root)
	defer cache.close()
	if err := w.writeJobs(ctx, cache, jobs); err != nil {
		return nil, err
	}
	resp.FilesWritten = uint32(len(jobs))
	resp.BytesWritten = uint64(total)
	for _, l := range links {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := w.replaceSymlink(cache, l); err != nil {
			return nil, wrap("writing symlink", l.rel, err)
		}
		resp.SymlinksCreated++
	}
	return resp, nil
}

// fileJobs validates the files of a batch and returns them with their total size.
func (w *Workspace) fileJobs(files []*sandboxv1.FileWrite) ([]fileJob, int64, error) {
	jobs := make([]fileJob, 0, len(files))
	var total int64
	for _, f := range files {
		rel, err := w.resolveNonRoot("writing", f.GetPath())
		if err != nil {
			return nil, 0, fmt.Errorf("writing files: %w", err)
		}
		mode, err := parseMode(f.GetMode(), defaultFileMode)
		if err != nil {
			return nil, 0, fmt.Errorf("writing %q: %w", rel, err)
		}
		n := int64(len(f.GetData()))
		if n > w.maxFileBytes {
			return nil, 0, fmt.Errorf("writing %q: %w: %d bytes, the limit is %d", rel, ErrLimit, n, w.maxFileBytes)
		}
		total += n
		if total > w.maxBatchBytes {
			return nil, 0, fmt.Errorf("writing files: %w: batch over %d bytes", ErrLimit, w.maxBatchBytes)
		}
		dir, name := splitRel(rel)
		jobs = append(jobs, fileJob{rel: rel, dir: dir, name: name, data: f.GetData(), mode: mode})
	}
	// Concurrent workers would make the winner of a duplicate path random; keep the last.
	if len(jobs) > 1 {
		last := make(map[string]int, len(jobs))
		for i, j := range jobs {
			last[j.rel] = i
		}
		if len(last) < len(jobs) {
			kept := jobs[:0]
			for i, j := range jobs {
				if last[j.rel] == i {
					kept = append(kept, j)
				}
			}
			jobs = kept
		}
	}
	return jobs, total, nil
}

// writeJobs writes the files, on a small worker pool when the batch is large enough: inside
// gVisor system calls from several threads proceed in parallel. All workers have returned when
// writeJobs returns. The error is that of the lowest-numbered failed file.
func (w *Workspace) writeJobs(ctx context.Context, cache *dirCache, jobs []fileJob) error {
	workers := 1
	if w.minFilesPerWorker > 0 {
		workers = min(w.writeWorkers, len(jobs)/w.minFilesPerWorker)
	}
	if workers <= 1 {
		for i := range jobs {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := w.writeJob(cache, &jobs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	var (
		next   atomic.Int64
		failed atomic.Bool
		wg     sync.WaitGroup
		errs   = make([]error, len(jobs))
	)
	for range workers {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) {
					return
				}
				err := ctx.Err()
				if err == nil {
					err = w.writeJob(cache, &jobs[i])
				}
				if err != nil {
					errs[i] = err
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *Workspace) writeJob(cache *dirCache, j *fileJob) error {
	d, err := cache.get(j.dir, true)
	if err != nil {
		return wrap("writing", j.rel, err)
	}
	err = w.writeAtomic(d, j.name, j.mode, func(dst io.Writer) error {
		_, err := dst.Write(j.data)
		return err
	})
	return wrap("writing", j.rel, err)
}

// writeAtomic creates a temp file in d with the final mode, fills it, and renames it over name.
// On any failure the temp file is removed, so the destination either keeps its old content or
// gets the complete new one. The temp file is created with the requested permission bits, and
// chmod is called only if the umask would strip some of them (one system call less per file).
// Nothing is fsynced: the workspace is memory-backed and lives no longer than the sandbox.
func (w *Workspace) writeAtomic(d *dirHandle, name string, mode uint32, fill func(io.Writer) error) (err error) {
	tmp, h, err := d.createTemp(mode)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			d.discard(tmp)
		}
	}()
	if err := fill(h); err != nil {
		h.Close()
		return err
	}
	if w.needChmod(mode) {
		if err := h.chmod(mode); err != nil {
			h.Close()
			return err
		}
	}
	if err := h.Close(); err != nil {
		return err
	}
	return d.commit(tmp, name)
}

// WriteStream writes one file from a stream: hdr first, then the chunks returned by next until
// it returns io.EOF. Missing parent directories are created. The file appears atomically when
// the stream ends cleanly; if next fails, ctx is cancelled, the stream exceeds MaxFileBytes,
// or its length differs from a positive hdr.Size, no file and no temp file is left, and an
// existing destination keeps its old content. It returns the number of bytes written.
func (w *Workspace) WriteStream(ctx context.Context, hdr *sandboxv1.WriteFileHeader, next func() ([]byte, error)) (uint64, error) {
	if hdr == nil {
		return 0, fmt.Errorf("writing stream: %w: missing header", ErrInvalidArgument)
	}
	rel, err := w.resolveNonRoot("writing", hdr.GetPath())
	if err != nil {
		return 0, err
	}
	mode, err := parseMode(hdr.GetMode(), defaultFileMode)
	if err != nil {
		return 0, fmt.Errorf("writing %q: %w", rel, err)
	}
	size, sized := hdr.GetSize(), hdr.Size != nil // a declared 0 is a size too
	switch {
	case size < 0:
		return 0, fmt.Errorf("writing %q: %w: negative size %d", rel, ErrInvalidArgument, size)
	case size > w.maxFileBytes:
		return 0, fmt.Errorf("writing %q: %w: %d bytes, the limit is %d", rel, ErrLimit, size, w.maxFileBytes)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	dir, name := splitRel(rel)
	d, err := openParent(w.root, dir, true)
	if err != nil {
		return 0, wrap("writing", rel, err)
	}
	defer d.close()

	var n int64
	err = w.writeAtomic(d, name, mode, func(dst io.Writer) error {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			b, err := next()
			if err != nil && err != io.EOF {
				return err
			}
			if n+int64(len(b)) > w.maxFileBytes {
				return fmt.Errorf("%w: stream over %d bytes", ErrLimit, w.maxFileBytes)
			}
			if sized && n+int64(len(b)) > size {
				return fmt.Errorf("%w: stream longer than its header's size %d", ErrInvalidArgument, size)
			}
			if len(b) > 0 {
				if _, werr := dst.Write(b); werr != nil {
					return werr
				}
				n += int64(len(b))
			}
			if err == io.EOF {
				break
			}
		}
		if sized && n != size {
			return fmt.Errorf("%w: stream of %d bytes, its header says %d", ErrInvalidArgument, n, size)
		}
		// A cancellation that arrived with the last chunk still aborts the write.
		return ctx.Err()
	})
	if err != nil {
		return 0, wrap("writing", rel, err)
	}
	return uint64(n), nil
}

// checkLinkTarget checks that a symlink at rel with the given target resolves inside the
// workspace: the target must be relative, and the link's directory joined with it must not
// climb out. The check is lexical; path resolution beneath the root enforces the same
// physically whenever the server follows the link.
func checkLinkTarget(rel, target string) error {
	switch {
	case target == "":
		return fmt.Errorf("symlink %q: %w: empty target", rel, ErrInvalidPath)
	case len(target) > maxPathBytes:
		return fmt.Errorf("symlink %q: %w: target longer than %d bytes", rel, ErrInvalidPath, maxPathBytes)
	case strings.IndexByte(target, 0) >= 0:
		return fmt.Errorf("symlink %q: %w: target contains a NUL byte", rel, ErrInvalidPath)
	case path.IsAbs(target):
		return fmt.Errorf("symlink %q -> %q: %w: absolute target", rel, short(target), ErrEscape)
	}
	for name := range strings.SplitSeq(target, "/") {
		if len(name) > maxNameBytes {
			return fmt.Errorf("symlink %q: %w: target name longer than %d bytes", rel, ErrInvalidPath, maxNameBytes)
		}
	}
	dir, _ := splitRel(rel)
	if c := path.Join(dir, target); c == ".." || strings.HasPrefix(c, "../") {
		return fmt.Errorf("symlink %q -> %q: %w", rel, short(target), ErrEscape)
	}
	return nil
}

// replaceSymlink creates the link under a temp name and renames it over the destination, so a
// batch can be re-applied and an existing file or link is replaced atomically.
func (w *Workspace) replaceSymlink(cache *dirCache, l linkJob) error {
	d, err := cache.get(l.dir, true) // creates a missing parent
	if err != nil {
		return err
	}
	_, name := splitRel(l.rel)
	var tmp string
	for range 8 {
		tmp = tempName()
		err := d.symlink(l.target, tmp)
		if err == nil {
			break
		}
		if !isExist(err) {
			return err
		}
		tmp = ""
	}
	if tmp == "" {
		return fmt.Errorf("creating a temp symlink in %q: too many name collisions", l.dir)
	}
	if err := d.rename(tmp, d, name); err != nil {
		d.discard(tmp)
		return err
	}
	return nil
}
