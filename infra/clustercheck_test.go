package infra

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/infra/preflight"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// fakeCluster is an API server (client-go's fake clientset) holding objs, read as preflight
// reads a real one.
func fakeCluster(objs ...runtime.Object) ClusterFunc {
	cl := preflight.FromClients(fake.NewClientset(objs...))
	return func(*pulumi.Context) (preflight.Cluster, error) { return cl, nil }
}

// readyNode is a Ready node with labels.
func readyNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

var sandboxLabel = map[string]string{components.SandboxPoolLabelKey: components.SandboxPoolLabelValue}

// runProgram runs NewProgram(cluster) on stack under mocks, as a preview when dryRun.
func runProgram(stack string, cfg map[string]string, cluster ClusterFunc, dryRun bool) (*mocktest.Mocks, error) {
	return mocktest.Run(NewProgram(cluster), mocktest.WithConfig(cfg), func(info *pulumi.RunInfo) {
		info.Stack, info.DryRun = stack, dryRun
	})
}

// TestProgramRunsPreflight: the program that `pulumi up` runs refuses what `fusebox up`
// refuses, before it registers any resource: the local stack on a cluster without a node
// labelled fusebox.dev/pool=sandbox, in the update and in the preview.
func TestProgramRunsPreflight(t *testing.T) {
	cfg := stackConfig(t, "local")
	for _, dryRun := range []bool{false, true} {
		m, err := runProgram("local", cfg, fakeCluster(readyNode("node-1", nil)), dryRun)
		if !errors.Is(err, preflight.ErrRefused) || !strings.Contains(err.Error(), "kubectl label node NODE fusebox.dev/pool=sandbox") {
			t.Fatalf("dry run %t: %v, want preflight's refusal naming the label", dryRun, err)
		}
		if n := len(m.All()); n != 0 {
			t.Errorf("dry run %t: %d resources registered before the refusal", dryRun, n)
		}
	}
	m, err := runProgram("local", cfg, fakeCluster(readyNode("node-1", sandboxLabel)), false)
	if err != nil {
		t.Fatalf("a cluster preflight accepts: %v", err)
	}
	if len(m.All()) < 10 {
		t.Errorf("only %d resources registered", len(m.All()))
	}
}

// TestProgramWithoutCluster: a cluster preflight cannot read fails the update, and is only a
// warning in a preview (which needs no cluster); Program under mocks has none and skips.
func TestProgramWithoutCluster(t *testing.T) {
	cfg := stackConfig(t, "local")
	unreachable := func(*pulumi.Context) (preflight.Cluster, error) {
		return preflight.Cluster{}, errors.New("dial tcp 127.0.0.1:6443: connection refused")
	}
	_, err := runProgram("local", cfg, unreachable, false)
	if err == nil || errors.Is(err, preflight.ErrRefused) || !strings.Contains(err.Error(), "preflight of stack local") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("update without a cluster: %v, want preflight's read error", err)
	}
	if _, err := runProgram("local", cfg, unreachable, true); err != nil {
		t.Errorf("preview without a cluster: %v, want a warning only", err)
	}
	// Checked by the caller (fusebox up): the update goes on without reading a cluster.
	checked := func(*pulumi.Context) (preflight.Cluster, error) { return preflight.Cluster{}, ErrChecked }
	if m, err := runProgram("local", cfg, checked, false); err != nil || len(m.All()) < 10 {
		t.Errorf("update after the caller's preflight: %v", err)
	}
	if _, err := runStack("local", cfg); err != nil {
		t.Errorf("Program under mocks: %v", err)
	}
	if _, err := KubeconfigCluster(mustContext(t)); !errors.Is(err, ErrNoCluster) {
		t.Errorf("KubeconfigCluster under mocks: %v, want ErrNoCluster", err)
	}
}

// mustContext is a mocked program's context.
func mustContext(t *testing.T) *pulumi.Context {
	t.Helper()
	var got *pulumi.Context
	if _, err := mocktest.Run(func(ctx *pulumi.Context) error { got = ctx; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestManagerRollout: preflight's rollout check assumes the manager Deployment the program
// renders: maxSurge managerMaxSurge, maxUnavailable 0, eks-prod's 3 replicas with required
// anti-affinity; and eks-prod on three nodes the manager can run on is refused.
func TestManagerRollout(t *testing.T) {
	cfg := stackConfig(t, "eks-prod")
	m, err := runStack("eks-prod", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mgr map[string]any
	for _, d := range m.ByType(deploymentType) {
		if strings.HasSuffix(d.Parent, "::"+manager.Type+"::fusebox") {
			mgr = d.Props()
		}
	}
	ru := mocktest.Dig(mgr, "spec", "strategy", "rollingUpdate")
	if fmtNum(mocktest.Dig(ru, "maxSurge")) != managerMaxSurge || fmtNum(mocktest.Dig(ru, "maxUnavailable")) != 0 {
		t.Fatalf("manager rollout %v: preflight assumes maxSurge %d, maxUnavailable 0", ru, managerMaxSurge)
	}
	c, err := loadConfig(fileConfig(cfg), "eks-prod")
	if err != nil {
		t.Fatal(err)
	}
	r := c.Preflight("eks-prod").Manager
	if want := (preflight.Rollout{Replicas: 3, RequiredAntiAffinity: true, MaxSurge: 1}); r != want {
		t.Fatalf("rollout %+v, want %+v", r, want)
	}
	if mocktest.Dig(mgr, "spec", "template", "spec", "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution") == nil {
		t.Error("eks-prod's manager has no required anti-affinity")
	}
	objs := []runtime.Object{readyNode("a", nil), readyNode("b", nil), readyNode("c", nil)}
	s := c.Preflight("eks-prod")
	s.Flavour = sandboxnet.Kubernetes // the rollout alone
	cl, _ := fakeCluster(objs...)(nil)
	err = preflight.Check(context.Background(), s, cl)
	if !errors.Is(err, preflight.ErrRefused) || !strings.Contains(err.Error(), "need 4 nodes the manager can run on") {
		t.Errorf("eks-prod on 3 nodes: %v", err)
	}
	s.Manager.NodesAutoscaled = true
	if err := preflight.Check(context.Background(), s, cl); err != nil {
		t.Errorf("eks-prod on 3 nodes with a node autoscaler: %v", err)
	}
	// skipAwait (test control planes that run no manager pod): up does not wait for the
	// rollout, so preflight counts no node.
	c.Manager.SkipAwait = true
	if r := c.Preflight("eks-prod").Manager; r != (preflight.Rollout{}) {
		t.Errorf("skipAwait: rollout %+v checked", r)
	}
}

// fmtNum reads a rendered integer (JSON numbers decode as float64).
func fmtNum(v any) int {
	switch n := v.(type) {
	case float64:
		return int(n)
	case int:
		return n
	}
	return -1
}

// TestClusterDNSConfig: fusebox:clusterDNS reaches preflight and the policies' network.
func TestClusterDNSConfig(t *testing.T) {
	cfg := stackConfig(t, "gke-dev")
	cfg["fusebox:clusterDNS"] = "gke-clouddns"
	c, err := loadConfig(fileConfig(cfg), "gke-dev")
	if err != nil {
		t.Fatal(err)
	}
	if c.ClusterDNS != sandboxnet.GKECloudDNS || c.Preflight("gke-dev").ClusterDNS != sandboxnet.GKECloudDNS || sandboxNetwork(c).DNS != sandboxnet.GKECloudDNS {
		t.Errorf("cluster DNS %q, preflight %q, network %q", c.ClusterDNS, c.Preflight("gke-dev").ClusterDNS, sandboxNetwork(c).DNS)
	}
	m, err := runStack("gke-dev", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if args := managerArgv(m); !slices.Contains(args, "--cluster-dns=gke-clouddns") {
		t.Errorf("manager args %v lack --cluster-dns=gke-clouddns", args)
	}
	cfg["fusebox:clusterDNS"] = "kube-dns"
	if c, err := loadConfig(fileConfig(cfg), "gke-dev"); err != nil || c.ClusterDNS != sandboxnet.KubeDNS {
		t.Errorf("kube-dns: %v, %v", c.ClusterDNS, err)
	}
	if m, err = runStack("gke-dev", cfg); err != nil {
		t.Fatal(err)
	}
	if args := managerArgv(m); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--cluster-dns") }) {
		t.Errorf("kube-dns, the manager's default, passed: %v", args)
	}
}

// managerArgv is the manager container's arguments.
func managerArgv(m *mocktest.Mocks) []string {
	var out []string
	for _, d := range m.ByType(deploymentType) {
		if !strings.HasSuffix(d.Parent, "::"+manager.Type+"::fusebox") {
			continue
		}
		args, _ := mocktest.Dig(d.Props(), "spec", "template", "spec", "containers", 0, "args").([]any)
		for _, a := range args {
			s, _ := a.(string)
			out = append(out, s)
		}
	}
	return out
}
