package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/clustertest"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// outsideIP is the address of the outside host on the node's bridge, outside the pods' range
// (nodetest.Net .10-.250).
const outsideIP = nodetest.Net + ".253"

// TestEgressAllowlistOnARealNode: under the plain-NetworkPolicy flavour (kube-router), the
// address:port a sandbox's allowlist names becomes reachable from that bound sandbox, and
// from nothing else: not the same host's other port, not another bound sandbox of the same
// namespace, not another pod there.
func TestEgressAllowlistOnARealNode(t *testing.T) {
	n := realNode(t)
	m, _, ns := newManager(t, n)
	clustertest.ApplyNamespacePolicies(t, n, ns, sandboxnet.Kubernetes)
	out, err := n.StartOutsideHost(context.Background(), outsideIP, nil, 8080, 8081)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	allowed, other := outsideIP+":8080", outsideIP+":8081"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	withEgress, _ := clustertest.Dial(t, ctx, n, m, allowed)
	without, _ := clustertest.Dial(t, ctx, n, m)
	// The other port goes first, as a canary: once it is blocked, the namespace's default
	// deny has reached the pod (a new pod's traffic passes until kube-router's next sync takes
	// it in), and the allowlist is judged under it. The allowed target is retried: its policy
	// reaches kube-router's sets some seconds after the allocation.
	clustertest.Want(t, "the sandbox allowed "+allowed, clustertest.ProbeFrom(t, ctx, withEgress, other+"-", allowed+"+"),
		map[string]string{allowed: "open", other: "blocked"})
	// Where allowed must be blocked, the same canary goes first.
	blocked := map[string]string{allowed: "blocked", other: "blocked"}
	clustertest.Want(t, "a bound sandbox without an allowlist", clustertest.ProbeFrom(t, ctx, without, other+"-", allowed), blocked)
	clustertest.Want(t, "another pod of the sandbox namespace",
		clustertest.Probe(t, n, ns, map[string]string{"app": "curious"}, other+"-", allowed), blocked)
}
