package mocktest

import (
	"os"
	"path/filepath"
	"testing"
)

// ScratchRepo lays out, in a temporary directory, what `fusebox up|preview --stack S` reads
// from a repository: root's infra/Pulumi.yaml as it is, and stacks/Pulumi.<stack>.yaml made by
// edit from root's stacks/Pulumi.local.yaml. It returns the directory.
func ScratchRepo(t testing.TB, root, stack string, edit func(local string) string) string {
	t.Helper()
	repo := t.TempDir()
	project, err := os.ReadFile(filepath.Join(root, "infra", "Pulumi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	local, err := os.ReadFile(filepath.Join(root, "stacks", "Pulumi.local.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range map[string]map[string][]byte{
		"infra":  {"Pulumi.yaml": project},
		"stacks": {"Pulumi." + stack + ".yaml": []byte(edit(string(local)))},
	} {
		if err := os.MkdirAll(filepath.Join(repo, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(repo, dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return repo
}
