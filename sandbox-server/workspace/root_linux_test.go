//go:build linux

package workspace

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

func TestCheckJail(t *testing.T) {
	dir := t.TempDir()
	if err := CheckJail(dir); err != nil {
		t.Fatalf("CheckJail: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("CheckJail left %v", left)
	}
	if err := CheckJail(filepath.Join(dir, "missing")); err == nil {
		t.Error("CheckJail of a missing directory succeeded")
	}
}

// TestMkdirAllThroughLinks creates directories through symlinks, which are followed only while
// they stay inside the workspace, by every call that creates missing parents.
func TestMkdirAllThroughLinks(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) *env {
		e := newEnv(t)
		e.addEvilLinks(t) // dirlink -> sub
		planTree(t, e, map[string]int{"a.txt": 3, "b/d/f/g.txt": 6})
		for name, target := range map[string]string{
			"b/up":     "../b/d",         // climbs out of b and back in
			"b/d/deep": "../../sub",      // two levels up, still inside
			"b/out":    "../../outside",  // two levels up: outside
			"b/abs":    e.dir + "/b/d/f", // absolute, even when it names a place inside
		} {
			if err := os.Symlink(target, filepath.Join(e.dir, filepath.FromSlash(name))); err != nil {
				t.Fatal(err)
			}
		}
		return e
	}
	calls := map[string]func(w *Workspace, p string) error{
		"Mkdir parents": func(w *Workspace, p string) error {
			return w.Mkdir(ctx, &sandboxv1.MkdirRequest{Path: p, Parents: true})
		},
		"WriteFiles mkdir": func(w *Workspace, p string) error {
			_, err := w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Mkdirs: []string{p}})
			return err
		},
		"WriteFiles parent": func(w *Workspace, p string) error {
			_, err := w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: p + "/x.txt", Data: []byte("x")}}})
			return err
		},
		"WriteStream parent": func(w *Workspace, p string) error {
			_, err := w.WriteStream(ctx, &sandboxv1.WriteFileHeader{Path: p + "/x.txt"}, chunks("x"))
			return err
		},
		"WriteFiles symlink parent": func(w *Workspace, p string) error {
			_, err := w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Symlinks: []*sandboxv1.SymlinkSpec{{Path: p + "/l", Target: "."}}})
			return err
		},
	}
	tests := []struct {
		path    string
		created string // host path below the workspace that must be a directory afterwards
		want    error
	}{
		{path: "dirlink/n1/n2", created: "sub/n1/n2"},
		{path: "b/up/n3", created: "b/d/n3"},
		{path: "b/d/deep/n4/n5", created: "sub/n4/n5"},
		{path: "b/up", created: "b/d"},
		{path: "b/out/n6", want: ErrEscape},
		{path: "b/out", want: ErrEscape},
		{path: "b/abs/n7", want: ErrEscape},
		{path: "evil/n8/n9", want: ErrEscape},
		{path: "chain1/n10", want: ErrEscape},
		{path: "sub/mid/n11", want: ErrEscape},
		{path: "procroot/tmp/n12", want: ErrEscape},
		{path: "dangling/n13", want: fs.ErrNotExist},
		{path: "a.txt/n14", want: syscall.ENOTDIR},
	}
	for callName, call := range calls {
		t.Run(callName, func(t *testing.T) {
			e := setup(t)
			before := snapshot(t, e.outside)
			for _, tt := range tests {
				err := call(e.w, tt.path)
				if tt.want != nil {
					if !errors.Is(err, tt.want) {
						t.Errorf("%s: err = %v, want %v", tt.path, err, tt.want)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", tt.path, err)
					continue
				}
				if fi, err := os.Lstat(filepath.Join(e.dir, tt.created)); err != nil || !fi.IsDir() {
					t.Errorf("%s: %s is not a directory: %v", tt.path, tt.created, err)
				}
			}
			assertSameTree(t, "outside", before, snapshot(t, e.outside))
			if _, err := os.Lstat("/tmp/n12"); err == nil {
				t.Error("/tmp/n12 was created")
			}
		})
	}
}

// TestWalkSkipsSwappedSymlink swaps a directory for a symlink, to the outside or to another
// directory inside, after the walk has listed it as a directory and before it descends: the
// walk must skip it rather than follow the link.
func TestWalkSkipsSwappedSymlink(t *testing.T) {
	for _, target := range []string{"outside", "inside"} {
		t.Run(target, func(t *testing.T) {
			e := newEnv(t)
			mustMkdir(t, filepath.Join(e.dir, "a", "sw"))
			mustWrite(t, filepath.Join(e.dir, "a", "sw", "mine"), "mine")
			mustMkdir(t, filepath.Join(e.dir, "other"))
			mustWrite(t, filepath.Join(e.dir, "other", "theirs"), "theirs")
			link := e.outside
			if target == "inside" {
				link = "../other"
			}
			var got []string
			err := e.w.walk(context.Background(), ".", 0, func(we *walkEntry) (bool, error) {
				got = append(got, we.rel)
				if we.rel == "a/sw" {
					sw := filepath.Join(e.dir, "a", "sw")
					if err := os.Rename(sw, filepath.Join(e.dir, "moved")); err != nil {
						t.Fatal(err)
					}
					if err := os.Symlink(link, sw); err != nil {
						t.Fatal(err)
					}
				}
				return true, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := "a a/sw other other/theirs" // the root was listed before the swap
			if strings.Join(got, " ") != want {
				t.Errorf("walked %q, want %q", got, want)
			}
		})
	}
}

// TestWalksDuringSwaps flips a directory between a real directory and a symlink to the outside
// while List, Find, Grep and ReadPlan walk the workspace: none may return anything from outside.
func TestWalksDuringSwaps(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sw := filepath.Join(e.dir, "sw")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			os.RemoveAll(sw)
			if i%2 == 0 {
				os.Symlink(e.outside, sw)
			} else if os.Mkdir(sw, 0o755) == nil {
				os.WriteFile(filepath.Join(sw, "mine"), []byte("inside\n"), 0o644)
			}
		}
	})
	leaked := func(p string) bool { return strings.HasPrefix(p, "sw/") && p != "sw/mine" }
	for range 300 {
		if resp, err := e.w.List(ctx, &sandboxv1.ListRequest{Recursive: true}); err == nil {
			for _, en := range resp.Entries {
				if leaked(en.Path) {
					t.Fatalf("List returned %s", en.Path)
				}
			}
		}
		if resp, err := e.w.Find(ctx, &sandboxv1.FindRequest{}); err == nil {
			for _, en := range resp.Entries {
				if leaked(en.Path) {
					t.Fatalf("Find returned %s", en.Path)
				}
			}
		}
		if resp, err := e.w.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "secret"}); err == nil && len(resp.Matches) > 0 {
			t.Fatalf("Grep matched %v", resp.Matches)
		}
		if plan, err := e.w.ReadPlan(ctx, &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"**", "sw/*"}}); err == nil {
			for _, b := range plan.Batches {
				for _, f := range b.Files {
					if leaked(f.Path) {
						t.Fatalf("ReadPlan returned %s", f.Path)
					}
				}
			}
		}
	}
	close(stop)
	wg.Wait()
}

// TestRemoveAllNeverFollows removes trees holding symlinks to the outside, and a tree in which
// a directory keeps being swapped for such a symlink: the outside must stay untouched.
func TestRemoveAllNeverFollows(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	before := snapshot(t, e.outside)
	mustMkdir(t, filepath.Join(e.dir, "t", "a", "b"))
	mustWrite(t, filepath.Join(e.dir, "t", "a", "b", "f"), "x")
	for name, target := range map[string]string{"t/abs": e.outside, "t/a/rel": "../../../outside", "t/a/b/sub": e.outside + "/sub"} {
		if err := os.Symlink(target, filepath.Join(e.dir, filepath.FromSlash(name))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.w.Remove(ctx, &sandboxv1.RemoveRequest{Path: "t", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.dir, "t")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("t still there: %v", err)
	}
	assertSameTree(t, "outside", before, snapshot(t, e.outside))

	sw := filepath.Join(e.dir, "r", "sw")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			os.MkdirAll(filepath.Dir(sw), 0o755)
			tmp := sw + ".tmp"
			os.RemoveAll(tmp)
			if i%2 == 0 {
				os.Symlink(e.outside, tmp)
			} else {
				os.MkdirAll(filepath.Join(tmp, "sub"), 0o755)
			}
			if os.Rename(tmp, sw) != nil {
				os.RemoveAll(sw)
			}
		}
	})
	for range 300 {
		e.w.Remove(ctx, &sandboxv1.RemoveRequest{Path: "r", Recursive: true, MissingOk: true})
		e.w.Remove(ctx, &sandboxv1.RemoveRequest{Path: "r/sw/sub", Recursive: true, MissingOk: true})
	}
	close(stop)
	wg.Wait()
	assertSameTree(t, "outside", before, snapshot(t, e.outside))
}

func TestCloseRefusesLaterCalls(t *testing.T) {
	e := newEnv(t)
	if err := e.w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.w.Stat(context.Background(), &sandboxv1.StatRequest{Path: "x"}); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Stat after Close: %v", err)
	}
	if err := e.w.Close(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}
