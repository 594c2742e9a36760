// Package deploy_test previews every stack with the pinned Pulumi CLI and Kubernetes provider
// through the Automation API, as `fusebox preview --stack S` does.
package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/infra/deploy"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func tools(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("FUSEBOX_PULUMI_TOOLS")
	if dir == "" {
		dir = "/var/cache/fusebox/pulumi-v3.274.1-k8s-4.25.0"
	}
	if _, err := os.Stat(filepath.Join(dir, "home", "plugins", "resource-kubernetes-v4.25.0")); err != nil {
		if os.Getenv("FUSEBOX_SKIP_PULUMI") == "1" {
			t.Skip("Pulumi tools missing (FUSEBOX_SKIP_PULUMI=1)")
		}
		t.Fatalf("Pulumi tools missing in %s: run make tools", dir)
	}
	return dir
}

// TestPreviewEveryStack previews each stack file without a cluster: the program, the config
// loading and every component must hold together for each cloud.
func TestPreviewEveryStack(t *testing.T) {
	tl := tools(t)
	stacks, _ := filepath.Glob(filepath.Join(repoRoot(), "stacks", "Pulumi.*.yaml"))
	if len(stacks) < 5 {
		t.Fatalf("found %d stacks, want at least eks-dev, eks-prod, gke-dev, aks-dev, local", len(stacks))
	}
	for _, f := range stacks {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "Pulumi."), ".yaml")
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			res, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: name, RepoDir: repoRoot(), Tools: tl,
				Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": "/nonexistent"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Changes["create"] < 10 {
				t.Fatalf("preview of %s creates %d resources: %v", name, res.Changes["create"], res.Changes)
			}
		})
	}
}

// TestPreviewRefusesATaggedImage: a stack whose image is not pinned by digest fails with a
// message naming the key.
func TestPreviewRefusesATaggedImage(t *testing.T) {
	tl := tools(t)
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, "stacks"), 0o755)
	os.MkdirAll(filepath.Join(repo, "infra"), 0o755)
	b, _ := os.ReadFile(filepath.Join(repoRoot(), "infra", "Pulumi.yaml"))
	os.WriteFile(filepath.Join(repo, "infra", "Pulumi.yaml"), b, 0o644)
	local, _ := os.ReadFile(filepath.Join(repoRoot(), "stacks", "Pulumi.local.yaml"))
	bad := strings.Replace(string(local), "registry.example.com/fusebox/manager@sha256:", "registry.example.com/fusebox/manager:latest#", 1)
	os.WriteFile(filepath.Join(repo, "stacks", "Pulumi.tagged.yaml"), []byte(bad), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: "tagged", RepoDir: repo, Tools: tl,
		Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": "/nonexistent"}})
	if err == nil || !strings.Contains(err.Error(), "images.manager") {
		t.Fatalf("preview with a tagged image = %v, want an error naming images.manager", err)
	}
}

// TestPreviewCreatesAFileBackendDir: --backend file://DIR with a DIR that does not exist yet
// works, as the default backend does (the Pulumi CLI itself refuses a missing directory).
func TestPreviewCreatesAFileBackendDir(t *testing.T) {
	tl := tools(t)
	dir := filepath.Join(t.TempDir(), "not", "yet")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: "local", RepoDir: repoRoot(), Tools: tl,
		Backend: "file://" + dir, Env: map[string]string{"KUBECONFIG": "/nonexistent"}}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("state directory: %v", err)
	}
}

func TestUnknownStack(t *testing.T) {
	_, err := deploy.Run(context.Background(), deploy.Preview, deploy.Options{Stack: "nope", RepoDir: repoRoot(), Tools: "/nonexistent"})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown stack: %v", err)
	}
}
