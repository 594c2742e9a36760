// Package deploy_test previews every stack with the pinned Pulumi CLI and Kubernetes provider
// through the Automation API, as `fusebox preview --stack S` does.
package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/infra/deploy"
	"github.com/fusebox-dev/fusebox/infra/preflight"
	"github.com/fusebox-dev/fusebox/test/stacktest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

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
	stacks, _ := filepath.Glob(filepath.Join(testenv.ModuleRoot(), "stacks", "Pulumi.*.yaml"))
	if len(stacks) < 5 {
		t.Fatalf("found %d stacks, want at least eks-dev, eks-prod, gke-dev, aks-dev, local", len(stacks))
	}
	repo := stacktest.Repo(t, testenv.ModuleRoot())
	for _, f := range stacks {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "Pulumi."), ".yaml")
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			res, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: name, RepoDir: repo, Tools: tl,
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

// TestPreviewRefusesAnUnreleasedStack: the repository's stack files pin no images until
// fusebox release writes them; preview says so and what to run.
func TestPreviewRefusesAnUnreleasedStack(t *testing.T) {
	tl := tools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: "eks-dev", RepoDir: testenv.ModuleRoot(), Tools: tl,
		Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": "/nonexistent"}})
	if err == nil || !strings.Contains(err.Error(), "fusebox release --registry HOST[:PORT]/PATH --stack eks-dev") {
		t.Fatalf("preview of an unreleased stack = %v, want an error saying to run fusebox release", err)
	}
}

// TestPreviewRunsPreflight: the program the Pulumi CLI runs checks the cluster itself
// (infra.NewProgram), so what preflight refuses fails a preview, and so the preview that
// starts every `pulumi up`, before anything changes: here the local stack on a cluster
// without a node labelled fusebox.dev/pool=sandbox. The cluster is client-go's fake API
// server, handed to the inline program as deploy hands it the real one.
func TestPreviewRunsPreflight(t *testing.T) {
	tl := tools(t)
	repo := stacktest.Repo(t, testenv.ModuleRoot())
	unlabelled := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	cl := preflight.FromClients(fake.NewClientset(unlabelled))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: "local", RepoDir: repo, Tools: tl,
		Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": "/nonexistent"}, Cluster: &cl})
	if err == nil || !strings.Contains(err.Error(), "preflight refused the stack") || !strings.Contains(err.Error(), "kubectl label node NODE fusebox.dev/pool=sandbox") {
		t.Fatalf("preview on a cluster preflight refuses = %v, want the refusal naming the node label", err)
	}
}

// TestPreviewRefusesATaggedImage: a stack whose image is not pinned by digest fails with a
// message naming the key.
func TestPreviewRefusesATaggedImage(t *testing.T) {
	tl := tools(t)
	repo := mocktest.ScratchRepo(t, stacktest.Repo(t, testenv.ModuleRoot()), "tagged", func(local string) string {
		tagged := strings.Replace(local, stacktest.Registry+"/manager@sha256:", stacktest.Registry+"/manager:latest#", 1)
		if tagged == local {
			t.Fatal("the released local stack has no manager image to tag")
		}
		return tagged
	})
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
	if _, err := deploy.Run(ctx, deploy.Preview, deploy.Options{Stack: "local", RepoDir: stacktest.Repo(t, testenv.ModuleRoot()), Tools: tl,
		Backend: "file://" + dir, Env: map[string]string{"KUBECONFIG": "/nonexistent"}}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("state directory: %v", err)
	}
}

// TestUpRendersManifests runs `up --render-dir` of every stack without a cluster: the
// Kubernetes provider writes each object as a YAML manifest instead of applying it. Every
// object the program registers (as the recording mocks see it) lands in the directory, each
// file parses as a Kubernetes object, and the state backend passed in is left untouched.
func TestUpRendersManifests(t *testing.T) {
	tl := tools(t)
	repo := stacktest.Repo(t, testenv.ModuleRoot())
	stacks, _ := filepath.Glob(filepath.Join(repo, "stacks", "Pulumi.*.yaml"))
	for _, f := range stacks {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "Pulumi."), ".yaml")
		t.Run(name, func(t *testing.T) {
			want := expectedObjects(t, f, name)
			dir, state := filepath.Join(t.TempDir(), "manifests"), t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := deploy.Run(ctx, deploy.Up, deploy.Options{Stack: name, RepoDir: repo, Tools: tl, RenderDir: dir,
				Backend: "file://" + state, Env: map[string]string{"KUBECONFIG": "/nonexistent"}}); err != nil {
				t.Fatal(err)
			}
			files, _ := filepath.Glob(filepath.Join(dir, "*", "*.yaml"))
			got := map[string]bool{}
			for _, p := range files {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				var obj struct {
					APIVersion string `json:"apiVersion"`
					Kind       string `json:"kind"`
					Metadata   struct {
						Name      string `json:"name"`
						Namespace string `json:"namespace"`
					} `json:"metadata"`
				}
				if err := yaml.Unmarshal(b, &obj); err != nil {
					t.Fatalf("%s is not YAML: %v", p, err)
				}
				if obj.APIVersion == "" || obj.Kind == "" || obj.Metadata.Name == "" {
					t.Errorf("%s: not a Kubernetes object: %s", p, b)
				}
				got[obj.APIVersion+" "+obj.Kind+" "+obj.Metadata.Name] = true
			}
			for k := range want {
				if !got[k] {
					t.Errorf("no manifest for %s", k)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%d manifests, want %d", len(got), len(want))
			}
			if entries, _ := os.ReadDir(state); len(entries) != 0 {
				t.Errorf("rendering wrote to the stack's state backend: %v", entries)
			}
		})
	}
	_, err := deploy.Run(context.Background(), deploy.Preview, deploy.Options{Stack: "local", RepoDir: testenv.ModuleRoot(), Tools: tl, RenderDir: t.TempDir()})
	if err == nil {
		t.Error("preview with a render directory was accepted: it would render nothing")
	}
}

// expectedObjects runs the program under recording mocks and returns "apiVersion kind name"
// of each Kubernetes object it registers.
func expectedObjects(t *testing.T, stackFile, stack string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(stackFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Config map[string]any `json:"config"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]string{}
	for k, v := range f.Config {
		switch v := v.(type) {
		case string:
			cfg[k] = v
		case bool, float64:
			cfg[k] = fmt.Sprint(v)
		default:
			j, _ := json.Marshal(v)
			cfg[k] = string(j)
		}
	}
	m, err := mocktest.Run(infra.Program, mocktest.WithConfig(cfg), func(info *pulumi.RunInfo) { info.Stack = stack })
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, r := range m.All() {
		parts := strings.Split(r.Type, ":")
		if !r.Custom || len(parts) != 3 || parts[0] != "kubernetes" || !strings.Contains(parts[1], "/") {
			continue
		}
		group, version, _ := strings.Cut(parts[1], "/")
		apiVersion := group + "/" + version
		if group == "core" {
			apiVersion = version
		}
		out[apiVersion+" "+parts[2]+" "+mocktest.Str(r.Props(), "metadata", "name")] = true
	}
	if len(out) < 10 {
		t.Fatalf("only %d Kubernetes objects recorded", len(out))
	}
	return out
}

func TestUnknownStack(t *testing.T) {
	_, err := deploy.Run(context.Background(), deploy.Preview, deploy.Options{Stack: "nope", RepoDir: testenv.ModuleRoot(), Tools: "/nonexistent"})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown stack: %v", err)
	}
}
