package workspace

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

const testMount = "/workspace"

// env is a workspace under test with a sibling "outside" directory that evil symlinks point at.
type env struct {
	w       *Workspace
	dir     string // the workspace root on the host
	outside string // a sibling directory that must never change
}

func newEnv(t testing.TB, opts ...func(*Options)) *env {
	t.Helper()
	return newEnvIn(t, t.TempDir(), opts...)
}

// newEnvIn is newEnv in an existing, empty directory base.
func newEnvIn(t testing.TB, base string, opts ...func(*Options)) *env {
	t.Helper()
	e := &env{dir: filepath.Join(base, "ws"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{e.dir, e.outside, filepath.Join(e.outside, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(e.outside, "secret"), "outside secret\n")
	mustWrite(t, filepath.Join(e.outside, "sub", "deep"), "deep secret\n")
	o := Options{Dir: e.dir, MountPath: testMount}
	for _, f := range opts {
		f(&o)
	}
	w, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	e.w = w
	return e
}

// addEvilLinks creates symlinks inside the workspace that lead outside in various ways.
func (e *env) addEvilLinks(t testing.TB) {
	t.Helper()
	mustMkdir(t, filepath.Join(e.dir, "sub"))
	mustWrite(t, filepath.Join(e.dir, "sub", "a"), "inside a\n")
	links := map[string]string{
		"evil":      e.outside,                          // absolute, to a directory outside
		"evilrel":   "../outside",                       // relative, climbing out
		"chain1":    "chain2",                           // a chain ending outside
		"chain2":    "evil",                             //
		"sub/mid":   "../../outside",                    // a link in the middle of a path
		"etc":       "/etc",                             // absolute system directory
		"procroot":  "/proc/self/root",                  // the /proc trick
		"fileout":   filepath.Join(e.outside, "secret"), // absolute, to a file outside
		"filerel":   "../outside/secret",                // relative, to a file outside
		"dirlink":   "sub",                              // benign: inside
		"dangling":  "nothing-here",                     // benign: dangling inside
		"sub/upout": "../../outside/sub",                //
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(e.dir, filepath.FromSlash(name))); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot describes every entry under dir: type, mode, size, content hash, link target, mtime.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	s := make(map[string]string)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v %d %d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(b))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		rel, _ := filepath.Rel(dir, p)
		s[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func assertSameTree(t testing.TB, what string, before, after map[string]string) {
	t.Helper()
	if maps.Equal(before, after) {
		return
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if before[k] != after[k] {
			t.Errorf("%s: %q changed: %q -> %q", what, k, before[k], after[k])
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("%s: %q disappeared", what, k)
		}
	}
}

// tempFiles lists leftover temp files anywhere under dir.
func tempFiles(t testing.TB, dir string) []string {
	t.Helper()
	var found []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), tempPrefix) {
			found = append(found, p)
		}
		return nil
	})
	return found
}

func mustWrite(t testing.TB, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustMkdir(t testing.TB, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func readHost(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// isRefused reports whether err is one of the errors an escape attempt must get.
func isRefused(err error) bool {
	return errors.Is(err, ErrEscape) || errors.Is(err, ErrInvalidPath)
}

// checkNoLeak fails if goroutines started during the test are still running.
func checkNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	})
}
