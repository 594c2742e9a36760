package workspace

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// FuzzResolve checks that Resolve never yields an absolute or climbing path and never panics,
// and that writing an accepted path through the workspace never creates anything outside it,
// including through the evil symlinks the workspace holds.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		"", ".", "..", "/", "//", "a", "a/b", "./a", "a/..", "a/../..", "../a", "a/../../b",
		"/workspace", "/workspace/", "/workspace/..", "/workspace/../outside/x", "/workspacex",
		"/etc/passwd", "/proc/self/root/etc/passwd", "proc/self/root", "a\x00b", "\x00",
		"evil/x", "evilrel/x", "chain1/x", "sub/mid/x", "sub/upout/x", "fileout", "procroot/x",
		"etc/x", "dirlink/../../x", "dirlink/x", "....//x", ".../...", "a\\..\\..\\b",
		strings.Repeat("x", 256), strings.Repeat("../", 100), strings.Repeat("a/", 3000),
		"\xff\xfe", "a/./b/./../c/",
	} {
		f.Add(s)
	}
	e := newEnv(f)
	e.addEvilLinks(f)
	before := snapshot(f, e.outside)
	beforeBase, _ := os.ReadDir(filepath.Dir(e.dir))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := e.w.Resolve(p)
		if err != nil {
			if !isRefused(err) {
				t.Fatalf("Resolve(%q): unexpected error class %v", p, err)
			}
			return
		}
		if path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") || rel != path.Clean(rel) || rel == "" {
			t.Fatalf("Resolve(%q) = %q", p, rel)
		}
		// Cheap I/O: one small file write and one mkdir through the workspace.
		e.w.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{Files: []*sandboxv1.FileWrite{{Path: p, Data: []byte("fuzz")}}})
		e.w.Mkdir(ctx, &sandboxv1.MkdirRequest{Path: p + "/d", Parents: true})
		assertSameTree(t, "outside", before, snapshot(t, e.outside))
		if after, _ := os.ReadDir(filepath.Dir(e.dir)); len(after) != len(beforeBase) {
			t.Fatalf("created beside the workspace: %v", after)
		}
	})
}
