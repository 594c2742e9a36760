package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// opsTree builds:
//
//	a.txt  b/  b/c.go  b/d/  b/d/e.go  b/d/f/  b/d/f/g.txt  link -> b/c.go  dirlink -> b
func opsTree(t *testing.T) *env {
	e := newEnv(t)
	planTree(t, e, map[string]int{"a.txt": 3, "b/c.go": 4, "b/d/e.go": 5, "b/d/f/g.txt": 6})
	for name, target := range map[string]string{"link": "b/c.go", "dirlink": "b"} {
		if err := os.Symlink(target, filepath.Join(e.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func paths(infos []*sandboxv1.FileInfo) []string {
	var ps []string
	for _, i := range infos {
		ps = append(ps, i.Path)
	}
	return ps
}

func TestStat(t *testing.T) {
	e := opsTree(t)
	ctx := context.Background()
	tests := []struct {
		path   string
		follow bool
		want   *sandboxv1.FileInfo
	}{
		{"a.txt", false, &sandboxv1.FileInfo{Path: "a.txt", Type: sandboxv1.FileType_FILE_TYPE_FILE, Size: 3, Mode: 0o644}},
		{"/workspace/b", false, &sandboxv1.FileInfo{Path: "b", Type: sandboxv1.FileType_FILE_TYPE_DIR, Mode: 0o755}},
		{"link", false, &sandboxv1.FileInfo{Path: "link", Type: sandboxv1.FileType_FILE_TYPE_SYMLINK, Size: 6, Mode: 0o777, SymlinkTarget: "b/c.go"}},
		{"link", true, &sandboxv1.FileInfo{Path: "link", Type: sandboxv1.FileType_FILE_TYPE_FILE, Size: 4, Mode: 0o644}},
		{"dirlink/d/e.go", false, &sandboxv1.FileInfo{Path: "dirlink/d/e.go", Type: sandboxv1.FileType_FILE_TYPE_FILE, Size: 5, Mode: 0o644}},
		{".", false, &sandboxv1.FileInfo{Path: ".", Type: sandboxv1.FileType_FILE_TYPE_DIR, Mode: 0o755}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, err := e.w.Stat(ctx, &sandboxv1.StatRequest{Path: tt.path, FollowSymlinks: tt.follow})
			if err != nil {
				t.Fatal(err)
			}
			got := resp.Info
			if got.Modified == nil || got.Modified.AsTime().IsZero() {
				t.Error("no modification time")
			}
			if tt.want.Type == sandboxv1.FileType_FILE_TYPE_DIR {
				tt.want.Size = got.Size
			}
			if got.Path != tt.want.Path || got.Type != tt.want.Type || got.Size != tt.want.Size || got.Mode != tt.want.Mode || got.SymlinkTarget != tt.want.SymlinkTarget {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := e.w.Stat(ctx, &sandboxv1.StatRequest{Path: "nope"}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := e.w.Stat(ctx, &sandboxv1.StatRequest{Path: "a.txt/x"}); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("through a file: %v", err)
	}
}

func TestList(t *testing.T) {
	e := opsTree(t)
	ctx := context.Background()
	tests := []struct {
		name      string
		req       *sandboxv1.ListRequest
		want      []string
		truncated bool
	}{
		{"root", &sandboxv1.ListRequest{}, []string{"a.txt", "b", "dirlink", "link"}, false},
		{"dir", &sandboxv1.ListRequest{Path: "b"}, []string{"b/c.go", "b/d"}, false},
		{"through a dir link", &sandboxv1.ListRequest{Path: "dirlink/d"}, []string{"dirlink/d/e.go", "dirlink/d/f"}, false},
		{"recursive", &sandboxv1.ListRequest{Recursive: true}, []string{"a.txt", "b", "b/c.go", "b/d", "b/d/e.go", "b/d/f", "b/d/f/g.txt", "dirlink", "link"}, false},
		{"depth 2", &sandboxv1.ListRequest{Recursive: true, MaxDepth: 2}, []string{"a.txt", "b", "b/c.go", "b/d", "dirlink", "link"}, false},
		{"max entries", &sandboxv1.ListRequest{Recursive: true, MaxEntries: 3}, []string{"a.txt", "b", "b/c.go"}, true},
		{"max entries exact", &sandboxv1.ListRequest{MaxEntries: 4}, []string{"a.txt", "b", "dirlink", "link"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.w.List(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := paths(resp.Entries); !slices.Equal(got, tt.want) || resp.Truncated != tt.truncated {
				t.Fatalf("got %q truncated=%v, want %q %v", got, resp.Truncated, tt.want, tt.truncated)
			}
		})
	}
	resp, _ := e.w.List(ctx, &sandboxv1.ListRequest{})
	if l := resp.Entries[3]; l.Type != sandboxv1.FileType_FILE_TYPE_SYMLINK || l.SymlinkTarget != "b/c.go" {
		t.Errorf("link entry %v", l)
	}
	if _, err := e.w.List(ctx, &sandboxv1.ListRequest{Path: "a.txt"}); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("list a file: %v", err)
	}
	if _, err := e.w.List(ctx, &sandboxv1.ListRequest{Path: "nope"}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("list missing: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.w.List(cctx, &sandboxv1.ListRequest{Recursive: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestMkdir(t *testing.T) {
	e := opsTree(t)
	ctx := context.Background()
	tests := []struct {
		name string
		req  *sandboxv1.MkdirRequest
		want error
	}{
		{"new", &sandboxv1.MkdirRequest{Path: "n1"}, nil},
		{"mode", &sandboxv1.MkdirRequest{Path: "n2", Mode: 0o700}, nil},
		{"parents", &sandboxv1.MkdirRequest{Path: "p/q/r", Parents: true}, nil},
		{"parents existing", &sandboxv1.MkdirRequest{Path: "b/d", Parents: true}, nil},
		{"through a dir link", &sandboxv1.MkdirRequest{Path: "dirlink/new"}, nil},
		{"exists", &sandboxv1.MkdirRequest{Path: "b"}, fs.ErrExist},
		{"no parent", &sandboxv1.MkdirRequest{Path: "x/y"}, fs.ErrNotExist},
		{"under a file", &sandboxv1.MkdirRequest{Path: "a.txt/y", Parents: true}, syscall.ENOTDIR},
		{"bad mode", &sandboxv1.MkdirRequest{Path: "m", Mode: 0o20000}, ErrInvalidArgument},
		{"empty", &sandboxv1.MkdirRequest{}, ErrInvalidPath},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.w.Mkdir(ctx, tt.req)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if fi, err := os.Stat(filepath.Join(e.dir, tt.req.Path)); err != nil || !fi.IsDir() {
					t.Fatalf("not created: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if fi, _ := os.Stat(filepath.Join(e.dir, "n2")); fi.Mode().Perm() != 0o700 {
		t.Errorf("n2 mode %v", fi.Mode())
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		name    string
		req     *sandboxv1.RemoveRequest
		want    error
		removed string
	}{
		{"file", &sandboxv1.RemoveRequest{Path: "a.txt"}, nil, "a.txt"},
		{"link not target", &sandboxv1.RemoveRequest{Path: "link"}, nil, "link"},
		{"dir link recursive removes the link", &sandboxv1.RemoveRequest{Path: "dirlink", Recursive: true}, nil, "dirlink"},
		{"empty dir", &sandboxv1.RemoveRequest{Path: "b/d/f/g.txt"}, nil, "b/d/f/g.txt"},
		{"tree", &sandboxv1.RemoveRequest{Path: "b", Recursive: true}, nil, "b"},
		{"non-empty dir", &sandboxv1.RemoveRequest{Path: "b"}, syscall.ENOTEMPTY, ""},
		{"missing", &sandboxv1.RemoveRequest{Path: "nope"}, fs.ErrNotExist, ""},
		{"missing recursive", &sandboxv1.RemoveRequest{Path: "nope", Recursive: true}, fs.ErrNotExist, ""},
		{"missing ok", &sandboxv1.RemoveRequest{Path: "nope", MissingOk: true}, nil, ""},
		{"missing ok recursive", &sandboxv1.RemoveRequest{Path: "no/pe", Recursive: true, MissingOk: true}, nil, ""},
		{"root", &sandboxv1.RemoveRequest{Path: ".", Recursive: true}, ErrInvalidPath, ""},
		{"root via ..", &sandboxv1.RemoveRequest{Path: "b/..", Recursive: true}, ErrInvalidPath, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := opsTree(t)
			err := e.w.Remove(context.Background(), tt.req)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.removed != "" {
				if _, err := os.Lstat(filepath.Join(e.dir, tt.removed)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s still there", tt.removed)
				}
			}
			if _, err := os.Stat(filepath.Join(e.dir, "b/c.go")); err != nil && tt.removed != "b" {
				t.Errorf("link target removed: %v", err)
			}
		})
	}
}

func TestRename(t *testing.T) {
	tests := []struct {
		name     string
		req      *sandboxv1.RenameRequest
		want     error
		newPath  string
		wantData string
	}{
		{"file", &sandboxv1.RenameRequest{From: "a.txt", To: "z.txt"}, nil, "z.txt", "xxx"},
		{"into a dir", &sandboxv1.RenameRequest{From: "a.txt", To: "b/d/a.txt"}, nil, "b/d/a.txt", "xxx"},
		{"dir", &sandboxv1.RenameRequest{From: "b/d", To: "d2"}, nil, "d2/e.go", "xxxxx"},
		{"exists", &sandboxv1.RenameRequest{From: "a.txt", To: "b/c.go"}, fs.ErrExist, "b/c.go", "xxxx"},
		{"exists as a dangling link", &sandboxv1.RenameRequest{From: "a.txt", To: "dangling"}, fs.ErrExist, "", ""},
		{"overwrite", &sandboxv1.RenameRequest{From: "a.txt", To: "b/c.go", Overwrite: true}, nil, "b/c.go", "xxx"},
		{"overwrite a link replaces the link", &sandboxv1.RenameRequest{From: "a.txt", To: "link", Overwrite: true}, nil, "b/c.go", "xxxx"},
		{"missing", &sandboxv1.RenameRequest{From: "nope", To: "x"}, fs.ErrNotExist, "", ""},
		{"missing parent", &sandboxv1.RenameRequest{From: "a.txt", To: "no/x"}, fs.ErrNotExist, "", ""},
		{"file over empty dir", &sandboxv1.RenameRequest{From: "a.txt", To: "emptydir", Overwrite: true}, syscall.EISDIR, "", ""},
		{"dir over non-empty dir", &sandboxv1.RenameRequest{From: "emptydir", To: "b/d", Overwrite: true}, syscall.ENOTEMPTY, "", ""},
		{"dir over empty dir", &sandboxv1.RenameRequest{From: "b/d", To: "emptydir", Overwrite: true}, nil, "emptydir/e.go", "xxxxx"},
		{"dir over empty dir without overwrite", &sandboxv1.RenameRequest{From: "b/d", To: "emptydir"}, fs.ErrExist, "", ""},
		{"file over non-empty dir", &sandboxv1.RenameRequest{From: "a.txt", To: "b/d", Overwrite: true}, syscall.EISDIR, "", ""},
		{"dir over file", &sandboxv1.RenameRequest{From: "b/d/f", To: "a.txt", Overwrite: true}, syscall.ENOTDIR, "", ""},
		{"from root", &sandboxv1.RenameRequest{From: ".", To: "x"}, ErrInvalidPath, "", ""},
		{"to root", &sandboxv1.RenameRequest{From: "a.txt", To: "/workspace/"}, ErrInvalidPath, "", ""},
		{"empty", &sandboxv1.RenameRequest{From: "a.txt"}, ErrInvalidPath, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := opsTree(t)
			os.Symlink("nowhere", filepath.Join(e.dir, "dangling"))
			mustMkdir(t, filepath.Join(e.dir, "emptydir"))
			err := e.w.Rename(context.Background(), tt.req)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.newPath != "" {
				if got := readHost(t, filepath.Join(e.dir, tt.newPath)); got != tt.wantData {
					t.Errorf("%s = %q, want %q", tt.newPath, got, tt.wantData)
				}
			}
		})
	}
}

func TestSymlink(t *testing.T) {
	e := opsTree(t)
	ctx := context.Background()
	tests := []struct {
		name, target, path string
		want               error
	}{
		{"file", "a.txt", "l1", nil},
		{"up from a subdir", "../../a.txt", "b/d/l2", nil},
		{"to the root", "..", "b/l3", nil},
		{"dangling", "later", "l4", nil},
		{"exists", "a.txt", "b", fs.ErrExist},
		{"no parent", "a.txt", "no/l", fs.ErrNotExist},
		{"absolute", "/workspace/a.txt", "l5", ErrEscape},
		{"escaping", "../a.txt", "l6", ErrEscape},
		{"escaping from a subdir", "../../../x", "b/d/l7", ErrEscape},
		{"empty target", "", "l8", ErrInvalidPath},
		{"root path", "a.txt", ".", ErrInvalidPath},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.w.Symlink(ctx, &sandboxv1.SymlinkRequest{Target: tt.target, Path: tt.path})
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.want == nil {
				if got, err := os.Readlink(filepath.Join(e.dir, tt.path)); err != nil || got != tt.target {
					t.Fatalf("link = %q, %v", got, err)
				}
			}
		})
	}
	if got := readHost(t, filepath.Join(e.dir, "b/d/l2")); got != "xxx" {
		t.Errorf("b/d/l2 -> %q", got)
	}
}

func TestFind(t *testing.T) {
	e := opsTree(t)
	ctx := context.Background()
	tests := []struct {
		name      string
		req       *sandboxv1.FindRequest
		want      []string
		truncated bool
	}{
		{"everything", &sandboxv1.FindRequest{}, []string{"a.txt", "b", "b/c.go", "b/d", "b/d/e.go", "b/d/f", "b/d/f/g.txt", "dirlink", "link"}, false},
		{"name glob", &sandboxv1.FindRequest{Name: "*.go"}, []string{"b/c.go", "b/d/e.go"}, false},
		{"class glob", &sandboxv1.FindRequest{Name: "[ag].txt"}, []string{"a.txt", "b/d/f/g.txt"}, false},
		{"files", &sandboxv1.FindRequest{Type: sandboxv1.FileType_FILE_TYPE_FILE}, []string{"a.txt", "b/c.go", "b/d/e.go", "b/d/f/g.txt"}, false},
		{"dirs", &sandboxv1.FindRequest{Type: sandboxv1.FileType_FILE_TYPE_DIR}, []string{"b", "b/d", "b/d/f"}, false},
		{"symlinks", &sandboxv1.FindRequest{Type: sandboxv1.FileType_FILE_TYPE_SYMLINK}, []string{"dirlink", "link"}, false},
		{"depth 1", &sandboxv1.FindRequest{MaxDepth: 1}, []string{"a.txt", "b", "dirlink", "link"}, false},
		{"depth 2 under b", &sandboxv1.FindRequest{Path: "b", MaxDepth: 2}, []string{"b/c.go", "b/d", "b/d/e.go", "b/d/f"}, false},
		{"through a dir link", &sandboxv1.FindRequest{Path: "dirlink", Name: "*.go"}, []string{"dirlink/c.go", "dirlink/d/e.go"}, false},
		{"max results", &sandboxv1.FindRequest{Name: "*.*", MaxResults: 2}, []string{"a.txt", "b/c.go"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.w.Find(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := paths(resp.Entries); !slices.Equal(got, tt.want) || resp.Truncated != tt.truncated {
				t.Fatalf("got %q truncated=%v, want %q %v", got, resp.Truncated, tt.want, tt.truncated)
			}
		})
	}
	if _, err := e.w.Find(ctx, &sandboxv1.FindRequest{Name: "["}); !errors.Is(err, ErrInvalidPath) {
		t.Errorf("bad glob: %v", err)
	}
	if _, err := e.w.Find(ctx, &sandboxv1.FindRequest{Path: "a.txt"}); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("find in a file: %v", err)
	}
}
