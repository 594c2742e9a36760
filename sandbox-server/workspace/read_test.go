package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// planTree writes files of the given sizes.
func planTree(t *testing.T, e *env, sizes map[string]int) {
	t.Helper()
	for p, n := range sizes {
		full := filepath.Join(e.dir, filepath.FromSlash(p))
		mustMkdir(t, filepath.Dir(full))
		if err := os.WriteFile(full, bytes.Repeat([]byte{'x'}, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func planned(plan *sandboxv1.ReadFilesPlan) (batched, streamed []string) {
	for _, b := range plan.Batches {
		for _, f := range b.Files {
			batched = append(batched, f.Path)
		}
	}
	for _, f := range plan.Streamed {
		streamed = append(streamed, f.Path)
	}
	slices.Sort(batched)
	return batched, streamed
}

func TestReadPlan(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBatchBytes = 100 })
	e.addEvilLinks(t) // escaping links met by walks are skipped
	planTree(t, e, map[string]int{
		"a.go": 10, "b.txt": 20, "src/c.go": 30, "src/d/e.go": 40, "src/d/f/g.go": 50,
		"big.bin": 150, "src/huge.go": 101, "docs/x.md": 5, ".hidden/h.go": 1,
	})
	if err := os.Symlink("src/c.go", filepath.Join(e.dir, "clink.go")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("src", filepath.Join(e.dir, "srclink")); err != nil { // not descended by walks
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(e.dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		paths        []string
		maxBatch     uint64
		wantBatched  []string
		wantStreamed []string
		wantMissing  []string
	}{
		{name: "plain files", paths: []string{"a.go", "/workspace/b.txt"}, wantBatched: []string{"a.go", "b.txt"}},
		{name: "star", paths: []string{"*.go"}, wantBatched: []string{"a.go", "clink.go"}},
		{name: "double star", paths: []string{"**/*.go"}, wantBatched: []string{".hidden/h.go", "a.go", "clink.go", "src/c.go", "src/d/e.go", "src/d/f/g.go"}, wantStreamed: []string{"src/huge.go"}},
		{name: "double star zero segments", paths: []string{"src/**/e.go"}, wantBatched: []string{"src/d/e.go"}},
		{name: "double star in the middle", paths: []string{"src/**/f/*.go"}, wantBatched: []string{"src/d/f/g.go"}},
		{name: "trailing double star", paths: []string{"src/d/**"}, wantBatched: []string{"src/d/e.go", "src/d/f/g.go"}},
		{name: "question and class", paths: []string{"?.g[aeiou]", "[b].txt"}, wantBatched: []string{"a.go", "b.txt"}},
		{name: "directory", paths: []string{"src"}, wantBatched: []string{"src/c.go", "src/d/e.go", "src/d/f/g.go"}, wantStreamed: []string{"src/huge.go"}},
		{name: "symlinked directory as a plain path", paths: []string{"srclink/d"}, wantBatched: []string{"srclink/d/e.go", "srclink/d/f/g.go"}},
		{name: "dedup", paths: []string{"a.go", "*.go", "a.go", "**"}, wantBatched: []string{".hidden/h.go", "a.go", "b.txt", "clink.go", "docs/x.md", "src/c.go", "src/d/e.go", "src/d/f/g.go", "sub/a"}, wantStreamed: []string{"big.bin", "src/huge.go"}},
		{name: "missing", paths: []string{"nope", "*.rs", "a.go", "nodir/**", "dangling", "fifo"}, wantBatched: []string{"a.go"}, wantMissing: []string{"nope", "*.rs", "nodir/**", "dangling", "fifo"}},
		{name: "all matches seen already is not missing", paths: []string{"a.go", "a.g?"}, wantBatched: []string{"a.go"}},
		{name: "small client batches", paths: []string{"src/**"}, maxBatch: 45, wantBatched: []string{"src/c.go", "src/d/e.go"}, wantStreamed: []string{"src/d/f/g.go", "src/huge.go"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := e.w.ReadPlan(context.Background(), &sandboxv1.GetReadFilesPlanRequest{Paths: tt.paths, MaxBatchBytes: tt.maxBatch})
			if err != nil {
				t.Fatal(err)
			}
			batched, streamed := planned(plan)
			if !slices.Equal(batched, tt.wantBatched) || !slices.Equal(streamed, tt.wantStreamed) || !slices.Equal(plan.Missing, tt.wantMissing) {
				t.Fatalf("batched %q streamed %q missing %q\nwant %q %q %q", batched, streamed, plan.Missing, tt.wantBatched, tt.wantStreamed, tt.wantMissing)
			}
			limit := uint64(100)
			if tt.maxBatch != 0 {
				limit = tt.maxBatch
			}
			var total uint64
			for _, b := range plan.Batches {
				var sum uint64
				for _, f := range b.Files {
					sum += f.Size
				}
				if sum != b.TotalBytes || sum > limit || len(b.Files) == 0 {
					t.Errorf("batch %v: sum %d, limit %d", b, sum, limit)
				}
				total += sum
			}
			for _, f := range plan.Streamed {
				if f.Size <= limit {
					t.Errorf("streamed %s of %d bytes fits a batch", f.Path, f.Size)
				}
				total += f.Size
			}
			if total != plan.TotalBytes {
				t.Errorf("total %d, plan says %d", total, plan.TotalBytes)
			}
		})
	}
	for _, bad := range []string{"[", "a/[x", ""} {
		if _, err := e.w.ReadPlan(context.Background(), &sandboxv1.GetReadFilesPlanRequest{Paths: []string{bad}}); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("pattern %q: %v", bad, err)
		}
	}
}

// TestReadPlanPacking checks the packing invariants on many files: every file exactly once,
// no batch over the limit, and a near-optimal number of batches.
func TestReadPlanPacking(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBatchBytes = 1000 })
	sizes := map[string]int{}
	var sum int
	for i := range 300 {
		n := (i * 37) % 400
		sizes[fmt.Sprintf("d%d/f%03d", i%5, i)] = n
		sum += n
	}
	planTree(t, e, sizes)
	plan, err := e.w.ReadPlan(context.Background(), &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"**"}})
	if err != nil {
		t.Fatal(err)
	}
	batched, streamed := planned(plan)
	if len(streamed) != 0 || len(batched) != 300 || len(slices.Compact(slices.Clone(batched))) != 300 {
		t.Fatalf("%d batched, %d streamed", len(batched), len(streamed))
	}
	for _, b := range plan.Batches {
		if b.TotalBytes > 1000 {
			t.Errorf("batch of %d bytes", b.TotalBytes)
		}
	}
	if min := (sum + 999) / 1000; len(plan.Batches) > min+min/10+1 {
		t.Errorf("%d batches for %d bytes (at least %d)", len(plan.Batches), sum, min)
	}
	again, _ := e.w.ReadPlan(context.Background(), &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"**"}})
	if fmt.Sprint(again) != fmt.Sprint(plan) {
		t.Error("plan is not deterministic")
	}
}

func TestReadFiles(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxBatchBytes = 100 })
	ctx := context.Background()
	planTree(t, e, map[string]int{"a": 10, "d/b": 20, "d/e/c": 30, "big": 80})
	if err := os.Symlink("d/b", filepath.Join(e.dir, "blink")); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(e.dir, "a"), 0o600)
	resp, err := e.w.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"a", "d/b", "/workspace/d/e/c", "blink"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		path string
		n    int
		mode uint32
	}{{"a", 10, 0o600}, {"d/b", 20, 0o644}, {"d/e/c", 30, 0o644}, {"blink", 20, 0o644}}
	if len(resp.Files) != len(want) {
		t.Fatalf("got %d files", len(resp.Files))
	}
	for i, w := range want {
		f := resp.Files[i]
		if f.Path != w.path || len(f.Data) != w.n || f.Mode != w.mode || !bytes.Equal(f.Data, bytes.Repeat([]byte{'x'}, w.n)) {
			t.Errorf("file %d = %s %d %o, want %v", i, f.Path, len(f.Data), f.Mode, w)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(e.dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		paths []string
		want  error
	}{
		{"over the batch limit", []string{"big", "d/e/c"}, ErrLimit},
		{"missing", []string{"a", "nope"}, fs.ErrNotExist},
		{"directory", []string{"d"}, syscall.EISDIR},
		{"root", []string{"."}, syscall.EISDIR},
		{"fifo does not hang", []string{"fifo"}, ErrInvalidArgument},
		{"bad path", []string{"a", ""}, ErrInvalidPath},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.w.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: tt.paths}); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	// A file that grew past the batch since it was planned is still refused.
	planTree(t, e, map[string]int{"a": 95})
	if _, err := e.w.ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"d/b", "a"}}); !errors.Is(err, ErrLimit) {
		t.Fatalf("grown file: %v", err)
	}
}

func TestReadStream(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	data := make([]byte, 3*streamChunkBytes+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(e.dir, "empty"), "")
	tests := []struct {
		path       string
		offset     uint64
		wantChunks int
		want       []byte
	}{
		{"big", 0, 4, data},
		{"big", streamChunkBytes + 5, 3, data[streamChunkBytes+5:]},
		{"big", uint64(len(data)), 1, nil},
		{"big", 1 << 62, 1, nil},
		{"empty", 0, 1, nil},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s@%d", tt.path, tt.offset), func(t *testing.T) {
			var got []byte
			var chunks []*sandboxv1.ReadFileChunk
			err := e.w.ReadStream(ctx, &sandboxv1.ReadFileStreamRequest{Path: tt.path, Offset: tt.offset}, func(c *sandboxv1.ReadFileChunk) error {
				chunks = append(chunks, c)
				got = append(got, c.Data...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(chunks) != tt.wantChunks || !bytes.Equal(got, tt.want) {
				t.Fatalf("%d chunks, %d bytes; want %d, %d", len(chunks), len(got), tt.wantChunks, len(tt.want))
			}
			fi, _ := os.Stat(filepath.Join(e.dir, tt.path))
			if chunks[0].Size != uint64(fi.Size()) {
				t.Errorf("first chunk size %d", chunks[0].Size)
			}
			for _, c := range chunks[1:] {
				if c.Size != 0 || len(c.Data) > streamChunkBytes {
					t.Errorf("chunk size %d, data %d", c.Size, len(c.Data))
				}
			}
		})
	}
	boom := errors.New("boom")
	if err := e.w.ReadStream(ctx, &sandboxv1.ReadFileStreamRequest{Path: "big"}, func(*sandboxv1.ReadFileChunk) error { return boom }); err != boom {
		t.Errorf("send error: %v", err)
	}
	for p, want := range map[string]error{"nope": fs.ErrNotExist, ".": syscall.EISDIR, "/workspace": syscall.EISDIR} {
		if err := e.w.ReadStream(ctx, &sandboxv1.ReadFileStreamRequest{Path: p}, func(*sandboxv1.ReadFileChunk) error { return nil }); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", p, err, want)
		}
	}
	small := newEnv(t, func(o *Options) { o.MaxFileBytes = 10 })
	mustWrite(t, filepath.Join(small.dir, "f"), "more than ten bytes")
	if err := small.w.ReadStream(ctx, &sandboxv1.ReadFileStreamRequest{Path: "f"}, func(*sandboxv1.ReadFileChunk) error { return nil }); !errors.Is(err, ErrLimit) {
		t.Errorf("over MaxFileBytes: %v", err)
	}
}

func TestReadPlanLimit(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxFindResults = 2 })
	planTree(t, e, map[string]int{"a": 1, "b": 1, "c": 1})
	if _, err := e.w.ReadPlan(context.Background(), &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"**"}}); !errors.Is(err, ErrLimit) {
		t.Fatalf("err = %v, want ErrLimit", err)
	}
	if _, err := e.w.ReadPlan(context.Background(), &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"a", "b", "a"}}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
}
