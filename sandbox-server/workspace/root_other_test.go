//go:build !linux

package workspace

import (
	"errors"
	"os"
	"testing"
)

// TestOSRootEscapeError guards the detection of os.Root's unexported escape error by its text.
func TestOSRootEscapeError(t *testing.T) {
	e := newEnv(t)
	r, err := os.OpenRoot(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.Symlink("/etc", e.dir+"/abs"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"..", "../../x", "abs/passwd", "abs/../../x"} {
		_, err := r.Lstat(p)
		if !isRootEscape(err) {
			t.Errorf("os.Root Lstat(%q) = %v: not recognised as an escape", p, err)
		}
		if !errors.Is(wrap("stat", p, err), ErrEscape) {
			t.Errorf("wrap(%v) does not match ErrEscape", err)
		}
	}
	if isRootEscape(os.ErrNotExist) || isRootEscape(nil) {
		t.Error("false positive")
	}
}
