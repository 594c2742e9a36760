package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

func TestWriteFiles(t *testing.T) {
	checkNoLeak(t)
	e := newEnv(t)
	ctx := context.Background()
	req := &sandboxv1.WriteFilesRequest{
		Mkdirs: []string{"d1/d2", "/workspace/d3", "empty"},
		Files: []*sandboxv1.FileWrite{
			{Path: "top.txt", Data: []byte("top")},
			{Path: "d1/d2/f", Data: []byte("f"), Mode: 0o600},
			{Path: "new/parent/exec.sh", Data: []byte("#!/bin/sh\n"), Mode: 0o755},
			{Path: "/workspace/d3/abs", Data: []byte("abs")},
			{Path: "world", Data: []byte("w"), Mode: 0o666}, // needs a chmod under umask 022
			{Path: "zero", Data: nil},
			{Path: "dup", Data: []byte("first")},
			{Path: "dup", Data: []byte("second")},
		},
		Symlinks: []*sandboxv1.SymlinkSpec{
			{Target: "top.txt", Path: "link"},
			{Target: "../top.txt", Path: "d1/up"},
			{Target: "d2", Path: "d1/d2link"},
			{Target: "later", Path: "newdir/dangling"},
		},
	}
	resp, err := e.w.WriteFiles(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.FilesWritten != 7 || resp.DirsCreated != 3 || resp.SymlinksCreated != 4 || resp.BytesWritten != 3+1+10+3+1+0+5+6 {
		t.Errorf("response = %v", resp)
	}
	files := map[string]struct {
		data string
		mode fs.FileMode
	}{
		"top.txt":            {"top", 0o644},
		"d1/d2/f":            {"f", 0o600},
		"new/parent/exec.sh": {"#!/bin/sh\n", 0o755},
		"d3/abs":             {"abs", 0o644},
		"world":              {"w", 0o666},
		"zero":               {"", 0o644},
		"dup":                {"second", 0o644},
		"link":               {"top", 0o644},
		"d1/up":              {"top", 0o644},
		"d1/d2link/f":        {"f", 0o600},
	}
	for p, want := range files {
		fi, err := os.Stat(filepath.Join(e.dir, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if got := readHost(t, filepath.Join(e.dir, p)); got != want.data || fi.Mode().Perm() != want.mode {
			t.Errorf("%s = %q %v, want %q %v", p, got, fi.Mode().Perm(), want.data, want.mode)
		}
	}
	for _, d := range []string{"empty", "d1/d2", "new/parent", "newdir"} {
		if fi, err := os.Stat(filepath.Join(e.dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("dir %s: %v", d, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(e.dir, "newdir/dangling")); err != nil || target != "later" {
		t.Errorf("dangling link: %q %v", target, err)
	}
	if tmp := tempFiles(t, e.dir); len(tmp) > 0 {
		t.Errorf("temp files left: %v", tmp)
	}

	// Re-applying the batch replaces files and links.
	req.Files[0].Data = []byte("top2")
	if _, err := e.w.WriteFiles(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := readHost(t, filepath.Join(e.dir, "link")); got != "top2" {
		t.Errorf("after re-apply link -> %q", got)
	}
}

func TestWriteFilesRejectsWholeBatch(t *testing.T) {
	ctx := context.Background()
	good := func(n int) []*sandboxv1.FileWrite {
		var fs []*sandboxv1.FileWrite
		for i := range n {
			fs = append(fs, &sandboxv1.FileWrite{Path: fmt.Sprintf("g/f%d", i), Data: []byte("x")})
		}
		return fs
	}
	withBad := func(bad *sandboxv1.FileWrite) []*sandboxv1.FileWrite {
		f := good(5)
		return append(f[:2], append([]*sandboxv1.FileWrite{bad}, f[2:]...)...)
	}
	tests := []struct {
		name    string
		req     *sandboxv1.WriteFilesRequest
		wantErr error
	}{
		{"escape in the middle", &sandboxv1.WriteFilesRequest{Mkdirs: []string{"m"}, Files: withBad(&sandboxv1.FileWrite{Path: "../x"})}, ErrEscape},
		{"NUL in the middle", &sandboxv1.WriteFilesRequest{Mkdirs: []string{"m"}, Files: withBad(&sandboxv1.FileWrite{Path: "a\x00"})}, ErrInvalidPath},
		{"empty path", &sandboxv1.WriteFilesRequest{Files: withBad(&sandboxv1.FileWrite{Path: ""})}, ErrInvalidPath},
		{"bad mode", &sandboxv1.WriteFilesRequest{Files: withBad(&sandboxv1.FileWrite{Path: "m", Mode: 0o100644})}, ErrInvalidArgument},
		{"bad mkdir", &sandboxv1.WriteFilesRequest{Mkdirs: []string{"ok", "/etc"}, Files: good(3)}, ErrEscape},
		{"bad symlink last", &sandboxv1.WriteFilesRequest{Mkdirs: []string{"m"}, Files: good(3), Symlinks: []*sandboxv1.SymlinkSpec{{Target: "g", Path: "l"}, {Target: "/", Path: "l2"}}}, ErrEscape},
		{"empty symlink target", &sandboxv1.WriteFilesRequest{Files: good(3), Symlinks: []*sandboxv1.SymlinkSpec{{Target: "", Path: "l"}}}, ErrInvalidPath},
		{"over batch limit", &sandboxv1.WriteFilesRequest{Mkdirs: []string{"m"}, Files: append(good(3), &sandboxv1.FileWrite{Path: "big", Data: make([]byte, 1000)})}, ErrLimit},
		{"over file limit", &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: "big", Data: make([]byte, 600)}}}, ErrLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.MaxBatchBytes = 1000; o.MaxFileBytes = 500 })
			before := snapshot(t, e.dir)
			_, err := e.w.WriteFiles(ctx, tt.req)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			assertSameTree(t, "workspace", before, snapshot(t, e.dir))
		})
	}
}

func TestWriteFilesErrors(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mustWrite(t, filepath.Join(e.dir, "file"), "x")
	mustMkdir(t, filepath.Join(e.dir, "dir/sub"))
	tests := []struct {
		name  string
		files []*sandboxv1.FileWrite
		want  error
	}{
		{"parent is a file", []*sandboxv1.FileWrite{{Path: "file/x"}}, syscall.ENOTDIR},
		{"over a directory", []*sandboxv1.FileWrite{{Path: "dir"}}, syscall.EISDIR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: tt.files}); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tmp := tempFiles(t, e.dir); len(tmp) > 0 {
				t.Errorf("temp files left: %v", tmp)
			}
		})
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.w.WriteFiles(cctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: "c"}}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.dir, "c")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("cancelled batch wrote a file")
	}
}

// TestWriteFilesWorkers writes a batch large enough for the worker pool, with a failure in
// the middle, and checks that the pool stops and leaks nothing.
func TestWriteFilesWorkers(t *testing.T) {
	checkNoLeak(t)
	e := newEnv(t)
	e.w.writeWorkers, e.w.minFilesPerWorker = 4, 8
	ctx := context.Background()
	var files []*sandboxv1.FileWrite
	for i := range 500 {
		files = append(files, &sandboxv1.FileWrite{Path: fmt.Sprintf("d%d/f%d", i%7, i), Data: []byte(fmt.Sprint(i))})
	}
	if _, err := e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: files}); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if got := readHost(t, filepath.Join(e.dir, fmt.Sprintf("d%d/f%d", i%7, i))); got != fmt.Sprint(i) {
			t.Fatalf("f%d = %q", i, got)
		}
	}
	mustWrite(t, filepath.Join(e.dir, "blocker"), "x")
	files[250].Path = "blocker/x"
	if _, err := e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: files}); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("err = %v, want ENOTDIR", err)
	}
	if tmp := tempFiles(t, e.dir); len(tmp) > 0 {
		t.Errorf("temp files left: %v", tmp)
	}
}

func TestWriteStream(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxFileBytes = 100 })
	ctx := context.Background()
	n, err := e.w.WriteStream(ctx, &sandboxv1.WriteFileHeader{Path: "a/b/big", Mode: 0o640, Size: proto.Int64(9)}, chunks("abc", "", "def", "ghi"))
	if err != nil || n != 9 {
		t.Fatalf("WriteStream = %d, %v", n, err)
	}
	fi, err := os.Stat(filepath.Join(e.dir, "a/b/big"))
	if err != nil || fi.Mode().Perm() != 0o640 || readHost(t, filepath.Join(e.dir, "a/b/big")) != "abcdefghi" {
		t.Fatalf("file: %v %v", fi, err)
	}
	if n, err := e.w.WriteStream(ctx, &sandboxv1.WriteFileHeader{Path: "empty"}, chunks()); err != nil || n != 0 {
		t.Fatalf("empty stream = %d, %v", n, err)
	}
	for _, tt := range []struct {
		name string
		hdr  *sandboxv1.WriteFileHeader
		want error
	}{
		{"missing header", nil, ErrInvalidArgument},
		{"empty path", &sandboxv1.WriteFileHeader{}, ErrInvalidPath},
		{"negative size", &sandboxv1.WriteFileHeader{Path: "x", Size: proto.Int64(-1)}, ErrInvalidArgument},
		{"size over limit", &sandboxv1.WriteFileHeader{Path: "x", Size: proto.Int64(101)}, ErrLimit},
		{"bad mode", &sandboxv1.WriteFileHeader{Path: "x", Mode: 0o10000}, ErrInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.w.WriteStream(ctx, tt.hdr, chunks("x")); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestWriteStreamAtomic checks that a failed or cancelled stream leaves no file, no temp file,
// and an existing destination untouched.
func TestWriteStreamAtomic(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		size    int64
		next    func(cancel func()) func() ([]byte, error)
		wantErr error
	}{
		{"next fails after data", 0, func(func()) func() ([]byte, error) {
			i := 0
			return func() ([]byte, error) {
				if i++; i > 3 {
					return nil, boom
				}
				return []byte("partial data "), nil
			}
		}, boom},
		{"ctx cancelled mid-stream", 0, func(cancel func()) func() ([]byte, error) {
			i := 0
			return func() ([]byte, error) {
				if i++; i == 2 {
					cancel()
				}
				return []byte("partial "), nil
			}
		}, context.Canceled},
		{"ctx cancelled with the last chunk", 0, func(cancel func()) func() ([]byte, error) {
			return func() ([]byte, error) { cancel(); return []byte("all"), io.EOF }
		}, context.Canceled},
		{"over the file limit", 0, func(func()) func() ([]byte, error) {
			return func() ([]byte, error) { return make([]byte, 60), nil }
		}, ErrLimit},
		{"shorter than its size", 10, func(func()) func() ([]byte, error) { return chunks("short") }, ErrInvalidArgument},
		{"longer than its size", 3, func(func()) func() ([]byte, error) { return chunks("too long") }, ErrInvalidArgument},
	}
	for _, tt := range tests {
		for _, existing := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/existing=%v", tt.name, existing), func(t *testing.T) {
				e := newEnv(t, func(o *Options) { o.MaxFileBytes = 100 })
				dst := filepath.Join(e.dir, "dir", "dst")
				mustMkdir(t, filepath.Dir(dst))
				if existing {
					mustWrite(t, dst, "old content")
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				hdr := &sandboxv1.WriteFileHeader{Path: "dir/dst"}
				if tt.size != 0 {
					hdr.Size = proto.Int64(tt.size)
				}
				_, err := e.w.WriteStream(ctx, hdr, tt.next(cancel))
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if existing {
					if got := readHost(t, dst); got != "old content" {
						t.Errorf("destination = %q, want the old content", got)
					}
				} else if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("destination exists after a failed write: %v", err)
				}
				entries, _ := os.ReadDir(filepath.Dir(dst))
				if len(entries) != map[bool]int{false: 0, true: 1}[existing] {
					t.Errorf("directory holds %v", entries)
				}
			})
		}
	}
}

func TestModes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, m := range []uint32{0o400, 0o644, 0o666, 0o777, 0o700, 0o4755, 0o1777} {
		p := fmt.Sprintf("m%o", m)
		if _, err := e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: p, Data: []byte("x"), Mode: m}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := e.w.Stat(ctx, &sandboxv1.StatRequest{Path: p})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Info.Mode != m {
			t.Errorf("mode %o: got %o", m, resp.Info.Mode)
		}
	}
	// Without a known umask every write chmods.
	e.w.umaskKnown = false
	if _, err := e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: "u", Data: []byte("x"), Mode: 0o666}}}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(e.dir, "u")); fi.Mode().Perm() != 0o666 {
		t.Errorf("unknown umask: mode %v", fi.Mode())
	}
	if !bytes.Equal([]byte(readHost(t, filepath.Join(e.dir, "u"))), []byte("x")) {
		t.Error("content")
	}
}
