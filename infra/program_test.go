package infra

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	runtimeClassType = "kubernetes:node.k8s.io/v1:RuntimeClass"
	nodePoolType     = "kubernetes:karpenter.sh/v1:NodePool"
	ec2Type          = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
	aksType          = "kubernetes:karpenter.azure.com/v1beta1:AKSNodeClass"
	cnpType          = "kubernetes:cilium.io/v2:CiliumNetworkPolicy"
	vapType          = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
	vapBindingType   = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
	deploymentType   = "kubernetes:apps/v1:Deployment"
	releaseType      = "kubernetes:helm.sh/v3:Release"
	daemonSetType    = "kubernetes:apps/v1:DaemonSet"
)

// stackConfig loads stacks/Pulumi.<stack>.yaml the way the Pulumi engine hands it to a Go
// program: strings as they are, structured values as JSON.
//
// The repository's stack files pin no images until `fusebox release` writes them, so this
// writes a test release into a copy first, with ReleaseStackFile (what the release command
// writes), and on aks adds the gVisor checksums that the operator adds by hand.
func stackConfig(t *testing.T, stack string) map[string]string {
	t.Helper()
	return stackConfigFile(t, releasedCopy(t, filepath.Join("..", "stacks", "Pulumi."+stack+".yaml")))
}

// testRegistry is where the test release's images are (never contacted).
const testRegistry = "127.0.0.1:5000/fusebox"

// testRelease is a release whose digests are those of the strings "manager", "sandbox", ...
func testRelease() ReleaseImages {
	imgs := ReleaseImages{}
	for _, n := range []string{ReleaseManager, ReleaseSandbox, ReleaseGVisorInstaller} {
		imgs[n] = fmt.Sprintf("%s/%s@sha256:%x", testRegistry, n, sha256.Sum256([]byte(n)))
	}
	return imgs
}

// releasedCopy writes path with the test release into a temporary file and returns it.
func releasedCopy(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := ReleaseStackFile(b, path, testRegistry, testRelease())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "\n  fusebox:cloud: aks\n") {
		out = []byte(strings.Replace(string(out), "    installerImage: ", "    sha256:\n      x86_64:\n        runsc: "+strings.Repeat("a", 64)+
			"\n        containerd-shim-runsc-v1: "+strings.Repeat("b", 64)+"\n    installerImage: ", 1))
	}
	p := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// stackConfigFile is stackConfig for a stack file anywhere; every key must be in the
// program's config namespace.
func stackConfigFile(t *testing.T, path string) map[string]string {
	t.Helper()
	cfg, err := mocktest.StackConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	for k := range cfg {
		if !strings.HasPrefix(k, Namespace+":") {
			t.Errorf("%s: key %s outside the %s namespace", filepath.Base(path), k, Namespace)
		}
	}
	return cfg
}

func runStack(stack string, cfg map[string]string) (*mocktest.Mocks, error) {
	return mocktest.Run(Program, mocktest.WithConfig(cfg), func(info *pulumi.RunInfo) { info.Stack = stack })
}

func TestStacks(t *testing.T) {
	stacks, err := filepath.Glob(filepath.Join("..", "stacks", "Pulumi.*.yaml"))
	if err != nil || len(stacks) < 5 {
		t.Fatalf("stack files: %v %v", stacks, err)
	}
	want := map[string]struct {
		runtimeClass, nodePool bool
		nodeClass              string
		userDataURL            string
	}{
		"eks-dev":  {true, true, ec2Type, "https://storage.googleapis.com/gvisor/releases/release/20250120"},
		"eks-prod": {true, true, ec2Type, "https://mirror.example.com/gvisor/releases/release/20250120"},
		"gke-dev":  {false, false, "", ""},
		"aks-dev":  {true, true, aksType, ""},
		"local":    {true, false, "", ""},
	}
	for _, path := range stacks {
		stack := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "Pulumi."), ".yaml")
		t.Run(stack, func(t *testing.T) {
			w, ok := want[stack]
			if !ok {
				t.Fatalf("no expectations for stack %s", stack)
			}
			m, err := runStack(stack, stackConfig(t, stack))
			if err != nil {
				t.Fatalf("Program: %v", err)
			}

			// Every Kubernetes object belongs to a fusebox component.
			for _, r := range m.All() {
				if strings.HasPrefix(r.Type, "fusebox:components:") {
					continue
				}
				if !strings.Contains(r.Parent, "fusebox:components:") {
					t.Errorf("%s %s is not parented to a component (parent %q)", r.Type, r.Name, r.Parent)
				}
			}

			if got := len(m.ByType(runtimeClassType)); got != map[bool]int{true: 1}[w.runtimeClass] {
				t.Errorf("RuntimeClasses: %d", got)
			}
			if got := len(m.ByType(nodePoolType)); got != map[bool]int{true: 1}[w.nodePool] {
				t.Errorf("NodePools: %d", got)
			}
			for _, nc := range []string{ec2Type, aksType} {
				n := len(m.ByType(nc))
				if (nc == w.nodeClass) != (n == 1) || n > 1 {
					t.Errorf("%s: %d", nc, n)
				}
			}
			if w.nodeClass == ec2Type {
				ud := mocktest.Str(m.One(t, ec2Type).Props(), "spec", "userData")
				for _, f := range []string{`plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc`, "base='" + w.userDataURL + "'"} {
					if !strings.Contains(ud, f) {
						t.Errorf("userData lacks %q", f)
					}
				}
			}
			// The gVisor node installer runs on AKS only (EKS installs through userData).
			if n := len(m.ByType(daemonSetType)); n != map[bool]int{true: 1}[w.nodeClass == aksType] {
				t.Errorf("%d node-installer DaemonSets", n)
			}
			if w.nodeClass == aksType {
				c := mocktest.Dig(m.One(t, daemonSetType).Props(), "spec", "template", "spec", "containers", 0)
				if err := components.ValidateImage(mocktest.Str(c, "image")); err != nil {
					t.Errorf("installer image: %v", err)
				}
				env := map[string]string{}
				for _, e := range mocktest.Dig(c, "env").([]any) {
					env[mocktest.Str(e, "name")] = mocktest.Str(e, "value")
				}
				if env["BINARY_BASE_URL"] != "https://storage.googleapis.com/gvisor/releases/release/20250120" ||
					len(env["SHA256_RUNSC_X86_64"]) != 64 || len(env["SHA256_SHIM_X86_64"]) != 64 {
					t.Errorf("installer env %v", env)
				}
			}
			if w.runtimeClass {
				p := m.One(t, runtimeClassType).Props()
				if sched := mocktest.Dig(p, "scheduling"); (sched != nil) != w.nodePool {
					t.Errorf("RuntimeClass scheduling %v with node pool %v", sched, w.nodePool)
				}
			}

			m.One(t, vapType)
			if ns := mocktest.Str(m.One(t, vapBindingType).Props(), "spec", "matchResources", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"); ns != "fusebox-sandboxes" {
				t.Errorf("admission binding namespace %q", ns)
			}
			if n := len(m.ByType(cnpType)); n < 5 {
				t.Errorf("%d network policies", n)
			}
			if n := len(m.ByType(releaseType)); n != 0 {
				t.Errorf("%d Cilium releases with install: false", n)
			}

			d := m.One(t, deploymentType)
			if r, _ := mocktest.Dig(d.Props(), "spec", "replicas").(float64); r < 2 {
				t.Errorf("manager replicas %v", r)
			}
			var waitsForBinding, waitsForDeny bool
			for _, dep := range d.Deps {
				waitsForBinding = waitsForBinding || strings.HasSuffix(dep, "::fusebox-binding")
				waitsForDeny = waitsForDeny || strings.HasSuffix(dep, "::fusebox-fusebox-default-deny")
			}
			if !waitsForBinding || !waitsForDeny {
				t.Errorf("manager Deployment does not wait for the sandbox policies: %v", d.Deps)
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	base := func() map[string]string { return stackConfig(t, "eks-dev") }
	for name, tc := range map[string]struct {
		mut  func(map[string]string)
		want string
	}{
		"missing cloud":  {func(c map[string]string) { delete(c, "fusebox:cloud") }, "fusebox:cloud in stacks/Pulumi.eks-dev.yaml"},
		"unknown cloud":  {func(c map[string]string) { c["fusebox:cloud"] = "openstack" }, "fusebox:cloud"},
		"missing images": {func(c map[string]string) { delete(c, "fusebox:images") }, "fusebox:images"},
		"image by tag": {func(c map[string]string) {
			c["fusebox:images"] = `{"manager":"registry.example.com/m:v1","sandbox":"registry.example.com/s:v1"}`
		}, "fusebox:images.manager"},
		"misspelt field":  {func(c map[string]string) { c["fusebox:pool"] = `{"size":2,"maxx":4}` }, "fusebox:pool"},
		"ill-typed field": {func(c map[string]string) { c["fusebox:pool"] = `{"size":"two","max":4}` }, "fusebox:pool"},
		"not an object":   {func(c map[string]string) { c["fusebox:cilium"] = "yes" }, "fusebox:cilium"},
		"no node pool":    {func(c map[string]string) { delete(c, "fusebox:nodePool") }, "fusebox:nodePool"},
		"one replica":     {func(c map[string]string) { c["fusebox:manager"] = `{"replicas":1}` }, "fusebox:manager.replicas"},
		"unpinned chart": {func(c map[string]string) {
			c["fusebox:cilium"] = `{"install":true,"chart":{"repo":"https://helm.cilium.io"}}`
		}, "fusebox:cilium.chart"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := base()
			tc.mut(cfg)
			m, err := runStack("eks-dev", cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a configuration error naming %q, got %v", tc.want, err)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered despite the bad configuration", n)
			}
		})
	}
}

func TestBadAKSGVisorConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		gvisor string
		want   string
	}{
		"no installer image": {`{"version":"20250120","sha256":{"x86_64":{"runsc":"` + strings.Repeat("a", 64) + `","containerd-shim-runsc-v1":"` + strings.Repeat("b", 64) + `"}}}`, "fusebox:gvisor.installerImage"},
		"installer by tag":   {`{"installerImage":"registry.example.com/i:v1","sha256":{"x86_64":{"runsc":"` + strings.Repeat("a", 64) + `","containerd-shim-runsc-v1":"` + strings.Repeat("b", 64) + `"}}}`, "fusebox:gvisor.installerImage"},
		"no digests":         {`{"installerImage":"registry.example.com/i@sha256:` + strings.Repeat("c", 64) + `"}`, "fusebox:gvisor.sha256"},
		"short shim digest":  {`{"installerImage":"registry.example.com/i@sha256:` + strings.Repeat("c", 64) + `","sha256":{"x86_64":{"runsc":"` + strings.Repeat("a", 64) + `","containerd-shim-runsc-v1":"bb"}}}`, "fusebox:gvisor.sha256.x86_64.containerd-shim-runsc-v1"},
		"unknown arch":       {`{"installerImage":"registry.example.com/i@sha256:` + strings.Repeat("c", 64) + `","sha256":{"s390x":{"runsc":"` + strings.Repeat("a", 64) + `","containerd-shim-runsc-v1":"` + strings.Repeat("b", 64) + `"}}}`, "fusebox:gvisor.sha256.s390x"},
		"latest version":     {`{"version":"latest"}`, "fusebox:gvisor.version"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := stackConfig(t, "aks-dev")
			cfg["fusebox:gvisor"] = tc.gvisor
			m, err := runStack("aks-dev", cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "stacks/Pulumi.aks-dev.yaml") {
				t.Fatalf("want a configuration error naming %q and the stack file, got %v", tc.want, err)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered", n)
			}
		})
	}
}

// TestUnreleasedStacksAreRefused: the repository's stack files, as committed, pin no images:
// the program refuses each, saying to run fusebox release for that stack.
func TestUnreleasedStacksAreRefused(t *testing.T) {
	for _, stack := range []string{"eks-dev", "eks-prod", "gke-dev", "aks-dev", "local"} {
		t.Run(stack, func(t *testing.T) {
			cfg := stackConfigFile(t, filepath.Join("..", "stacks", "Pulumi."+stack+".yaml"))
			m, err := runStack(stack, cfg)
			want := "fusebox release --registry HOST[:PORT]/PATH --stack " + stack
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "stacks/Pulumi."+stack+".yaml") {
				t.Fatalf("unreleased %s: %v, want an error saying %q", stack, err, want)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered", n)
			}
		})
	}
}

func TestLocalStackNeedsNoNodePool(t *testing.T) {
	cfg := stackConfig(t, "local")
	if _, ok := cfg["fusebox:nodePool"]; ok {
		t.Skip("local stack sets a node pool")
	}
	if _, err := runStack("local", cfg); err != nil {
		t.Fatal(err)
	}
	if c, _ := components.ParseCloud(cfg["fusebox:cloud"]); c != components.Local {
		t.Errorf("local stack cloud %q", cfg["fusebox:cloud"])
	}
}
