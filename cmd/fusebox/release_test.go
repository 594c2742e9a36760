package main

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/image/registry/registrytest"
)

// scratchRepo copies what release reads (go.mod, infra/Pulumi.yaml, the stack files) into a
// temporary repository root.
func scratchRepo(t *testing.T) string {
	t.Helper()
	repo := t.TempDir()
	for _, rel := range []string{"go.mod", "infra/Pulumi.yaml", "stacks/Pulumi.local.yaml", "stacks/Pulumi.aks-dev.yaml", "stacks/Pulumi.eks-dev.yaml", "stacks/Pulumi.eks-prod.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", rel))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(repo, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

// testLayouts writes small random images as the layouts of every image and returns the
// directory and each image's digest.
func testLayouts(t *testing.T) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	digests := map[string]string{}
	for _, n := range image.Names {
		img, err := random.Image(1024, 1)
		if err != nil {
			t.Fatal(err)
		}
		p, err := layout.Write(filepath.Join(dir, n), empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AppendImage(img); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		digests[n] = d.String()
	}
	return dir, digests
}

func run(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

func readStacks(t *testing.T, repo string) map[string]string {
	t.Helper()
	m := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(repo, "stacks", "*.yaml"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		m[filepath.Base(f)] = string(b)
	}
	return m
}

// TestRelease pushes layouts to a real registry (htpasswd, TLS) and checks that exactly the
// pushed digests land in the stack files, that comments stay, and that nothing is written
// when a push fails or the input is bad.
func TestRelease(t *testing.T) {
	reg := registrytest.Start(t)
	t.Setenv("DOCKER_CONFIG", reg.DockerConfig)
	layouts, digests := testLayouts(t)
	repo := scratchRepo(t)
	target := reg.Host + "/fusebox"

	out, err := run(t, releaseCmd(), "--repo", repo, "--registry", target, "--ca-file", reg.CAFile,
		"--stack", "local", "--stack", "aks-dev", "--layout", layouts)
	if err != nil {
		t.Fatalf("release: %v\n%s", err, out)
	}
	stacks := readStacks(t, repo)
	// Exactly the pushed digests, nothing else, under fusebox:images.
	for file, names := range map[string][]string{
		"Pulumi.local.yaml":   {"manager", "sandbox"},
		"Pulumi.aks-dev.yaml": {"manager", "sandbox"},
	} {
		want := map[string]string{}
		for _, n := range names {
			want[n] = target + "/" + n + "@" + digests[n]
		}
		if got := stackImages(t, stacks[file]); !maps.Equal(got, want) {
			t.Errorf("%s: fusebox:images %v, want exactly %v", file, got, want)
		}
	}
	for file, want := range map[string][]string{
		"Pulumi.local.yaml": {
			"fusebox:registry: " + target,
			"manager: " + target + "/manager@" + digests["manager"],
			"sandbox: " + target + "/sandbox@" + digests["sandbox"],
		},
		"Pulumi.aks-dev.yaml": {
			"manager: " + target + "/manager@" + digests["manager"],
			"installerImage: " + target + "/gvisor-installer@" + digests["gvisor-installer"],
			"# AKSNodeClass has no userData", // comments stay
		},
	} {
		for _, w := range want {
			if !strings.Contains(stacks[file], w) {
				t.Errorf("%s lacks %q:\n%s", file, w, stacks[file])
			}
		}
		if !strings.HasPrefix(stacks[file], "# fusebox on") {
			t.Errorf("%s lost its header comment", file)
		}
	}
	if strings.Contains(stacks["Pulumi.local.yaml"], "gvisor-installer") {
		t.Error("the local stack got the AKS installer image")
	}
	if strings.Contains(stacks["Pulumi.eks-dev.yaml"], target) {
		t.Error("a stack that was not released was written")
	}
	// The release is in the registry: promote --verify into a stack pulling from it passes.
	if out, err := run(t, promoteCmd(), "--repo", repo, "--from", "local", "--to", "aks-dev", "--verify", "--ca-file", reg.CAFile); err != nil {
		t.Errorf("promote --verify of a pushed release: %v\n%s", err, out)
	}

	// Each of these fails and leaves every stack file as it was.
	before := readStacks(t, repo)
	wrongCreds := t.TempDir()
	registrytest.WriteDockerConfig(t, wrongCreds, reg.Host, registrytest.User, "wrong")
	notLayout := t.TempDir()
	os.MkdirAll(filepath.Join(notLayout, "manager"), 0o755)
	noTools := t.TempDir()
	for _, tc := range []struct {
		name   string
		docker string
		path   string
		args   []string
		want   []string
	}{
		{"push fails: wrong credentials", wrongCreds, "", []string{"--registry", target, "--ca-file", reg.CAFile, "--stack", "eks-dev", "--layout", layouts},
			[]string{reg.Host, "HTTP 401", "no stack file written"}},
		{"unknown stack", "", "", []string{"--registry", target, "--ca-file", reg.CAFile, "--stack", "eks-staging", "--layout", layouts},
			[]string{`unknown stack "eks-staging"`, "eks-dev"}},
		{"registry without a repository path", "", "", []string{"--registry", reg.Host, "--stack", "eks-dev", "--layout", layouts},
			[]string{"no repository path", "HOST[:PORT]/PATH"}},
		{"not an OCI layout", "", "", []string{"--registry", target, "--ca-file", reg.CAFile, "--stack", "eks-dev", "--layout", notLayout},
			[]string{"not an OCI image layout", "fusebox image build"}},
		{"mmdebstrap missing", "", noTools, []string{"--registry", target, "--ca-file", reg.CAFile, "--stack", "eks-dev", "--out", t.TempDir(), "--cache", t.TempDir()},
			[]string{"mmdebstrap missing", "install the Debian package mmdebstrap"}},
		{"insecure non-loopback", "", "", []string{"--registry", "registry.invalid/fusebox", "--insecure", "--stack", "eks-dev", "--layout", layouts},
			[]string{"loopback registry only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.docker != "" {
				t.Setenv("DOCKER_CONFIG", tc.docker)
			}
			if tc.path != "" {
				t.Setenv("PATH", tc.path)
			}
			out, err := run(t, releaseCmd(), append([]string{"--repo", repo}, tc.args...)...)
			if err == nil {
				t.Fatalf("release succeeded:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			after := readStacks(t, repo)
			for f := range before {
				if after[f] != before[f] {
					t.Errorf("%s was written", f)
				}
			}
		})
	}

	// A digest missing from the target's registry: promote --verify refuses, writes nothing.
	prod := filepath.Join(repo, "stacks", "Pulumi.eks-prod.yaml")
	b, _ := os.ReadFile(prod)
	b = bytes.Replace(b, []byte("  fusebox:cloud: eks\n"), []byte("  fusebox:cloud: eks\n  fusebox:registry: "+reg.Host+"/prod-mirror\n"), 1)
	os.WriteFile(prod, b, 0o644)
	if _, err := run(t, releaseCmd(), "--repo", repo, "--registry", target, "--ca-file", reg.CAFile, "--stack", "eks-dev", "--layout", layouts); err != nil {
		t.Fatal(err)
	}
	_, err = run(t, promoteCmd(), "--repo", repo, "--from", "eks-dev", "--to", "eks-prod", "--verify", "--ca-file", reg.CAFile)
	if err == nil || !strings.Contains(err.Error(), reg.Host+"/prod-mirror/manager@"+digests["manager"]) || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("promote --verify of a digest the target registry lacks: %v", err)
	}
	if after, _ := os.ReadFile(prod); !bytes.Equal(after, b) {
		t.Error("refused promotion wrote eks-prod")
	}

	// Once the digests are mirrored there, promote --verify passes and eks-prod pulls the
	// promoted digests from its own registry, never from the dev one.
	mirror := reg.Host + "/prod-mirror"
	if out, err := run(t, imagePushCmd(), "--registry", mirror, "--ca-file", reg.CAFile, "--layout", layouts, "--image", "manager,sandbox,gvisor-installer"); err != nil {
		t.Fatalf("mirroring into %s: %v\n%s", mirror, err, out)
	}
	if out, err := run(t, promoteCmd(), "--repo", repo, "--from", "eks-dev", "--to", "eks-prod", "--verify", "--ca-file", reg.CAFile); err != nil {
		t.Fatalf("promote --verify into the mirror: %v\n%s", err, out)
	}
	after, _ := os.ReadFile(prod)
	if !strings.Contains(string(after), "fusebox:registry: "+mirror+"\n") {
		t.Errorf("eks-prod lost its registry %s:\n%s", mirror, after)
	}
	want := map[string]string{"manager": mirror + "/manager@" + digests["manager"], "sandbox": mirror + "/sandbox@" + digests["sandbox"]}
	if got := stackImages(t, string(after)); !maps.Equal(got, want) {
		t.Errorf("eks-prod's fusebox:images %v, want %v", got, want)
	}
	if strings.Contains(string(after), target+"/") {
		t.Errorf("eks-prod names the dev registry %s:\n%s", target, after)
	}

	// A registry that is down: the release fails naming it, and writes no stack file.
	before = readStacks(t, repo)
	reg.Stop()
	_, err = run(t, releaseCmd(), "--repo", repo, "--registry", reg.Host+"/other", "--ca-file", reg.CAFile, "--stack", "eks-dev", "--layout", layouts)
	if err == nil || !strings.Contains(err.Error(), reg.Host) || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "no stack file written") {
		t.Errorf("release to a stopped registry: %v, want an error naming %s as unreachable", err, reg.Host)
	}
	for f, b := range readStacks(t, repo) {
		if b != before[f] {
			t.Errorf("%s was written by a release to a stopped registry", f)
		}
	}
}

// stackImages returns the fusebox:images map of a stack file.
func stackImages(t *testing.T, file string) map[string]string {
	t.Helper()
	var f struct {
		Config struct {
			Images map[string]string `json:"fusebox:images"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal([]byte(file), &f); err != nil {
		t.Fatalf("stack file: %v", err)
	}
	return f.Config.Images
}

// TestImagePushBadInput checks push's refusals before any registry is asked.
func TestImagePushBadInput(t *testing.T) {
	layouts, _ := testLayouts(t)
	notLayout := t.TempDir()
	os.MkdirAll(filepath.Join(notLayout, "sandbox"), 0o755)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no registry", []string{"--layout", layouts}, []string{"--registry HOST[:PORT]/PATH is required"}},
		{"registry without a repository path", []string{"--registry", "127.0.0.1:5000", "--layout", layouts},
			[]string{`"127.0.0.1:5000": no repository path`, "127.0.0.1:5000/fusebox"}},
		{"unknown image", []string{"--registry", "127.0.0.1:5000/fusebox", "--layout", layouts, "--image", "runner"},
			[]string{`unknown image "runner"`, "manager, sandbox, gvisor-installer"}},
		{"not an OCI layout", []string{"--registry", "127.0.0.1:5000/fusebox", "--layout", notLayout, "--image", "sandbox"},
			[]string{"not an OCI image layout", filepath.Join(notLayout, "sandbox"), "fusebox image build"}},
		{"no layout directory", []string{"--registry", "127.0.0.1:5000/fusebox", "--layout", filepath.Join(notLayout, "nope")},
			[]string{"not an OCI image layout", "fusebox image build --out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, imagePushCmd(), tc.args...)
			if err == nil {
				t.Fatalf("push succeeded:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestImageBuildBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--image", "runner"}, `unknown image "runner"`},
		{[]string{"--config", "/nonexistent/images.yaml"}, "image config"},
		{[]string{"--image", "sandbox", "--packages", "jq;true"}, `Debian package name "jq;true"`},
	} {
		_, err := run(t, imageBuildCmd(), append([]string{"--repo", filepath.Join("..", "..")}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("image build %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
