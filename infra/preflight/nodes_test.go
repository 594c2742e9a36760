package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// gkeRuntimeClass is GKE Sandbox's RuntimeClass.
func gkeRuntimeClass() *nodev1.RuntimeClass {
	return &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "gvisor"}
}

// k8sNode is a node with labels and taints, Ready unless notReady.
func k8sNode(name string, labels map[string]string, notReady bool, taints ...corev1.Taint) *corev1.Node {
	status := corev1.ConditionTrue
	if notReady {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}},
	}
}

// sandboxNode is a Ready node labelled fusebox.dev/pool=sandbox, untainted.
func sandboxNode(name string) *corev1.Node {
	return k8sNode(name, map[string]string{components.SandboxPoolLabelKey: components.SandboxPoolLabelValue}, false)
}

// refusal runs Check and returns its refusal ("" when it accepts); a read error fails t.
func refusal(t *testing.T, s Stack, c Cluster) string {
	t.Helper()
	err := Check(context.Background(), s, c)
	if err != nil && !errors.Is(err, ErrRefused) {
		t.Fatalf("read error: %v", err)
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestSandboxNodeLabel: on local, a stack whose cluster has no Ready, schedulable node
// labelled fusebox.dev/pool=sandbox is refused, naming the label and the kubectl command.
func TestSandboxNodeLabel(t *testing.T) {
	local := stack(components.Local, sandboxnet.Kubernetes)
	cordoned := sandboxNode("node-2")
	cordoned.Spec.Unschedulable = true
	for name, tc := range map[string]struct {
		cluster Cluster
		want    []string
	}{
		"no node":          {cluster(nil), []string{"no node is labelled fusebox.dev/pool=sandbox", "kubectl label node NODE fusebox.dev/pool=sandbox", "stacks/Pulumi.local-dev.yaml"}},
		"unlabelled nodes": {cluster(nil, k8sNode("node-1", map[string]string{"other": "x"}, false)), []string{"no node is labelled fusebox.dev/pool=sandbox"}},
		"labelled, not ready or cordoned": {cluster(nil, k8sNode("node-1", sandboxNode("x").Labels, true), cordoned),
			[]string{"no node labelled fusebox.dev/pool=sandbox is Ready and schedulable (node-1, node-2)", "kubectl label node NODE fusebox.dev/pool=sandbox"}},
		"labelled":          {cluster(nil, sandboxNode("node-1")), nil},
		"labelled, tainted": {cluster(nil, k8sNode("node-1", sandboxNode("x").Labels, false, corev1.Taint{Key: components.SandboxTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule})), nil},
	} {
		t.Run(name, func(t *testing.T) {
			got := refusal(t, local, tc.cluster)
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("refused: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("refusal lacks %q:\n%s", w, got)
				}
			}
		})
	}
	// Elsewhere the node pool labels its nodes.
	if got := refusal(t, stack(components.GKE, sandboxnet.GKE), cluster(gkeAPI, gkeRuntimeClass())); got != "" {
		t.Errorf("gke refused: %s", got)
	}
}

// TestRollout: eks-prod's manager (3 replicas, required anti-affinity, maxSurge 1 with
// maxUnavailable 0) needs four nodes it can run on; preferred anti-affinity needs one; a node
// autoscaler adds them.
func TestRollout(t *testing.T) {
	prod := Rollout{Replicas: 3, RequiredAntiAffinity: true, MaxSurge: 1}
	nodes := func(n int, extra ...*corev1.Node) Cluster {
		objs := []runtime.Object{}
		for i := range n {
			objs = append(objs, k8sNode("node-"+string(rune('a'+i)), nil, false))
		}
		for _, e := range extra {
			objs = append(objs, e)
		}
		return cluster(ciliumAPI, append(objs, ciliumConfig(goodCilium), ciliumAgent("v1.17.0"))...)
	}
	ineligible := []*corev1.Node{
		k8sNode("control-plane", nil, false, corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}),
		k8sNode("sandbox", nil, false, corev1.Taint{Key: components.SandboxTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}),
		k8sNode("draining", nil, false, corev1.Taint{Key: "example.com/drain", Effect: corev1.TaintEffectNoExecute}),
		k8sNode("not-ready", nil, true),
		func() *corev1.Node { n := k8sNode("cordoned", nil, false); n.Spec.Unschedulable = true; return n }(),
	}
	soft := prod
	soft.RequiredAntiAffinity = false
	autoscaled := prod
	autoscaled.NodesAutoscaled = true
	for name, tc := range map[string]struct {
		r       Rollout
		cluster Cluster
		want    []string
	}{
		"prod on 3 nodes":             {prod, nodes(3, ineligible...), []string{"fusebox:manager.replicas 3 with requiredAntiAffinity", "need 4 nodes the manager can run on", "the cluster has 3 (node-a, node-b, node-c)", "fusebox:manager.nodesAutoscaled: true", "stacks/Pulumi.eks-dev.yaml"}},
		"prod on 4 nodes":             {prod, nodes(4), nil},
		"prod, autoscaled, no node":   {autoscaled, nodes(0), nil},
		"preferred on 1 node":         {soft, nodes(1), nil},
		"preferred on no usable node": {soft, nodes(0, ineligible...), []string{"the manager needs a node it can run on", "the cluster has 0 (none)"}},
		"not checked":                 {Rollout{}, nodes(0), nil},
	} {
		t.Run(name, func(t *testing.T) {
			s := stack(components.EKS, sandboxnet.Cilium)
			s.Manager = tc.r
			got := refusal(t, s, tc.cluster)
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("refused: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("refusal lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
