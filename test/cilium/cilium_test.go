// Package cilium_test proves the seed's network layer on a real node whose pod network and
// policy agent is Cilium (test/nodetest, Options.Cilium: Cilium's own agent and CNI plugin,
// built from the Go module proxy by hack/cilium, as host processes): gVisor sandbox pods from
// fusebox's kube allocator, under the sandbox namespace's CiliumNetworkPolicies as the Pulumi
// program renders them and the per-sandbox allowlists the manager makes (policies/sandboxnet,
// flavour cilium).
//
// The outside world is made by the test: an outside host (a network namespace on the node's
// bridge) holds a private address, the cloud metadata address and two documentation addresses
// (TEST-NET-2, never routed on the Internet) standing in for Internet hosts; only the pods'
// traffic is routed to the addresses beyond the bridge. Names are answered by a DNS server
// the test runs as the cluster's kube-dns (a pod of kube-system behind the kube-dns Service
// that the kubelet hands every pod); never the host's resolver.
package cilium_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/clustertest"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// The outside host's addresses: one on the bridge, beyond the pods' range; the metadata
// address; two documentation addresses standing in for Internet hosts.
const (
	privateIP  = nodetest.Net + ".253"
	metadataIP = "169.254.169.254"
	webIP      = "198.51.100.7"
	otherWebIP = "198.51.100.8"
)

// The names the test's DNS server answers, and the ports the outside host accepts on.
const (
	webName      = "web.fusebox.test"
	otherWebName = "other.fusebox.test"
	port, port2  = 8080, 8081
)

var nodes clustertest.Node

func TestMain(m *testing.M) { os.Exit(nodes.StopAtExit(m.Run())) }

// realNode starts the Cilium node once per test binary, with the test's DNS server as the
// cluster's DNS and the outside host, both kept until the node stops.
func realNode(t *testing.T) *nodetest.Node {
	n := nodes.Get(t, nodetest.Options{Cilium: true, Deployments: true, ClusterDNS: nodetest.DNSServiceIP})
	setupOnce(t, n)
	return n
}

var setup struct {
	done bool
	err  error
}

func setupOnce(t *testing.T, n *nodetest.Node) {
	t.Helper()
	if !setup.done {
		setup.done = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, setup.err = n.StartOutsideHost(ctx, privateIP, []string{metadataIP, webIP, otherWebIP}, 80, port, port2); setup.err == nil {
			setup.err = n.StartDNS(ctx, clustertest.SandboxImage, map[string]string{webName: webIP, otherWebName: otherWebIP})
		}
	}
	if setup.err != nil {
		t.Fatal(setup.err)
	}
}

// TestCiliumDefaultDeny: under the namespace's policies a warm sandbox turns Ready (the
// kubelet's probe reaches it through the empty-rule default deny); an agent pod reaches a
// bound sandbox's data port and not its init port; a pod outside the agents reaches neither;
// the sandbox itself reaches nothing: not the node (its kubelet), not the other sandbox, not
// the metadata address, not a private address, not an Internet host, not even DNS. A pod
// outside the sandbox namespace reaches each of those, so each block is the policy's.
func TestCiliumDefaultDeny(t *testing.T) {
	n := realNode(t)
	m, _, ns := clustertest.NewManager(t, n, sandboxnet.Cilium)
	clustertest.ApplyNamespacePolicies(t, n, ns, sandboxnet.Cilium)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, alA := clustertest.Dial(t, ctx, n, m)
	_, alB := clustertest.Dial(t, ctx, n, m)
	if _, err := a.Run(ctx, "true"); err != nil { // the agent, a host process, reaches its sandbox
		t.Fatalf("the agent lost its sandbox under the policies: %v", err)
	}
	dataA, initA := endpoint(t, alA.Endpoint, kubealloc.DataPort), endpoint(t, alA.Endpoint, kubealloc.InitPort)
	dataB := endpoint(t, alB.Endpoint, kubealloc.DataPort)

	clustertest.Want(t, "an agent pod", clustertest.Probe(t, n, clustertest.AgentNamespace, clustertest.AgentLabels, dataA+"+", initA),
		map[string]string{dataA: "open", initA: "blocked"})
	clustertest.Want(t, "a pod outside the agents", clustertest.Probe(t, n, "elsewhere", map[string]string{"app": "curious"}, dataA, initA),
		map[string]string{dataA: "blocked", initA: "blocked"})

	kubelet := clustertest.HostPort(nodetest.NodeIP, 20250)
	dns := clustertest.HostPort(nodetest.DNSServiceIP, 53)
	targets := []string{kubelet, dataB, clustertest.HostPort(metadataIP, 80), clustertest.HostPort(privateIP, port),
		clustertest.HostPort(webIP, port)}
	open, blocked := map[string]string{}, map[string]string{}
	for _, tg := range targets[2:] {
		open[tg] = "open"
	}
	for _, tg := range append(targets, dns) {
		blocked[tg] = "blocked"
	}
	open[kubelet], open[dns] = "open", "open"
	// The control: an unpoliced pod reaches the node, the outside addresses and DNS (the
	// first target retried until its new address is routed).
	control := append([]string{targets[2] + "+"}, kubelet, dns)
	control = append(control, targets[3:]...)
	clustertest.Want(t, "a pod outside the sandbox namespace", clustertest.Probe(t, n, "elsewhere", nil, control...), open)
	clustertest.Want(t, "inside a bound sandbox", clustertest.ProbeFrom(t, ctx, a, append(targets, dns)...), blocked)
}

// TestCiliumFQDNAllowlist: a sandbox allowed web.fusebox.test:8080 resolves that name through
// the cluster's DNS (Cilium's DNS proxy) and reaches it, and nothing else: not the name's
// other port, not another name (its lookup is refused), not the other host's address, not
// a private address, not metadata. A bound sandbox without the allowlist reaches the name's
// address on neither port, and a pod of the namespace outside the sandboxes neither.
func TestCiliumFQDNAllowlist(t *testing.T) {
	n := realNode(t)
	m, _, ns := clustertest.NewManager(t, n, sandboxnet.Cilium)
	clustertest.ApplyNamespacePolicies(t, n, ns, sandboxnet.Cilium)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	allowed := clustertest.HostPort(webName, port)
	with, _ := clustertest.Dial(t, ctx, n, m, allowed)
	without, _ := clustertest.Dial(t, ctx, n, m)

	// Names end in a dot: looked up as they are, not under the pod's search domains, whose
	// lookups the DNS proxy refuses.
	abs := func(name string, p int) string { return clustertest.HostPort(name+".", p) }
	webPort2 := abs(webName, port2)
	got := clustertest.ProbeFrom(t, ctx, with, abs(webName, port)+"+", webPort2, abs(otherWebName, port),
		clustertest.HostPort(otherWebIP, port), clustertest.HostPort(privateIP, port), clustertest.HostPort(metadataIP, 80))
	clustertest.Want(t, "the sandbox allowed "+allowed, got, map[string]string{
		webName + ".:8080": "open", webPort2: "blocked", otherWebName + ".:8080": "blocked",
		clustertest.HostPort(otherWebIP, port): "blocked", clustertest.HostPort(privateIP, port): "blocked",
		clustertest.HostPort(metadataIP, 80): "blocked",
	})
	web := clustertest.HostPort(webIP, port)
	clustertest.Want(t, "a bound sandbox without an allowlist", clustertest.ProbeFrom(t, ctx, without, web, clustertest.HostPort(webIP, port2)),
		map[string]string{web: "blocked", clustertest.HostPort(webIP, port2): "blocked"})
	clustertest.Want(t, "another pod of the sandbox namespace", clustertest.Probe(t, n, ns, map[string]string{"app": "curious"}, web),
		map[string]string{web: "blocked"})
}

// endpoint is the address of a sandbox's port p, from its allocation's endpoint.
func endpoint(t *testing.T, ep string, p int32) string {
	t.Helper()
	host, _, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		t.Fatalf("endpoint %q: %v", ep, err)
	}
	return clustertest.HostPort(host, int(p))
}
