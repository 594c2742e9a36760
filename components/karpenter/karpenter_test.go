package karpenter

import (
	"errors"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	nodePoolType = "kubernetes:karpenter.sh/v1:NodePool"
	ec2Type      = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
	aksType      = "kubernetes:karpenter.azure.com/v1beta1:AKSNodeClass"
)

func eksArgs() *KarpenterArgs {
	return &KarpenterArgs{
		Cloud: components.EKS, Name: "fusebox-sandbox", CPULimit: "64", MemoryLimit: "256Gi",
		EC2: &EC2Args{
			Role:                      "KarpenterNodeRole-x",
			AMIAlias:                  "al2023@v20251112",
			SubnetSelectorTags:        map[string]string{"karpenter.sh/discovery": "x"},
			SecurityGroupSelectorTags: map[string]string{"karpenter.sh/discovery": "x"},
			UserData:                  "MIME-Version: 1.0\n...io.containerd.cri.v1.runtime...",
		},
	}
}

func run(t *testing.T, args *KarpenterArgs) (*mocktest.Mocks, map[string]string) {
	t.Helper()
	out := map[string]string{}
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		k, err := NewKarpenter(ctx, "fb", args)
		if err != nil {
			return err
		}
		for key, o := range map[string]pulumi.StringOutput{"pool": k.NodePoolName, "kind": k.NodeClassKind, "gke": k.GKENodePool} {
			if out[key], err = mocktest.Await[string](ctx, o); err != nil {
				return err
			}
		}
		return nil
	})
	m.One(t, Type)
	m.AssertParented(t, Type)
	return m, out
}

// checkStartupTaints checks the NodePool's startup taints: the gVisor-not-ready taint when
// wantGVisor (AKS, where a DaemonSet installs runsc after the node joins), none otherwise.
func checkStartupTaints(t *testing.T, m *mocktest.Mocks, wantGVisor bool) {
	t.Helper()
	st := mocktest.Dig(m.One(t, nodePoolType).Props(), "spec", "template", "spec", "startupTaints")
	if !wantGVisor {
		if st != nil {
			t.Errorf("startupTaints %v, want none", st)
		}
		return
	}
	taints, _ := st.([]any)
	if len(taints) != 1 || mocktest.Str(taints[0], "key") != StartupTaintKey || StartupTaintKey != "fusebox.dev/gvisor-not-ready" ||
		mocktest.Str(taints[0], "effect") != "NoSchedule" || mocktest.Dig(taints[0], "value") != nil {
		t.Errorf("startupTaints %v, want only %s:NoSchedule", st, StartupTaintKey)
	}
}

func checkNodePool(t *testing.T, m *mocktest.Mocks, group, kind string) {
	t.Helper()
	np := m.One(t, nodePoolType)
	p := np.Props()
	if np.Name != "fb-nodepool" || mocktest.Str(p, "metadata", "name") != "fusebox-sandbox" {
		t.Errorf("NodePool %s %v", np.Name, mocktest.Dig(p, "metadata"))
	}
	tmpl := mocktest.Dig(p, "spec", "template")
	if got := mocktest.Str(tmpl, "metadata", "labels", "fusebox.dev/pool"); got != "sandbox" {
		t.Errorf("pool label %q", got)
	}
	taints, _ := mocktest.Dig(tmpl, "spec", "taints").([]any)
	if len(taints) != 1 || mocktest.Str(taints[0], "key") != "fusebox.dev/sandbox" ||
		mocktest.Str(taints[0], "value") != "true" || mocktest.Str(taints[0], "effect") != "NoSchedule" {
		t.Errorf("taints %v", taints)
	}
	ref := mocktest.Dig(tmpl, "spec", "nodeClassRef")
	if mocktest.Str(ref, "group") != group || mocktest.Str(ref, "kind") != kind || mocktest.Str(ref, "name") != "fusebox-sandbox" {
		t.Errorf("nodeClassRef %v", ref)
	}
	if mocktest.Str(p, "spec", "limits", "cpu") != "64" || mocktest.Str(p, "spec", "limits", "memory") != "256Gi" {
		t.Errorf("limits %v", mocktest.Dig(p, "spec", "limits"))
	}
	checkDisruption(t, p, "10%", "1")
	if reqs, _ := mocktest.Dig(tmpl, "spec", "requirements").([]any); len(reqs) == 0 {
		t.Errorf("no requirements")
	}
}

// checkDisruption: sandbox nodes are removed only when empty, never packed (consolidation
// would evict live sandboxes), and drift replaces at most drift nodes at once, so a
// gvisor.version or AMI promotion does not drain the pool wholesale. Karpenter applies the
// most restrictive budget, a budget without reasons to every reason
// (karpenter.sh/v1 NodePool spec.disruption; docs: concepts/disruption, "NodePool Disruption
// Budgets"). No terminationGracePeriod: with one, Karpenter drifts nodes whose pods carry
// karpenter.sh/do-not-disrupt once it elapses (docs: reference/annotations).
func checkDisruption(t *testing.T, nodePool any, all, drift string) {
	t.Helper()
	d := mocktest.Dig(nodePool, "spec", "disruption")
	if mocktest.Str(d, "consolidationPolicy") != "WhenEmpty" || mocktest.Str(d, "consolidateAfter") == "" {
		t.Errorf("consolidation %v, want WhenEmpty", d)
	}
	budgets, _ := mocktest.Dig(d, "budgets").([]any)
	if len(budgets) != 2 || mocktest.Str(budgets[0], "nodes") != all || mocktest.Dig(budgets[0], "reasons") != nil ||
		mocktest.Str(budgets[1], "nodes") != drift || mocktest.Str(budgets[1], "reasons", 0) != "Drifted" ||
		len(mocktest.Dig(budgets[1], "reasons").([]any)) != 1 {
		t.Errorf("budgets %v, want {nodes: %s} and {nodes: %s, reasons: [Drifted]}", budgets, all, drift)
	}
	if tgp := mocktest.Dig(nodePool, "spec", "template", "spec", "terminationGracePeriod"); tgp != nil {
		t.Errorf("terminationGracePeriod %v: Karpenter would then drift nodes with bound sandboxes", tgp)
	}
}

func TestDisruptionSettings(t *testing.T) {
	a := eksArgs()
	a.DisruptionBudget, a.DriftBudget, a.ConsolidateAfter = "20%", "2", "10m"
	m, _ := run(t, a)
	p := m.One(t, nodePoolType).Props()
	checkDisruption(t, p, "20%", "2")
	if got := mocktest.Str(p, "spec", "disruption", "consolidateAfter"); got != "10m" {
		t.Errorf("consolidateAfter %q", got)
	}
}

func TestRefusesBadBudgets(t *testing.T) {
	refuses(t, ErrBadBudget, map[string]func(*KarpenterArgs){
		"percent over 100": func(a *KarpenterArgs) { a.DisruptionBudget = "120%" },
		"not a count":      func(a *KarpenterArgs) { a.DriftBudget = "one" },
		"negative":         func(a *KarpenterArgs) { a.DriftBudget = "-1" },
		"fraction percent": func(a *KarpenterArgs) { a.DisruptionBudget = "2.5%" },
	})
	for _, ok := range []string{"0", "1", "10%", "100%", "0%"} {
		if err := ValidateBudget(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

func TestEKS(t *testing.T) {
	m, out := run(t, eksArgs())
	checkNodePool(t, m, "karpenter.k8s.aws", "EC2NodeClass")
	// The userData installs runsc before the kubelet starts; the verify-only installer removes
	// the startup taint once containerd has it registered.
	checkStartupTaints(t, m, true)
	if len(m.ByType(aksType)) != 0 {
		t.Error("AKSNodeClass on EKS")
	}
	nc := m.One(t, ec2Type)
	p := nc.Props()
	if nc.Name != "fb-nodeclass" || mocktest.Str(p, "metadata", "name") != "fusebox-sandbox" {
		t.Errorf("EC2NodeClass %s", nc.Name)
	}
	if ud := mocktest.Str(p, "spec", "userData"); !strings.Contains(ud, "io.containerd.cri.v1.runtime") {
		t.Errorf("userData %q", ud)
	}
	if mocktest.Str(p, "spec", "amiSelectorTerms", 0, "alias") != "al2023@v20251112" || mocktest.Str(p, "spec", "role") != "KarpenterNodeRole-x" {
		t.Errorf("spec %v", mocktest.Dig(p, "spec"))
	}
	if hop := mocktest.Dig(p, "spec", "metadataOptions", "httpPutResponseHopLimit"); hop != 1.0 ||
		mocktest.Str(p, "spec", "metadataOptions", "httpTokens") != "required" {
		t.Errorf("metadataOptions %v", mocktest.Dig(p, "spec", "metadataOptions"))
	}
	if out["pool"] != "fusebox-sandbox" || out["kind"] != "EC2NodeClass" || out["gke"] != "" {
		t.Errorf("outputs %v", out)
	}
}

func TestAKS(t *testing.T) {
	m, out := run(t, &KarpenterArgs{Cloud: components.AKS, Name: "fusebox-sandbox", CPULimit: "64", MemoryLimit: "256Gi",
		AKS: &AKSArgs{OSDiskSizeGB: 128}})
	checkNodePool(t, m, "karpenter.azure.com", "AKSNodeClass")
	checkStartupTaints(t, m, true)
	if len(m.ByType(ec2Type)) != 0 {
		t.Error("EC2NodeClass on AKS")
	}
	p := m.One(t, aksType).Props()
	if mocktest.Str(p, "spec", "imageFamily") != "AzureLinux" || mocktest.Dig(p, "spec", "osDiskSizeGB") != 128.0 {
		t.Errorf("AKSNodeClass spec %v", mocktest.Dig(p, "spec"))
	}
	if out["kind"] != "AKSNodeClass" {
		t.Errorf("outputs %v", out)
	}
}

func TestGKEAndLocalCreateNothing(t *testing.T) {
	for _, cloud := range []components.Cloud{components.GKE, components.Local} {
		t.Run(string(cloud), func(t *testing.T) {
			m, out := run(t, &KarpenterArgs{Cloud: cloud, GKENodePool: "sbx"})
			if n := len(m.All()); n != 1 {
				t.Fatalf("want only the component, got %d resources", n)
			}
			if out["pool"] != "" || out["kind"] != "" {
				t.Errorf("outputs %v", out)
			}
			if cloud == components.GKE && !strings.Contains(out["gke"], `"sbx"`) {
				t.Errorf("gke output %q", out["gke"])
			}
		})
	}
}

func TestRefusesIncompleteSettings(t *testing.T) {
	refuses(t, ErrMissingSetting, map[string]func(*KarpenterArgs){
		"no limits":   func(a *KarpenterArgs) { a.CPULimit = "" },
		"no ec2":      func(a *KarpenterArgs) { a.EC2 = nil },
		"no role":     func(a *KarpenterArgs) { a.EC2.Role = "" },
		"no userData": func(a *KarpenterArgs) { a.EC2.UserData = "" },
		"no subnets":  func(a *KarpenterArgs) { a.EC2.SubnetSelectorTags = nil },
	})
}

// refuses checks that NewKarpenter fails with want on eksArgs changed by each mutation.
func refuses(t *testing.T, want error, mutations map[string]func(*KarpenterArgs)) {
	t.Helper()
	for name, mut := range mutations {
		t.Run(name, func(t *testing.T) {
			a := eksArgs()
			mut(a)
			_, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewKarpenter(ctx, "fb", a)
				return err
			})
			if !errors.Is(err, want) {
				t.Fatalf("want %v, got %v", want, err)
			}
		})
	}
}

func TestEKSRefusesUnpinnedAMI(t *testing.T) {
	ami := func(alias, id string) func(*KarpenterArgs) {
		return func(a *KarpenterArgs) { a.EC2.AMIAlias, a.EC2.AMIID = alias, id }
	}
	refuses(t, ErrUnpinnedAMI, map[string]func(*KarpenterArgs){
		"latest": ami("al2023@latest", ""), "none": ami("", ""), "both": ami("al2023@v20251112", "ami-0123456789abcdef0"),
		"not al2023": ami("bottlerocket@v1.2.3", ""), "bad id": ami("", "ami-xyz"),
	})
	a := eksArgs()
	a.EC2.AMIAlias, a.EC2.AMIID = "", "ami-0123456789abcdef0"
	m, _ := run(t, a)
	if id := mocktest.Str(m.One(t, ec2Type).Props(), "spec", "amiSelectorTerms", 0, "id"); id != "ami-0123456789abcdef0" {
		t.Errorf("AMI id %q", id)
	}
}
