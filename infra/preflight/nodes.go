package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
)

// Node is what the checks read of a node.
type Node struct {
	Name string
	// Ready: its Ready condition is True. Unschedulable: cordoned.
	Ready, Unschedulable bool
	// Taints are its taints' "key=value:Effect" (or "key:Effect").
	Taints []string
}

// Taint formats a taint as Node.Taints holds it.
func Taint(key, value, effect string) string {
	if value == "" {
		return key + ":" + effect
	}
	return key + "=" + value + ":" + effect
}

// sandboxNodeSelector selects the nodes sandbox pods are placed on (the manager's sandbox
// template, components/manager SandboxPoolPlacement).
var sandboxNodeSelector = components.SandboxPoolLabelKey + "=" + components.SandboxPoolLabelValue

// sandboxNodeProblems: on local, no node pool labels nodes, so sandbox pods (which select
// fusebox.dev/pool=sandbox) stay Pending, and `up` times out on the manager, unless the
// operator labelled the nodes that run runsc. Elsewhere the sandbox node pool labels its
// nodes (Karpenter's NodePool template, GKE Sandbox).
func sandboxNodeProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	if s.Cloud != components.Local {
		return nil, nil
	}
	nodes, err := c.Nodes(ctx, sandboxNodeSelector)
	if err != nil {
		return nil, fmt.Errorf("listing the nodes labelled %s: %w", sandboxNodeSelector, err)
	}
	fix := fmt.Sprintf("label the nodes whose containerd has the runsc runtime: `kubectl label node NODE %s` (fusebox:cloud local in %s; docs/deploy.md)", sandboxNodeSelector, s.file())
	if len(nodes) == 0 {
		return []string{fmt.Sprintf("no node is labelled %s, which sandbox pods select: they would stay Pending; %s", sandboxNodeSelector, fix)}, nil
	}
	for _, n := range nodes {
		if n.Ready && !n.Unschedulable {
			return nil, nil
		}
	}
	return []string{fmt.Sprintf("no node labelled %s is Ready and schedulable (%s): sandbox pods would stay Pending; uncordon one, or %s", sandboxNodeSelector, nodeNames(nodes), fix)}, nil
}

// Rollout is the manager Deployment's shape: Replicas pods, at most one per node when
// RequiredAntiAffinity, rolled with MaxSurge extra pods and none unavailable
// (components/manager's deploymentSpec: maxSurge 1, maxUnavailable 0). NodesAutoscaled says
// a node autoscaler adds nodes for pods that cannot be scheduled (stack key
// fusebox:manager.nodesAutoscaled).
type Rollout struct {
	Replicas             int
	RequiredAntiAffinity bool
	MaxSurge             int
	NodesAutoscaled      bool
}

// rolloutProblems: a rollout with maxUnavailable 0 starts MaxSurge new pods before it stops
// an old one, so with required anti-affinity it needs Replicas+MaxSurge nodes the manager
// can run on; with fewer, the surge pod stays Pending and the rollout (and `up`, which waits
// for it) never finishes. With preferred anti-affinity the pods share nodes, so one node is
// enough. A node autoscaler adds the missing nodes: then the check only says nothing.
//
// This keeps maxUnavailable 0 (a rollout never lowers the number of serving managers, which
// hold the leader's pool duties and the API) and refuses a cluster too small for it, rather
// than rolling with maxUnavailable 1 and a PodDisruptionBudget, which fits any cluster but
// serves with one manager fewer through every rollout.
func rolloutProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	r := s.Manager
	if r.Replicas == 0 || r.NodesAutoscaled {
		return nil, nil
	}
	nodes, err := c.Nodes(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("listing the nodes for the manager's rollout: %w", err)
	}
	var eligible []Node
	for _, n := range nodes {
		if managerFits(n) {
			eligible = append(eligible, n)
		}
	}
	need := 1
	if r.RequiredAntiAffinity {
		need = r.Replicas + r.MaxSurge
	}
	if len(eligible) >= need {
		return nil, nil
	}
	why := fmt.Sprintf("fusebox:manager.replicas %d with requiredAntiAffinity (one manager per node) and a rollout that starts %d new pod(s) before stopping an old one (maxUnavailable 0) need %d nodes the manager can run on", r.Replicas, r.MaxSurge, need)
	if !r.RequiredAntiAffinity {
		why = "the manager needs a node it can run on"
	}
	return []string{fmt.Sprintf("%s (Ready, schedulable, no NoSchedule or NoExecute taint: the manager tolerates none); the cluster has %d (%s): a rollout would wait forever. Add nodes, lower fusebox:manager.replicas, set fusebox:manager.requiredAntiAffinity: false, or, where a node autoscaler (Cluster Autoscaler, Karpenter, GKE node auto-provisioning) adds nodes for pending pods, set fusebox:manager.nodesAutoscaled: true in %s",
		why, len(eligible), nodeNames(eligible), s.file())}, nil
}

// managerFits reports whether a manager pod can run on n: it is Ready, not cordoned, and has
// no taint that keeps pods off (the manager's pod has no tolerations).
func managerFits(n Node) bool {
	if !n.Ready || n.Unschedulable {
		return false
	}
	for _, t := range n.Taints {
		if strings.HasSuffix(t, ":NoSchedule") || strings.HasSuffix(t, ":NoExecute") {
			return false
		}
	}
	return true
}

// nodeNames lists nodes' names for messages ("none" for no node).
func nodeNames(nodes []Node) string {
	if len(nodes) == 0 {
		return "none"
	}
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if len(names) > 5 {
		names = append(names[:5], fmt.Sprintf("and %d more", len(nodes)-5))
	}
	return strings.Join(names, ", ")
}
