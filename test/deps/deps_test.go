// Package deps checks what the product binaries link, as make verify does: each one's
// committed dependency list (cmd/<binary>/deps.txt) is current, and none links test or
// benchmark code, nor (fusebox-manager, fusebox-sandbox) the Pulumi SDK. The lists and the
// rules are hack/deps-lists.sh's; this test runs it, so that go test ./... checks them too.
package deps

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/test/testenv"
)

func TestProductBinaryDeps(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("go not on PATH (the check runs go list -deps): %v", err)
	}
	root := testenv.ModuleRoot()
	cmd := exec.Command(filepath.Join(root, "hack", "deps-lists.sh"), "--check")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/deps-lists.sh --check: %v\n%s", err, out)
	}
}
