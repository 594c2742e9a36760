package infra

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/gvisor"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	runtimeClassType = "kubernetes:node.k8s.io/v1:RuntimeClass"
	nodePoolType     = "kubernetes:karpenter.sh/v1:NodePool"
	ec2Type          = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
	aksType          = "kubernetes:karpenter.azure.com/v1beta1:AKSNodeClass"
	cnpType          = "kubernetes:cilium.io/v2:CiliumNetworkPolicy"
	npType           = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
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
		flavour                sandboxnet.Flavour
	}{
		"eks-dev":  {true, true, ec2Type, "https://storage.googleapis.com/gvisor/releases/release/20250120", sandboxnet.Cilium},
		"eks-prod": {true, true, ec2Type, "https://mirror.example.com/gvisor/releases/release/20250120", sandboxnet.Cilium},
		"gke-dev":  {false, false, "", "", sandboxnet.GKE},
		"aks-dev":  {true, true, aksType, "", sandboxnet.Cilium},
		"local":    {true, false, "", "", sandboxnet.Kubernetes},
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
				p := m.One(t, ec2Type).Props()
				ud := mocktest.Str(p, "spec", "userData")
				// The runtime is registered through nodeadm's NodeConfig (components/gvisor's
				// TestEKSUserDataNodeadm runs nodeadm's code on it).
				for _, f := range []string{"Content-Type: " + gvisor.NodeConfigContentType, "kind: NodeConfig",
					`plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc`, "systemd-cgroup", "base='" + w.userDataURL + "'"} {
					if !strings.Contains(ud, f) {
						t.Errorf("userData lacks %q", f)
					}
				}
				if alias := mocktest.Str(p, "spec", "amiSelectorTerms", 0, "alias"); !strings.HasPrefix(alias, "al2023@v") {
					t.Errorf("AMI alias %q is not pinned", alias)
				}
			}
			// Sandbox nodes carry the startup taint until the node installer removes it.
			if w.nodePool {
				if k := mocktest.Str(m.One(t, nodePoolType).Props(), "spec", "template", "spec", "startupTaints", 0, "key"); k != "fusebox.dev/gvisor-not-ready" {
					t.Errorf("NodePool startup taint %q", k)
				}
			}
			// The gVisor node installer runs on AKS (installing) and EKS (verifying).
			if n := len(m.ByType(daemonSetType)); n != map[bool]int{true: 1}[w.nodeClass != ""] {
				t.Errorf("%d node-installer DaemonSets", n)
			}
			if w.nodeClass == ec2Type {
				c := mocktest.Dig(m.One(t, daemonSetType).Props(), "spec", "template", "spec", "containers", 0)
				if !strings.Contains(fmt.Sprint(mocktest.Dig(c, "env")), "verify") {
					t.Errorf("EKS installer env %v: want MODE=verify", mocktest.Dig(c, "env"))
				}
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
				// The installer installs its image's runsc: no download URL, no digests.
				if env["MODE"] != "install" || env["BINARY_BASE_URL"] != "" || env["SHA256_RUNSC_X86_64"] != "" {
					t.Errorf("installer env %v", env)
				}
			}
			if w.runtimeClass {
				p := m.One(t, runtimeClassType).Props()
				if sched := mocktest.Dig(p, "scheduling"); (sched != nil) != w.nodePool {
					t.Errorf("RuntimeClass scheduling %v with node pool %v", sched, w.nodePool)
				}
			}

			// The sandbox pods' admission policy, and on eks and aks the node installer's.
			var sandboxBinding map[string]any
			for _, b := range m.ByType(vapBindingType) {
				if strings.HasPrefix(mocktest.Str(b.Props(), "metadata", "name"), "fusebox-sandbox-pods-") {
					sandboxBinding = b.Props()
				}
			}
			if n, want := len(m.ByType(vapType)), map[bool]int{false: 1, true: 2}[w.nodePool]; n != want {
				t.Errorf("%d ValidatingAdmissionPolicies, want %d", n, want)
			}
			if ns := mocktest.Str(sandboxBinding, "spec", "matchResources", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"); ns != "fusebox-sandboxes" {
				t.Errorf("admission binding namespace %q", ns)
			}
			// The network policies are sandboxnet's, in the stack's flavour, and their default
			// deny is the one the manager checks for.
			typ := map[sandboxnet.Flavour]string{sandboxnet.Cilium: cnpType, sandboxnet.GKE: npType, sandboxnet.Kubernetes: npType}[w.flavour]
			other := map[string]string{cnpType: npType, npType: cnpType}[typ]
			if n := len(m.ByType(other)); n != 0 {
				t.Errorf("%d %s on a %s stack", n, other, w.flavour)
			}
			var dd map[string]any
			for _, r := range m.ByType(typ) {
				if mocktest.Str(r.Props(), "metadata", "name") == kubealloc.DefaultDenyName {
					dd = r.Props()
				}
			}
			want, err := kubealloc.DefaultDenyPolicy(w.flavour, "fusebox-sandboxes")
			if err != nil {
				t.Fatal(err)
			}
			if dd == nil || !reflect.DeepEqual(dd["spec"], want.Object["spec"]) || mocktest.Str(dd, "metadata", "namespace") != "fusebox-sandboxes" {
				t.Errorf("the program's default deny %v is not the manager's %s %v", dd, want.GetKind(), want.Object["spec"])
			}
			argv := fmt.Sprint(mocktest.Dig(m.One(t, deploymentType).Props(), "spec", "template", "spec", "containers", 0, "args"))
			for _, a := range []string{"--network-policy=" + string(w.flavour), "--agent-namespaces=", "--state-dir="} {
				if !strings.Contains(argv, a) {
					t.Errorf("manager args %s lack %s", argv, a)
				}
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
				waitsForDeny = waitsForDeny || strings.HasSuffix(dep, "::fusebox-fusebox-sandbox-default-deny")
			}
			if !waitsForBinding || !waitsForDeny {
				t.Errorf("manager Deployment does not wait for the sandbox policies: %v", d.Deps)
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	base := func() map[string]string { return stackConfig(t, "eks-dev") }
	// Every message, whole, is in testdata/config/errors.json.
	errs := map[string]string{}
	defer func() { mocktest.GoldenJSON(t, filepath.Join("testdata", "config", "errors.json"), errs) }()
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
		"tls secret name": {func(c map[string]string) { c["fusebox:manager"] = `{"tlsSecret":"My_Cert"}` }, "fusebox:manager.tlsSecret"},
		"token audience":  {func(c map[string]string) { c["fusebox:manager"] = `{"tokenAudience":"fusebox manager"}` }, "fusebox:manager.tokenAudience"},
		"external name": {func(c map[string]string) {
			c["fusebox:manager"] = `{"serviceType":"LoadBalancer","externalNames":["manager.example.com","https://manager.example.com"]}`
		}, "fusebox:manager.externalNames[1]"},
		"external IP with zone": {func(c map[string]string) { c["fusebox:manager"] = `{"externalNames":["fe80::1%eth0"]}` }, "fusebox:manager.externalNames[0]"},
		"external names, own certificate": {func(c map[string]string) {
			c["fusebox:manager"] = `{"tlsSecret":"manager-cert","externalNames":["manager.example.com"]}`
		}, "fusebox:manager.externalNames"},
		"unpinned chart": {func(c map[string]string) {
			c["fusebox:cilium"] = `{"install":true,"chart":{"repo":"https://helm.cilium.io"}}`
		}, "fusebox:cilium.chart"},
		"egress defaults": {func(c map[string]string) {
			c["fusebox:egress"] = `{"dataClientNamespaces":["a"],"allowFQDNs":["pypi.org"]}`
		}, "fusebox:egress.allowFQDNs"},
		"no agents":       {func(c map[string]string) { c["fusebox:egress"] = `{}` }, "fusebox:egress.dataClientNamespaces"},
		"no egress":       {func(c map[string]string) { delete(c, "fusebox:egress") }, "fusebox:egress"},
		"gke flavour":     {func(c map[string]string) { c["fusebox:networkPolicy"] = "gke" }, "fusebox:networkPolicy"},
		"unknown flavour": {func(c map[string]string) { c["fusebox:networkPolicy"] = "calico" }, "fusebox:networkPolicy"},
		"latest AMI": {func(c map[string]string) {
			c["fusebox:nodePool"] = strings.Replace(c["fusebox:nodePool"], `al2023@v20251112`, `al2023@latest`, 1)
		}, "fusebox:nodePool.ec2.amiAlias"},
		"drift budget": {func(c map[string]string) {
			c["fusebox:nodePool"] = strings.Replace(c["fusebox:nodePool"], `"driftBudget":"1"`, `"driftBudget":"all"`, 1)
		}, "fusebox:nodePool.driftBudget"},
		"disruption budget": {func(c map[string]string) {
			c["fusebox:nodePool"] = strings.Replace(c["fusebox:nodePool"], `"disruptionBudget":"20%"`, `"disruptionBudget":"150%"`, 1)
		}, "fusebox:nodePool.disruptionBudget"},
		"no installer":      {func(c map[string]string) { c["fusebox:gvisor"] = `{"version":"20250120"}` }, "fusebox:gvisor.installerImage"},
		"bad pull secret":   {func(c map[string]string) { c["fusebox:imagePullSecrets"] = `["Reg_Cred"]` }, "fusebox:imagePullSecrets"},
		"access, no caller": {func(c map[string]string) { c["fusebox:access"] = `[{"egress":["10.0.0.1:443"]}]` }, "fusebox:access[0]"},
		"access, misspelt":  {func(c map[string]string) { c["fusebox:access"] = `[{"namespace":["agents"]}]` }, "fusebox:access"},
		"access, bad ceiling": {func(c map[string]string) {
			c["fusebox:access"] = `[{"namespaces":["agents"],"egress":["no port"]}]`
		}, "egress"},
		"cilium before enableDefaultDeny": {func(c map[string]string) {
			c["fusebox:cilium"] = `{"install":true,"chart":{"repo":"https://helm.cilium.io","name":"cilium","version":"1.15.7"}}`
		}, "fusebox:cilium.chart.version"},
		"unknown cluster DNS": {func(c map[string]string) { c["fusebox:clusterDNS"] = "coredns" }, "fusebox:clusterDNS"},
		"cloud DNS on eks":    {func(c map[string]string) { c["fusebox:clusterDNS"] = "gke-clouddns" }, "fusebox:clusterDNS"},
		"AKS LocalDNS on eks": {func(c map[string]string) { c["fusebox:clusterDNS"] = "aks-localdns" }, "fusebox:clusterDNS"},
		"node-local, installed cilium": {func(c map[string]string) {
			c["fusebox:clusterDNS"] = "nodelocaldns"
			c["fusebox:cilium"] = `{"install":true,"chart":{"repo":"https://helm.cilium.io","name":"cilium","version":"1.16.5"}}`
		}, "fusebox:clusterDNS"},
		"in VPC, no hosts": {func(c map[string]string) { c["fusebox:inVPC"] = "true" }, "fusebox:privateHosts"},
		"in VPC, public gVisor": {func(c map[string]string) {
			c["fusebox:inVPC"] = "true"
			c["fusebox:privateHosts"] = `["registry.example.com"]`
		}, "fusebox:gvisor.binaryBaseURL"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := base()
			tc.mut(cfg)
			m, err := runStack("eks-dev", cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a configuration error naming %q, got %v", tc.want, err)
			}
			errs[name] = err.Error()
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered despite the bad configuration", n)
			}
		})
	}
}

func TestBadAKSGVisorConfig(t *testing.T) {
	errs := map[string]string{}
	defer func() { mocktest.GoldenJSON(t, filepath.Join("testdata", "config", "aks-errors.json"), errs) }()
	for name, tc := range map[string]struct {
		gvisor string
		want   string
	}{
		"no installer image":  {`{}`, "fusebox:gvisor.installerImage"},
		"installer by tag":    {`{"installerImage":"registry.example.com/i:v1"}`, "fusebox:gvisor.installerImage"},
		"hand-written sha256": {`{"installerImage":"registry.example.com/i@sha256:` + strings.Repeat("c", 64) + `","sha256":{"x86_64":{"runsc":"` + strings.Repeat("a", 64) + `","containerd-shim-runsc-v1":"` + strings.Repeat("b", 64) + `"}}}`, `unknown field "sha256"`},
		"download URL":        {`{"installerImage":"registry.example.com/i@sha256:` + strings.Repeat("c", 64) + `","binaryBaseURL":"https://mirror.example.com/gvisor"}`, "fusebox:gvisor.binaryBaseURL"},
		"release":             {`{"installerImage":"registry.example.com/i@sha256:` + strings.Repeat("c", 64) + `","version":"20250120"}`, "fusebox:gvisor.version"},
		"latest version":      {`{"version":"latest"}`, "fusebox:gvisor.version"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := stackConfig(t, "aks-dev")
			cfg["fusebox:gvisor"] = tc.gvisor
			m, err := runStack("aks-dev", cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "stacks/Pulumi.aks-dev.yaml") {
				t.Fatalf("want a configuration error naming %q and the stack file, got %v", tc.want, err)
			}
			errs[name] = err.Error()
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

// TestGKEPlacement: on GKE the sandbox pods select and tolerate GKE Sandbox's own label and
// taint (sandbox.gke.io/runtime=gvisor), not fusebox's pool, and the program creates no
// RuntimeClass (GKE Sandbox's "gvisor" is used).
func TestGKEPlacement(t *testing.T) {
	m, err := runStack("gke-dev", stackConfig(t, "gke-dev"))
	if err != nil {
		t.Fatal(err)
	}
	var tmpl string
	for _, r := range m.ByType("kubernetes:core/v1:ConfigMap") {
		tmpl += mocktest.Str(r.Props(), "data", "pod.yaml")
	}
	for _, want := range []string{"sandbox.gke.io/runtime: gvisor", "key: sandbox.gke.io/runtime", "runtimeClassName: gvisor"} {
		if !strings.Contains(tmpl, want) {
			t.Errorf("GKE sandbox template lacks %q:\n%s", want, tmpl)
		}
	}
	if strings.Contains(tmpl, "fusebox.dev/pool") {
		t.Errorf("GKE sandbox template selects fusebox's own pool:\n%s", tmpl)
	}
}

// TestInVPC: with inVPC, every host the program renders into any object is a private one, and
// the configuration check finds any that is not before anything is registered.
func TestInVPC(t *testing.T) {
	cfg := stackConfig(t, "eks-prod")
	cfg["fusebox:inVPC"] = "true"
	cfg["fusebox:privateHosts"] = `["127.0.0.1", "registry.example.com", "*.example.com"]`
	m, err := runStack("eks-prod", cfg)
	if err != nil {
		t.Fatalf("in-VPC eks-prod: %v", err)
	}
	// Scan every recorded input for hosts: in URLs and in image references.
	urlRe := regexp.MustCompile(`https?://([a-zA-Z0-9.-]+)`)
	imageRe := regexp.MustCompile(`(?:^|[\s'"=])([a-z0-9.-]+\.[a-z0-9]+)(?::[0-9]+)?/[^\s'"]*@sha256:[0-9a-f]{64}`)
	found := 0
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			for _, re := range []*regexp.Regexp{urlRe, imageRe} {
				for _, mm := range re.FindAllStringSubmatch(v, -1) {
					found++
					if h := mm[1]; h != "127.0.0.1" && h != "registry.example.com" && !strings.HasSuffix(h, ".example.com") {
						t.Errorf("a rendered object names public host %s: %.160q", h, v)
					}
				}
			}
		}
	}
	for _, r := range m.All() {
		walk(r.Props())
	}
	if found < 3 {
		t.Fatalf("%d hosts found in the rendered objects: the scan is broken", found)
	}
	// The same stack naming a public mirror is refused, naming the key.
	cfg["fusebox:gvisor"] = strings.Replace(cfg["fusebox:gvisor"], "https://mirror.example.com", "https://storage.googleapis.com", 1)
	m, err = runStack("eks-prod", cfg)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "fusebox:gvisor.binaryBaseURL") || !strings.Contains(err.Error(), "storage.googleapis.com") {
		t.Fatalf("public gVisor download with inVPC: %v", err)
	}
	if len(m.All()) != 0 {
		t.Errorf("%d resources registered", len(m.All()))
	}
}

// TestAccessPolicy: the manager's authorisation policy is the stack's fusebox:access, and
// without one every ServiceAccount of the agents' namespaces may allocate, with no egress.
func TestAccessPolicy(t *testing.T) {
	policy := func(cfg map[string]string) string {
		t.Helper()
		m, err := runStack("eks-dev", cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range m.ByType("kubernetes:core/v1:ConfigMap") {
			if p := mocktest.Str(r.Props(), "data", manager.PolicyKey); p != "" {
				return p
			}
		}
		t.Fatal("no ConfigMap holds the manager's policy")
		return ""
	}
	if got := policy(stackConfig(t, "eks-dev")); !strings.Contains(got, "namespaces:\n  - agents") || strings.Contains(got, "egress") {
		t.Errorf("default policy:\n%s\nwant the agents namespace, no egress", got)
	}
	cfg := stackConfig(t, "eks-dev")
	cfg["fusebox:access"] = `[{"serviceAccounts":["agents/coder"],"templates":["default"],"egress":["10.1.2.3:443"]}]`
	cfg["fusebox:operators"] = `["ops/auditor"]`
	got := policy(cfg)
	for _, want := range []string{"agents/coder", "10.1.2.3:443", "ops/auditor"} {
		if !strings.Contains(got, want) {
			t.Errorf("policy:\n%s\nwant %s in it", got, want)
		}
	}
}

// TestImagePullSecrets reach the manager's and the sandboxes' pods and the node installer's.
func TestImagePullSecrets(t *testing.T) {
	cfg := stackConfig(t, "eks-dev")
	cfg["fusebox:imagePullSecrets"] = `["regcred"]`
	m, err := runStack("eks-dev", cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{deploymentType, daemonSetType} {
		if s := mocktest.Str(m.One(t, typ).Props(), "spec", "template", "spec", "imagePullSecrets", 0, "name"); s != "regcred" {
			t.Errorf("%s imagePullSecrets %q", typ, s)
		}
	}
	var tmpl string
	for _, r := range m.ByType("kubernetes:core/v1:ConfigMap") {
		tmpl += mocktest.Str(r.Props(), "data", "pod.yaml")
	}
	if !strings.Contains(tmpl, "imagePullSecrets:\n  - name: regcred") {
		t.Errorf("sandbox template lacks the pull secret:\n%s", tmpl)
	}
}

// TestLoadStackFileMatchesProgram: the CLI's preflight reads the same configuration the
// program does.
func TestLoadStackFileMatchesProgram(t *testing.T) {
	for _, stack := range []string{"eks-dev", "gke-dev", "aks-dev", "local"} {
		c, err := LoadStackFile(releasedCopy(t, filepath.Join("..", "stacks", "Pulumi."+stack+".yaml")), stack)
		if err != nil {
			t.Fatalf("%s: %v", stack, err)
		}
		p := c.Preflight(stack)
		if p.Name != stack || p.Flavour == "" || p.SandboxNamespace != "fusebox-sandboxes" {
			t.Errorf("%s: preflight stack %+v", stack, p)
		}
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

// TestDestroyRemovesSandboxesBeforePolicies: Pulumi destroys in reverse dependency order, so
// the manager's Deployment, which waits for every object that confines the sandboxes (the
// sandbox namespace's network policies, the admission policy and its binding, the runtime),
// is destroyed before any of them; and it carries the finalizer its managers remove only once
// every sandbox pod is gone (test/kube TestDeletingTheManagerRemovesEverySandboxFirst), so
// no sandbox outlives a policy. Also with namespaces the stack does not create, where no
// namespace deletion would remove the sandboxes.
func TestDestroyRemovesSandboxesBeforePolicies(t *testing.T) {
	for _, stack := range []string{"eks-dev", "gke-dev", "aks-dev", "local"} {
		for _, create := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/create=%v", stack, create), func(t *testing.T) {
				cfg := stackConfig(t, stack)
				if !create {
					cfg["fusebox:namespaces"] = `{"manager":"fusebox","sandbox":"fusebox-sandboxes","create":false}`
				}
				m, err := runStack(stack, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if n := len(m.ByType("kubernetes:core/v1:Namespace")); (n == 2) != create {
					t.Fatalf("%d namespaces with create %v", n, create)
				}
				d := m.One(t, deploymentType)
				if f := mocktest.Dig(d.Props(), "metadata", "finalizers", 0); f != manager.RemovalFinalizer {
					t.Errorf("manager Deployment finalizers %v", mocktest.Dig(d.Props(), "metadata", "finalizers"))
				}
				confining := 0
				for _, r := range m.All() {
					switch r.Type {
					case cnpType, npType, vapType, vapBindingType, runtimeClassType, daemonSetType:
						confining++
						if !slices.ContainsFunc(d.Deps, func(urn string) bool { return strings.HasSuffix(urn, "$"+r.Type+"::"+r.Name) }) {
							t.Errorf("the manager Deployment is not destroyed before %s %s", r.Type, r.Name)
						}
					}
				}
				if confining < 5 {
					t.Errorf("only %d policies, admission objects and runtime found", confining)
				}
			})
		}
	}
}

// TestManagerAPIKeys: the stack's manager.tlsSecret (a cert-manager Secret), tokenAudience and
// externalNames reach the manager: its flags, the RBAC of the Secret it reads, the audience
// it exports, and the names its own certificate covers.
func TestManagerAPIKeys(t *testing.T) {
	flags := func(t *testing.T, manager string) (*mocktest.Mocks, []string) {
		t.Helper()
		cfg := stackConfig(t, "eks-dev")
		cfg["fusebox:manager"] = manager
		m, err := runStack("eks-dev", cfg)
		if err != nil {
			t.Fatal(err)
		}
		var argv []string
		for _, a := range mocktest.Dig(m.One(t, deploymentType).Props(), "spec", "template", "spec", "containers", 0, "args").([]any) {
			argv = append(argv, a.(string))
		}
		return m, argv
	}
	has := func(t *testing.T, argv []string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !slices.Contains(argv, w) {
				t.Errorf("manager args %v lack %s", argv, w)
			}
		}
	}
	t.Run("cert-manager", func(t *testing.T) {
		m, argv := flags(t, `{"tlsSecret":"manager-cert","tokenAudience":"agents.example.com"}`)
		has(t, argv, "--tls-secret=manager-cert", "--tls-secret-create=false", "--token-audience=agents.example.com")
		found := false
		for _, r := range m.ByType("kubernetes:rbac.authorization.k8s.io/v1:Role") {
			for _, ru := range mocktest.Dig(r.Props(), "rules").([]any) {
				if fmt.Sprint(mocktest.Dig(ru, "resources")) == "[secrets]" && fmt.Sprint(mocktest.Dig(ru, "resourceNames")) == "[manager-cert]" {
					found = true
				}
			}
		}
		if !found {
			t.Error("the manager may not read its Secret manager-cert")
		}
	})
	t.Run("external names", func(t *testing.T) {
		_, argv := flags(t, `{"serviceType":"LoadBalancer","externalNames":["manager.example.com","203.0.113.7"]}`)
		has(t, argv, "--tls-secret=fusebox-manager-tls", "--tls-secret-create=true", "--token-audience=fusebox-manager",
			"--tls-dns-names=fusebox-manager,fusebox-manager.fusebox-system,fusebox-manager.fusebox-system.svc,fusebox-manager.fusebox-system.svc.cluster.local,manager.example.com,203.0.113.7")
	})
}

// TestTemplates: the stack's fusebox:templates (a list in the templates file's schema) reach
// the manager as its templates file; an invalid one, or one a cluster cannot honour, is
// refused naming the key and the template; with inVPC, a template's registry is checked like
// every other image's.
func TestTemplates(t *testing.T) {
	img := "registry.example.com/team/py@sha256:" + strings.Repeat("a", 64)
	cfg := stackConfig(t, "eks-dev")
	cfg["fusebox:templates"] = `[{"name":"py","image":"` + img + `","env":{"A":"1"},"pool":{"min":1,"max":2}}]`
	m, err := runStack("eks-dev", cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := ""
	for _, r := range m.ByType("kubernetes:core/v1:ConfigMap") {
		if f := mocktest.Str(r.Props(), "data", manager.TemplatesKey); f != "" {
			file = f
		}
	}
	if !strings.Contains(file, "name: py") || !strings.Contains(file, img) {
		t.Fatalf("the manager's templates file:\n%s", file)
	}
	for name, tc := range map[string]struct{ value, want string }{
		"tag":    {`[{"name":"py","image":"registry.example.com/team/py:3"}]`, "fusebox:templates[0] (py): image"},
		"pids":   {`[{"name":"py","image":"` + img + `","limits":{"pids":64}}]`, "template py: limits.pids"},
		"field":  {`[{"name":"py","image":"` + img + `","limit":{}}]`, `unknown field "limit"`},
		"object": {`{"name":"py"}`, "fusebox:templates"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := stackConfig(t, "eks-dev")
			cfg["fusebox:templates"] = tc.value
			m, err := runStack("eks-dev", cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s: %v, want an error saying %q", tc.value, err, tc.want)
			}
			if len(m.All()) != 0 {
				t.Errorf("%d resources registered", len(m.All()))
			}
		})
	}
	cfg = stackConfig(t, "eks-prod")
	cfg["fusebox:inVPC"] = "true"
	cfg["fusebox:privateHosts"] = `["127.0.0.1", "registry.example.com", "*.example.com"]`
	cfg["fusebox:templates"] = `[{"name":"py","image":"ghcr.io/team/py@sha256:` + strings.Repeat("a", 64) + `"}]`
	if _, err := runStack("eks-prod", cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "fusebox:templates[0].image") || !strings.Contains(err.Error(), "ghcr.io") {
		t.Fatalf("a public template registry with inVPC: %v", err)
	}
}
