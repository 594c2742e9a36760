package infra

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	digestC = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
)

// stackYAML builds a stack file; the release values are parameters, everything else differs
// per environment through env.
func stackYAML(cloud, env, manager, sandbox, version string, extra string) string {
	return `# fusebox ` + env + `: a comment that must survive.
config:
  fusebox:cloud: ` + cloud + `
  fusebox:images:
    manager: registry.example.com/fusebox/manager@` + manager + ` # manager image
    sandbox: registry.example.com/fusebox/sandbox@` + sandbox + `
  fusebox:pool:
    size: ` + map[string]string{"dev": "2", "prod": "8"}[env] + `
    max: 16
  fusebox:nodePool:
    name: sandbox-` + env + `
    requirements:
      - key: kubernetes.io/arch
        operator: In
        values: [amd64]
  fusebox:gvisor:
    # mirror of ` + env + `
    binaryBaseURL: https://mirror-` + env + `.example.com/gvisor
    version: "` + version + `"
` + extra
}

func TestPromoteStackFiles(t *testing.T) {
	aksExtra := func(img string) string {
		return `    installerImage: registry.example.com/fusebox/node-installer@` + img + "\n"
	}
	// aks stacks take no gVisor release: the installer image carries runsc.
	noVersion := func(s string) string { return strings.Replace(s, "    version: \"20250120\"\n", "", 1) }
	for _, tc := range []struct {
		name     string
		src, dst string
		want     []Change // nil with wantErr
		wantErr  []string // substrings of the error
	}{
		{
			name: "eks dev to prod",
			src:  stackYAML("eks", "dev", digestB, digestC, "20250310", ""),
			dst:  stackYAML("eks", "prod", digestA, digestC, "20250120", ""),
			want: []Change{
				{"fusebox:images.manager", "registry.example.com/fusebox/manager@" + digestA, "registry.example.com/fusebox/manager@" + digestB},
				{"fusebox:gvisor.version", "20250120", "20250310"},
			},
		},
		{
			name: "nothing to promote",
			src:  stackYAML("eks", "dev", digestA, digestC, "20250120", ""),
			dst:  stackYAML("eks", "prod", digestA, digestC, "20250120", ""),
			want: []Change{},
		},
		{
			name: "aks installer image",
			src:  noVersion(stackYAML("aks", "dev", digestA, digestC, "20250120", aksExtra(digestB))),
			dst:  noVersion(stackYAML("aks", "prod", digestA, digestC, "20250120", aksExtra(digestA))),
			want: []Change{
				{"fusebox:gvisor.installerImage", "registry.example.com/fusebox/node-installer@" + digestA, "registry.example.com/fusebox/node-installer@" + digestB},
			},
		},
		{
			name:    "image without a digest",
			src:     strings.Replace(stackYAML("eks", "dev", digestB, digestC, "20250120", ""), "sandbox@"+digestC, "sandbox:v2", 1),
			dst:     stackYAML("eks", "prod", digestA, digestC, "20250120", ""),
			wantErr: []string{"fusebox:images.sandbox", "stacks/Pulumi.src.yaml", "not pinned by digest"},
		},
		{
			name:    "unpinned gVisor release",
			src:     stackYAML("eks", "dev", digestB, digestC, "latest", ""),
			dst:     stackYAML("eks", "prod", digestA, digestC, "20250120", ""),
			wantErr: []string{"fusebox:gvisor.version", "stacks/Pulumi.src.yaml"},
		},
		{
			name:    "key missing in the target",
			src:     stackYAML("eks", "dev", digestB, digestC, "20250120", ""),
			dst:     strings.Replace(stackYAML("eks", "prod", digestA, digestC, "20250120", ""), "    version: \"20250120\"\n", "", 1),
			wantErr: []string{"fusebox:gvisor.version", "missing in stacks/Pulumi.dst.yaml"},
		},
		{
			name:    "image missing in the source",
			src:     strings.Replace(stackYAML("eks", "dev", digestB, digestC, "20250120", ""), "    sandbox: registry.example.com/fusebox/sandbox@"+digestC+"\n", "", 1),
			dst:     stackYAML("eks", "prod", digestA, digestC, "20250120", ""),
			wantErr: []string{"fusebox:images.sandbox", "stacks/Pulumi.dst.yaml", "missing in stacks/Pulumi.src.yaml"},
		},
		{
			name:    "different clouds, cloud-specific key",
			src:     stackYAML("eks", "dev", digestB, digestC, "20250120", ""),
			dst:     strings.Replace(stackYAML("gke", "prod", digestA, digestC, "20250120", ""), "    version: \"20250120\"\n", "", 1),
			wantErr: []string{"fusebox:gvisor.version", "different clouds", "eks → gke"},
		},
		{
			name: "different clouds, cloud-neutral keys only",
			src:  "config:\n  fusebox:cloud: local\n  fusebox:images:\n    manager: r.example.com/m@" + digestB + "\n    sandbox: r.example.com/s@" + digestC + "\n",
			dst:  "config:\n  fusebox:cloud: gke\n  fusebox:images:\n    manager: r.example.com/m@" + digestA + "\n    sandbox: r.example.com/s@" + digestC + "\n  fusebox:pool:\n    size: 4\n",
			want: []Change{{"fusebox:images.manager", "r.example.com/m@" + digestA, "r.example.com/m@" + digestB}},
		},
		{
			name:    "eks version into aks (aks takes none)",
			src:     stackYAML("eks", "dev", digestA, digestC, "20250310", "    installerImage: r.example.com/i@"+digestA+"\n"),
			dst:     noVersion(stackYAML("aks", "prod", digestA, digestC, "20250120", "    installerImage: r.example.com/i@"+digestA+"\n")),
			wantErr: []string{"fusebox:gvisor.version", "specific to eks", "eks → aks"},
		},
		{
			name:    "eks and aks key into gke",
			src:     noVersion(stackYAML("aks", "dev", digestA, digestC, "20250120", "    installerImage: r.example.com/i@"+digestA+"\n")),
			dst:     strings.Replace(stackYAML("gke", "prod", digestA, digestC, "20250120", ""), "    version: \"20250120\"\n", "", 1),
			wantErr: []string{"specific to eks and aks", "different clouds (aks → gke"},
		},
		{
			name:    "target without cloud",
			src:     stackYAML("eks", "dev", digestA, digestC, "20250120", ""),
			dst:     "config:\n  fusebox:images:\n    manager: x\n",
			wantErr: []string{"fusebox:cloud", "stacks/Pulumi.dst.yaml"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changes, err := PromoteStackFiles([]byte(tc.src), []byte(tc.dst), "stacks/Pulumi.src.yaml", "stacks/Pulumi.dst.yaml")
			if tc.wantErr != nil {
				if !errors.Is(err, ErrPromote) {
					t.Fatalf("want ErrPromote, got %v", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(changes) != len(tc.want) {
				t.Fatalf("changes %v, want %v", changes, tc.want)
			}
			for i := range changes {
				if changes[i] != tc.want[i] {
					t.Errorf("change %d: %+v, want %+v", i, changes[i], tc.want[i])
				}
			}
			// Only the promoted lines differ; comments, order and environment values stay.
			assertOnlyChanged(t, tc.dst, string(out), changes)
			// Promoting again changes nothing.
			if _, again, err := PromoteStackFiles([]byte(tc.src), out, "src", "dst"); err != nil || len(again) != 0 {
				t.Errorf("second promotion: %v %v", again, err)
			}
		})
	}
}

// assertOnlyChanged fails unless after differs from before exactly in the lines holding the
// changed values.
func assertOnlyChanged(t *testing.T, before, after string, changes []Change) {
	t.Helper()
	b, a := strings.Split(before, "\n"), strings.Split(after, "\n")
	if len(a) != len(b) {
		t.Fatalf("line count %d → %d:\n%s", len(b), len(a), after)
	}
	diff := 0
	for i := range b {
		if a[i] == b[i] {
			continue
		}
		diff++
		ok := false
		for _, c := range changes {
			ok = ok || (strings.Contains(b[i], c.Old) && strings.Replace(b[i], c.Old, c.New, 1) == a[i])
		}
		if !ok {
			t.Errorf("line %d changed unexpectedly:\n- %s\n+ %s", i+1, b[i], a[i])
		}
	}
	if diff != len(changes) {
		t.Errorf("%d lines changed for %d changes", diff, len(changes))
	}
}

// TestPromoteRepositoryStacks promotes the repository's own stack files into copies: the
// YAML round trip keeps each file byte for byte apart from the promoted values, and a
// dry run writes nothing.
func TestPromoteRepositoryStacks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "stacks")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"eks-dev", "eks-prod", "aks-dev", "gke-dev", "local"} {
		b, err := os.ReadFile(filepath.Join("..", "stacks", "Pulumi."+s+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "Pulumi."+s+".yaml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A release into eks-dev's registry, and an older one into eks-prod's own (its mirror).
	release(t, dir, "eks-dev", "127.0.0.1:5000/dev", digestA, digestB)
	release(t, dir, "eks-prod", "127.0.0.1:5001/prod-mirror", digestC, digestC)
	devPath := filepath.Join(dir, "Pulumi.eks-dev.yaml")
	dev, _ := os.ReadFile(devPath)
	var doc yaml.Node
	if err := yaml.Unmarshal(dev, &doc); err != nil {
		t.Fatal(err)
	}
	newDev := strings.Replace(string(dev), `version: "20250120"`, `version: "20250310"`, 1)
	if err := os.WriteFile(devPath, []byte(newDev), 0o644); err != nil {
		t.Fatal(err)
	}
	prodPath := filepath.Join(dir, "Pulumi.eks-prod.yaml")
	prodBefore, _ := os.ReadFile(prodPath)

	changes, err := Promote(PromoteOptions{StacksDir: dir, From: "eks-dev", To: "eks-prod", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 4 {
		t.Fatalf("dry run: %d changes, want 4 (two images, the node installer's image, gVisor version): %v", len(changes), changes)
	}
	if b, _ := os.ReadFile(prodPath); string(b) != string(prodBefore) {
		t.Fatal("dry run wrote the target")
	}

	if _, err := Promote(PromoteOptions{StacksDir: dir, From: "eks-dev", To: "eks-prod"}); err != nil {
		t.Fatal(err)
	}
	prodAfter, _ := os.ReadFile(prodPath)
	assertOnlyChanged(t, string(prodBefore), string(prodAfter), changes)
	// The digests came from eks-dev; the registry stayed eks-prod's.
	for _, want := range []string{
		"manager: 127.0.0.1:5001/prod-mirror/manager@" + digestA,
		"sandbox: 127.0.0.1:5001/prod-mirror/sandbox@" + digestB,
		"installerImage: 127.0.0.1:5001/prod-mirror/gvisor-installer@" + digestA,
		"fusebox:registry: 127.0.0.1:5001/prod-mirror",
	} {
		if !strings.Contains(string(prodAfter), want) {
			t.Errorf("promoted eks-prod lacks %q:\n%s", want, prodAfter)
		}
	}
	if strings.Contains(string(prodAfter), "127.0.0.1:5000/dev") {
		t.Errorf("eks-prod got eks-dev's registry:\n%s", prodAfter)
	}
	// The promoted file is still a valid stack: the program loads it.
	tcfg := stackConfigFile(t, prodPath)
	if _, err := runStack("eks-prod", tcfg); err != nil {
		t.Fatalf("promoted eks-prod: %v", err)
	}
	if !strings.Contains(string(prodAfter), "binaryBaseURL: https://mirror.example.com/gvisor/releases/release") {
		t.Error("the prod mirror URL was not kept")
	}

	// Across clouds with cloud-specific keys, into a stack with no registry of its own:
	// refused (for whichever it finds first), nothing written.
	gkeBefore, _ := os.ReadFile(filepath.Join(dir, "Pulumi.gke-dev.yaml"))
	if _, err := Promote(PromoteOptions{StacksDir: dir, From: "eks-dev", To: "gke-dev"}); !errors.Is(err, ErrPromote) ||
		!(strings.Contains(err.Error(), "fusebox:gvisor.version") || strings.Contains(err.Error(), "fusebox:registry")) ||
		!strings.Contains(err.Error(), "stacks/Pulumi.gke-dev.yaml") {
		t.Errorf("eks-dev → gke-dev: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "Pulumi.gke-dev.yaml")); string(b) != string(gkeBefore) {
		t.Error("refused promotion wrote the target")
	}
	if _, err := Promote(PromoteOptions{StacksDir: dir, From: "eks-dev", To: "nope"}); !errors.Is(err, ErrPromote) {
		t.Errorf("unknown target: %v", err)
	}

	// --verify: a digest the target's registry lacks refuses the promotion; nothing written.
	release(t, dir, "eks-dev", "127.0.0.1:5000/dev", digestC, digestB)
	prodBefore, _ = os.ReadFile(prodPath)
	var asked []string
	_, err = Promote(PromoteOptions{StacksDir: dir, From: "eks-dev", To: "eks-prod", Verify: func(ref string) error {
		asked = append(asked, ref)
		return errors.New("not in the registry")
	}})
	if !errors.Is(err, ErrPromote) || !strings.Contains(err.Error(), "not in the registry") || !strings.Contains(err.Error(), "fusebox:images.manager") {
		t.Errorf("verify refusing: %v", err)
	}
	if len(asked) != 1 || asked[0] != "127.0.0.1:5001/prod-mirror/manager@"+digestC { // the first image refuses
		t.Errorf("verify asked for %v, want the target registry's reference", asked)
	}
	if b, _ := os.ReadFile(prodPath); string(b) != string(prodBefore) {
		t.Error("refused promotion wrote the target")
	}
}

// release writes a release with the given digests into a stack file, as fusebox release does.
func release(t *testing.T, dir, stack, registry, manager, sandbox string) {
	t.Helper()
	// The node installer (eks and aks) carries the manager's digest.
	imgs := ReleaseImages{ReleaseManager: registry + "/manager@" + manager, ReleaseSandbox: registry + "/sandbox@" + sandbox,
		ReleaseGVisorInstaller: registry + "/gvisor-installer@" + manager}
	if _, err := WriteRelease(dir, []string{stack}, registry, imgs); err != nil {
		t.Fatal(err)
	}
}

// TestPromoteIntoAnUnreleasedStack: a target with its registry but no images yet gets them,
// under its registry; without a registry it is refused, naming the key to set.
func TestPromoteIntoAnUnreleasedStack(t *testing.T) {
	src := "config:\n  fusebox:cloud: eks\n  fusebox:registry: 127.0.0.1:5000/dev\n  fusebox:images:\n" +
		"    manager: 127.0.0.1:5000/dev/manager@" + digestA + "\n    sandbox: 127.0.0.1:5000/dev/sandbox@" + digestB + "\n"
	dst := "# prod\nconfig:\n  fusebox:cloud: eks\n  # the prod mirror\n  fusebox:registry: 127.0.0.1:5001/prod\n  fusebox:pool:\n    size: 2\n"
	out, changes, err := PromoteStackFiles([]byte(src), []byte(dst), "src", "stacks/Pulumi.dst.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := "# prod\nconfig:\n  fusebox:cloud: eks\n  # the prod mirror\n  fusebox:registry: 127.0.0.1:5001/prod\n  fusebox:images:\n" +
		"    manager: 127.0.0.1:5001/prod/manager@" + digestA + "\n    sandbox: 127.0.0.1:5001/prod/sandbox@" + digestB + "\n  fusebox:pool:\n    size: 2\n"
	if string(out) != want || len(changes) != 2 {
		t.Errorf("promoted:\n%s\nwant:\n%s\nchanges %v", out, want, changes)
	}
	_, _, err = PromoteStackFiles([]byte(src), []byte("config:\n  fusebox:cloud: eks\n"), "src", "stacks/Pulumi.dst.yaml")
	if !errors.Is(err, ErrPromote) || !strings.Contains(err.Error(), RegistryKey) || !strings.Contains(err.Error(), "fusebox release") {
		t.Errorf("promotion into a stack without registry: %v", err)
	}
}
