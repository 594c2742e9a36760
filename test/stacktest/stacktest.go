// Package stacktest gives the deploy tests stack files with a release in them. The
// repository's stack files pin no images until `fusebox release` writes them; these tests are
// about the program, not a registry, so they write a release of their own with
// infra.ReleaseStackFile (what the release command writes) into copies, and on aks add the
// gVisor checksums that an operator adds by hand. The images are never pulled.
package stacktest

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/infra"
)

// Registry is the test release's registry (loopback; never contacted).
const Registry = "127.0.0.1:5000/fusebox"

// Release is a release whose digests are the SHA-256 of the image names.
func Release() infra.ReleaseImages {
	imgs := infra.ReleaseImages{}
	for _, n := range []string{infra.ReleaseManager, infra.ReleaseSandbox, infra.ReleaseGVisorInstaller} {
		imgs[n] = fmt.Sprintf("%s/%s@sha256:%x", Registry, n, sha256.Sum256([]byte(n)))
	}
	return imgs
}

// Released returns the stack file b with the test release written into it.
func Released(t testing.TB, b []byte, name string) []byte {
	t.Helper()
	out, _, err := infra.ReleaseStackFile(b, name, Registry, Release())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Repo lays out in a temporary directory what `fusebox preview|up` reads from the repository
// root: infra/Pulumi.yaml as it is, and every stacks/Pulumi.*.yaml with the test release. It
// returns the directory.
func Repo(t testing.TB, root string) string {
	t.Helper()
	repo := t.TempDir()
	for _, d := range []string{"infra", "stacks"} {
		if err := os.MkdirAll(filepath.Join(repo, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	project, err := os.ReadFile(filepath.Join(root, "infra", "Pulumi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "infra", "Pulumi.yaml"), project, 0o644); err != nil {
		t.Fatal(err)
	}
	stacks, err := filepath.Glob(filepath.Join(root, "stacks", "Pulumi.*.yaml"))
	if err != nil || len(stacks) == 0 {
		t.Fatalf("no stack files in %s: %v", root, err)
	}
	for _, p := range stacks {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, "stacks", filepath.Base(p)), Released(t, b, p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}
