package workspace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// batch3000x4k is the seed's materialisation workload: 3,000 files of 4 KiB in 30 directories
// of 100 files (12 MiB, so in practice 4 RPC batches; here one call writes all of them).
func batch3000x4k() *sandboxv1.WriteFilesRequest {
	req := &sandboxv1.WriteFilesRequest{}
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for d := range 30 {
		req.Mkdirs = append(req.Mkdirs, fmt.Sprintf("src/pkg%02d", d))
		for f := range 100 {
			req.Files = append(req.Files, &sandboxv1.FileWrite{Path: fmt.Sprintf("src/pkg%02d/file%03d.go", d, f), Data: data})
		}
	}
	return req
}

// BenchmarkWriteFiles3000x4k writes the batch over an existing tree (files replaced), as the
// pool and sequential variants, against a plain open/write/close loop as the floor.
func BenchmarkWriteFiles3000x4k(b *testing.B) {
	req := batch3000x4k()
	for _, workers := range []int{0, 1, 4} {
		name := fmt.Sprintf("workers=%d", workers)
		if workers == 0 {
			name = "default"
		}
		b.Run(name, func(b *testing.B) {
			e := newEnvIn(b, memDir(b), func(o *Options) { o.MaxBatchBytes = 16 << 20 })
			if workers > 0 {
				e.w.writeWorkers = workers
			}
			ctx := context.Background()
			b.SetBytes(3000 * 4096)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.w.WriteFiles(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("floor=os.WriteFile", func(b *testing.B) {
		dir := memDir(b)
		for _, d := range req.Mkdirs {
			mustMkdir(b, filepath.Join(dir, d))
		}
		b.SetBytes(3000 * 4096)
		for b.Loop() {
			for _, f := range req.Files {
				if err := os.WriteFile(filepath.Join(dir, f.Path), f.Data, 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

func BenchmarkReadFiles(b *testing.B) {
	e := newEnvIn(b, memDir(b), func(o *Options) { o.MaxBatchBytes = 16 << 20 })
	ctx := context.Background()
	wreq := batch3000x4k()
	if _, err := e.w.WriteFiles(ctx, wreq); err != nil {
		b.Fatal(err)
	}
	req := &sandboxv1.ReadFilesRequest{}
	for _, f := range wreq.Files {
		req.Paths = append(req.Paths, f.Path)
	}
	b.SetBytes(3000 * 4096)
	for b.Loop() {
		if _, err := e.w.ReadFiles(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// memDir returns a fresh directory on /dev/shm when there is one: the sandbox's workspace is
// memory-backed, and a disk-backed TempDir measures the disk's journal instead of the code.
func memDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "fusebox-bench-")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
