package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"

	"golang.org/x/sync/errgroup"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// streamChunk is the size of one WriteFileStream message.
var streamChunk = 2 << 20

// File is one file to write. Mode zero means 0644.
type File struct {
	Path string
	Data []byte
	Mode fs.FileMode
}

// Symlink is a link to create; Target must resolve inside the workspace.
type Symlink struct {
	Target, Path string
}

// WriteStats describes a completed write.
type WriteStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
	Batches, Streamed     int // WriteFiles RPCs and WriteFileStream RPCs
}

// WriteFiles writes files, creating mkdirs (pruned first) and symlinks, in as few RPCs as the
// batch limit allows: small files are bin-packed into WriteFiles batches sent concurrently, and
// files larger than a batch are streamed. Every file is written atomically; on error some
// files may have been written, none partially.
func (s *Sandbox) WriteFiles(ctx context.Context, files []File, mkdirs []string, symlinks []Symlink) (WriteStats, error) {
	fw := make([]*sandboxv1.FileWrite, len(files))
	for i, f := range files {
		fw[i] = &sandboxv1.FileWrite{Path: f.Path, Data: f.Data, Mode: uint32(f.Mode.Perm())}
	}
	ls := make([]*sandboxv1.SymlinkSpec, len(symlinks))
	for i, l := range symlinks {
		ls[i] = &sandboxv1.SymlinkSpec{Target: l.Target, Path: l.Path}
	}
	return s.write(ctx, fw, PruneMkdirs(mkdirs), ls)
}

func (s *Sandbox) write(ctx context.Context, files []*sandboxv1.FileWrite, mkdirs []string, symlinks []*sandboxv1.SymlinkSpec) (WriteStats, error) {
	batches, streamed := pack(files, mkdirs, symlinks, s.opts.BatchBytes)
	var st WriteStats
	var mu sync.Mutex // guards st
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(s.opts.Concurrency)
	for _, b := range batches {
		g.Go(func() error {
			resp, err := s.rpc.WriteFiles(ctx, b)
			if err != nil {
				return fmt.Errorf("writing batch of %d files: %w", len(b.Files), err)
			}
			mu.Lock()
			st.Files += int(resp.GetFilesWritten())
			st.Dirs += int(resp.GetDirsCreated())
			st.Symlinks += int(resp.GetSymlinksCreated())
			st.Bytes += int64(resp.GetBytesWritten())
			st.Batches++
			mu.Unlock()
			return nil
		})
	}
	for _, f := range streamed {
		g.Go(func() error {
			n, err := s.writeStream(ctx, f.GetPath(), fs.FileMode(f.GetMode()), bytes.NewReader(f.GetData()), int64(len(f.GetData())))
			if err != nil {
				return err
			}
			mu.Lock()
			st.Files++
			st.Bytes += n
			st.Streamed++
			mu.Unlock()
			return nil
		})
	}
	err := g.Wait()
	return st, err
}

// WriteFile writes one file of any size: in a batch when it is small, else as a stream.
func (s *Sandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	_, err := s.WriteFiles(ctx, []File{{Path: p, Data: data, Mode: mode}}, nil, nil)
	return err
}

// WriteFileFrom streams r into the file at p; the file appears atomically when r is
// exhausted and never partially. When size is not negative the sandbox checks that exactly
// size bytes arrived (zero included); pass -1 for a stream of unknown length.
func (s *Sandbox) WriteFileFrom(ctx context.Context, p string, mode fs.FileMode, r io.Reader, size int64) (int64, error) {
	return s.writeStream(ctx, p, mode, r, size)
}

func (s *Sandbox) writeStream(ctx context.Context, p string, mode fs.FileMode, r io.Reader, size int64) (int64, error) {
	hdr := &sandboxv1.WriteFileHeader{Path: p, Mode: uint32(mode.Perm())}
	if size >= 0 {
		hdr.Size = &size
	}
	if s.bulk != nil {
		n, err := s.bulk.write(ctx, hdr, r)
		if !errors.Is(err, errNoBulk) {
			if err != nil {
				return 0, fmt.Errorf("streaming %s: %w", p, err)
			}
			return n, nil
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // aborts the stream (and so the file) on any early return
	stream, err := s.rpc.WriteFileStream(ctx)
	if err != nil {
		return 0, fmt.Errorf("streaming %s: %w", p, err)
	}
	buf := make([]byte, streamChunk)
	first := true
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || first {
			msg := &sandboxv1.WriteFileChunk{Data: buf[:n]}
			if first {
				msg.Header, first = hdr, false
			}
			if err := stream.Send(msg); err != nil {
				_, err = stream.CloseAndRecv() // the server's reason
				return 0, fmt.Errorf("streaming %s: %w", p, err)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return 0, fmt.Errorf("streaming %s: reading source: %w", p, rerr)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return 0, fmt.Errorf("streaming %s: %w", p, err)
	}
	return int64(resp.GetBytesWritten()), nil
}

// WriteTree copies the local directory tree at localDir into remoteDir in the workspace:
// regular files, directories (empty ones included) and relative symlinks. File modes are kept.
func (s *Sandbox) WriteTree(ctx context.Context, localDir, remoteDir string) (WriteStats, error) {
	var files []*sandboxv1.FileWrite
	var dirs []string
	var links []*sandboxv1.SymlinkSpec
	remote := func(rel string) string { return path.Join(remoteDir, filepath.ToSlash(rel)) }
	err := filepath.WalkDir(localDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(localDir, p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if rel != "." || remoteDir != "" {
				dirs = append(dirs, remote(rel))
			}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				return fmt.Errorf("%s: absolute symlink target %q cannot be kept inside the workspace", p, target)
			}
			links = append(links, &sandboxv1.SymlinkSpec{Target: filepath.ToSlash(target), Path: remote(rel)})
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			files = append(files, &sandboxv1.FileWrite{Path: remote(rel), Data: data, Mode: uint32(info.Mode().Perm())})
		default:
			// Devices, sockets and pipes have no meaning in a workspace.
		}
		return nil
	})
	if err != nil {
		return WriteStats{}, fmt.Errorf("reading %s: %w", localDir, err)
	}
	return s.write(ctx, files, PruneMkdirs(dirs), links)
}

// ReadFiles fetches the files matching paths (plain paths, directories or globs with *, ?,
// [...] and **) through a plan: the sandbox says which files go in which batch and which are
// streamed, and the client executes the plan concurrently. Paths and patterns that matched
// nothing are listed in the stats, not treated as errors.
func (s *Sandbox) ReadFiles(ctx context.Context, paths ...string) (map[string][]byte, ReadStats, error) {
	plan, err := s.rpc.GetReadFilesPlan(ctx, &sandboxv1.GetReadFilesPlanRequest{Paths: paths, MaxBatchBytes: uint64(s.opts.BatchBytes)})
	if err != nil {
		return nil, ReadStats{}, fmt.Errorf("planning read: %w", err)
	}
	st := ReadStats{Missing: plan.GetMissing(), Batches: len(plan.GetBatches()), Streamed: len(plan.GetStreamed()), Bytes: int64(plan.GetTotalBytes())}
	files := make(map[string][]byte, len(plan.GetBatches())*16+len(plan.GetStreamed()))
	var mu sync.Mutex // guards files
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.opts.Concurrency)
	for _, b := range plan.GetBatches() {
		g.Go(func() error {
			req := &sandboxv1.ReadFilesRequest{Paths: make([]string, len(b.GetFiles()))}
			for i, f := range b.GetFiles() {
				req.Paths[i] = f.GetPath()
			}
			resp, err := s.rpc.ReadFiles(gctx, req)
			if err != nil {
				return fmt.Errorf("reading batch of %d files: %w", len(req.Paths), err)
			}
			mu.Lock()
			for _, f := range resp.GetFiles() {
				files[f.GetPath()] = f.GetData()
			}
			mu.Unlock()
			return nil
		})
	}
	for _, f := range plan.GetStreamed() {
		g.Go(func() error {
			var buf bytes.Buffer
			buf.Grow(int(f.GetSize()))
			if err := s.ReadFileTo(gctx, f.GetPath(), &buf); err != nil {
				return err
			}
			mu.Lock()
			files[f.GetPath()] = buf.Bytes()
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, st, err
	}
	return files, st, nil
}

// ReadStats describes a completed read: the plan's size and what matched nothing.
type ReadStats struct {
	Missing           []string
	Batches, Streamed int // ReadFiles and ReadFileStream RPCs (plus one GetReadFilesPlan)
	Bytes             int64
}

// ReadFile returns one file's contents.
func (s *Sandbox) ReadFile(ctx context.Context, p string) ([]byte, error) {
	var buf bytes.Buffer
	if err := s.ReadFileTo(ctx, p, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ReadFileTo streams the file at p into w.
func (s *Sandbox) ReadFileTo(ctx context.Context, p string, w io.Writer) error {
	if s.bulk != nil {
		err := s.bulk.read(ctx, &sandboxv1.ReadFileStreamRequest{Path: p}, w)
		if !errors.Is(err, errNoBulk) {
			if err != nil {
				return fmt.Errorf("reading %s: %w", p, err)
			}
			return nil
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.rpc.ReadFileStream(ctx, &sandboxv1.ReadFileStreamRequest{Path: p})
	if err != nil {
		return fmt.Errorf("reading %s: %w", p, err)
	}
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		if _, err := w.Write(c.GetData()); err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
	}
}

// Stat describes p (the link itself for a symlink unless follow is set).
func (s *Sandbox) Stat(ctx context.Context, p string, follow bool) (*sandboxv1.FileInfo, error) {
	r, err := s.rpc.Stat(ctx, &sandboxv1.StatRequest{Path: p, FollowSymlinks: follow})
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", p, err)
	}
	return r.GetInfo(), nil
}

// List lists the directory p; with recursive, maxDepth levels deep (0: unlimited).
func (s *Sandbox) List(ctx context.Context, p string, recursive bool, maxDepth int) ([]*sandboxv1.FileInfo, error) {
	r, err := s.rpc.List(ctx, &sandboxv1.ListRequest{Path: p, Recursive: recursive, MaxDepth: uint32(maxDepth)})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	return r.GetEntries(), nil
}

// Mkdir creates the directory p (and its parents with parents set).
func (s *Sandbox) Mkdir(ctx context.Context, p string, parents bool) error {
	if _, err := s.rpc.Mkdir(ctx, &sandboxv1.MkdirRequest{Path: p, Parents: parents}); err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

// Remove removes p (recursively with recursive set).
func (s *Sandbox) Remove(ctx context.Context, p string, recursive bool) error {
	if _, err := s.rpc.Remove(ctx, &sandboxv1.RemoveRequest{Path: p, Recursive: recursive}); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Rename moves from to to, replacing an existing destination only with overwrite set.
func (s *Sandbox) Rename(ctx context.Context, from, to string, overwrite bool) error {
	if _, err := s.rpc.Rename(ctx, &sandboxv1.RenameRequest{From: from, To: to, Overwrite: overwrite}); err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	return nil
}

// Symlink creates a symlink at p pointing to target (which must stay inside the workspace).
func (s *Sandbox) Symlink(ctx context.Context, target, p string) error {
	if _, err := s.rpc.Symlink(ctx, &sandboxv1.SymlinkRequest{Target: target, Path: p}); err != nil {
		return fmt.Errorf("symlink %s -> %s: %w", p, target, err)
	}
	return nil
}

// Find searches under req.Path.
func (s *Sandbox) Find(ctx context.Context, req *sandboxv1.FindRequest) (*sandboxv1.FindResponse, error) {
	r, err := s.rpc.Find(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("find: %w", err)
	}
	return r, nil
}

// Grep searches file contents with an RE2 pattern.
func (s *Sandbox) Grep(ctx context.Context, req *sandboxv1.GrepRequest) (*sandboxv1.GrepResponse, error) {
	r, err := s.rpc.Grep(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("grep %q: %w", req.GetPattern(), err)
	}
	return r, nil
}
