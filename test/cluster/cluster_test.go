// Package cluster_test runs fusebox's kube allocator against a real single-node cluster
// (test/nodetest): sandbox pods are real gVisor pods started by a kubelet through containerd
// and the gVisor shim, from the test sandbox image imported into the node, on a bridge the
// test creates, with kube-router enforcing NetworkPolicy. No kwok: every pod the manager hands
// out runs the sandbox server, and the agent talks to it at its pod IP.
package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/nodetest"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// sandboxImage is the name the test sandbox image is imported under.
const sandboxImage = "localhost/fusebox-test/sandbox:v1"

var (
	node    *nodetest.Node
	nodeErr error
	once    sync.Once
)

func TestMain(m *testing.M) { os.Exit(nodetest.StopAtExit(node, m.Run())) }

// realNode starts the node once per test binary, with the test sandbox image imported. It
// skips only when FUSEBOX_SKIP_KUBE=1 and the node's binaries are missing.
func realNode(t *testing.T) *nodetest.Node {
	t.Helper()
	bin := sandboxtest.SandboxBinary(t)
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		dir, err := os.MkdirTemp("", "cluster-test-")
		if err != nil {
			nodeErr = err
			return
		}
		defer os.RemoveAll(dir)
		archive := filepath.Join(dir, "sandbox.tar")
		if nodeErr = nodetest.WriteSandboxImage(bin, sandboxImage, archive); nodeErr != nil {
			return
		}
		node, nodeErr = nodetest.Start(ctx, nodetest.Options{Images: []string{archive}})
	})
	if errors.Is(nodeErr, nodetest.ErrNoBinaries) && os.Getenv("FUSEBOX_SKIP_KUBE") == "1" {
		t.Skip(nodeErr)
	}
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	return node
}

// The agents of these tests are host processes on the node's address (the test itself), and
// pods in namespace agents labelled fusebox.dev/role=agent; the manager is a host process too.
func selectors() kubealloc.PolicySelectors {
	return kubealloc.PolicySelectors{
		Agents:           map[string]string{"fusebox.dev/role": "agent"},
		AgentNamespaces:  []string{"agents"},
		AgentCIDRs:       []string{nodetest.NodeIP + "/32"},
		Manager:          map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		ManagerNamespace: "fusebox",
	}
}

// allocate allocates a sandbox from m for a fresh agent key, failing the test with the node's
// logs if it cannot.
func allocate(t *testing.T, ctx context.Context, n *nodetest.Node, m *manager.Manager) (manager.Allocation, *client.Key) {
	t.Helper()
	key, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("Allocate: %v\n%s", err, n.Logs())
	}
	return al, key
}

// newManager returns a started manager on the kube allocator, its pods in a fresh namespace
// on the real node, with a pool of one.
func newManager(t *testing.T, n *nodetest.Node) (*manager.Manager, *kubealloc.Allocator, string) {
	t.Helper()
	ns := n.Env.Namespace(t)
	a, err := kubealloc.New(kubealloc.Options{
		Client: n.Env.Client, Dynamic: n.Env.Dynamic, Namespace: ns, Identity: "replica-a",
		Templates:    map[string]kubealloc.Template{manager.DefaultTemplate: kubealloc.DefaultTemplate(sandboxImage)},
		Selectors:    selectors(),
		Flavour:      sandboxnet.Kubernetes, // kube-router enforces plain NetworkPolicy
		NodeName:     nodetest.NodeName,
		ReadyTimeout: 3 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); a.Shutdown() })
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: 1}, Clock: manager.RealClock{},
		Initializer: sfuse.Initialize, ReconcileInterval: 50 * time.Millisecond, AllocateWait: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return m, a, ns
}

// TestAllocateExecOnARealNode: an allocation through the manager gets a real gVisor pod; the
// agent runs a command in it and moves 100 files over the direct, pinned data plane to the
// pod's IP; a release deletes the pod.
func TestAllocateExecOnARealNode(t *testing.T) {
	n := realNode(t)
	m, a, ns := newManager(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	al, key := allocate(t, ctx, n, m)
	if !strings.HasPrefix(al.Endpoint, "tcp://"+nodetest.Net+".") {
		t.Fatalf("endpoint %q is not a pod address on the test bridge", al.Endpoint)
	}
	sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Run(ctx, "cat", "/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "gVisor") && !strings.Contains(string(res.Stdout), "gvisor") {
		t.Fatalf("/proc/version = %q, want gVisor's", res.Stdout)
	}
	files := make([]client.File, 100)
	for i := range files {
		files[i] = client.File{Path: fmt.Sprintf("d%d/f%03d.txt", i%10, i), Data: bytes.Repeat([]byte{byte(i)}, 1000+i), Mode: 0o644}
	}
	if _, err := sb.WriteFiles(ctx, files, nil, nil); err != nil {
		t.Fatal(err)
	}
	got, _, err := sb.ReadFiles(ctx, "d*/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(files) {
		t.Fatalf("read back %d files, want %d", len(got), len(files))
	}
	for _, f := range files {
		if !bytes.Equal(got[f.Path], f.Data) {
			t.Fatalf("%s differs after the round trip", f.Path)
		}
	}
	pod, err := n.Env.Client.CoreV1().Pods(ns).Get(ctx, al.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != nodetest.NodeName || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Fatalf("pod on node %q with runtime class %q", pod.Spec.NodeName, *pod.Spec.RuntimeClassName)
	}
	if err := m.Release(ctx, al.ID, al.LeaseToken); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := a.Lookup(ctx, al.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("released pod %s still there", al.ID)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// applyNamespacePolicies applies the sandbox namespace's policies as the Pulumi program
// renders them for a plain-NetworkPolicy cluster (policies/sandboxnet).
func applyNamespacePolicies(t *testing.T, n *nodetest.Node, ns string) {
	t.Helper()
	net := sandboxnet.Network{SandboxNamespace: ns, ManagerNamespace: "fusebox",
		ManagerLabels: map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		AgentLabels:   map[string]string{"fusebox.dev/role": "agent"}, AgentNamespaces: []string{"agents"},
		AgentCIDRs: []string{nodetest.NodeIP + "/32"}, InitPort: int(kubealloc.InitPort), DataPort: int(kubealloc.DataPort)}
	objs, err := sandboxnet.NamespacePolicies(sandboxnet.Kubernetes, net)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		spec, err := json.Marshal(o.Spec)
		if err != nil {
			t.Fatal(err)
		}
		var np networkingv1.NetworkPolicySpec
		if err := json.Unmarshal(spec, &np); err != nil {
			t.Fatal(err)
		}
		pol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: o.Name, Labels: o.Labels}, Spec: np}
		if _, err := n.Env.Client.NetworkingV1().NetworkPolicies(ns).Create(context.Background(), pol, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating NetworkPolicy %s: %v", o.Name, err)
		}
	}
}

// probe runs nodetest.ProbeScript in a pod of namespace ns with labels, from the test
// sandbox image.
func probe(t *testing.T, n *nodetest.Node, ns string, labels map[string]string, targets ...string) map[string]string {
	t.Helper()
	res, err := n.Probe(context.Background(), ns, labels, sandboxImage, targets...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestNetworkPolicyOnARealNode: with the sandbox namespace's policies from policies/sandboxnet
// (plain NetworkPolicy, enforced by kube-router), a pod outside the agents cannot reach a
// bound sandbox's init or data port while an agent pod reaches its data port, and the
// sandbox itself reaches neither the node nor another sandbox.
func TestNetworkPolicyOnARealNode(t *testing.T) {
	n := realNode(t)
	m, _, ns := newManager(t, n)
	applyNamespacePolicies(t, n, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var boxes [2]*client.Sandbox
	var hosts [2]string
	for i := range boxes {
		key, _ := client.NewKey()
		al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
		if err != nil {
			t.Fatalf("Allocate: %v\n%s", err, n.Logs())
		}
		if boxes[i], err = client.Dial(al.Endpoint, al.SandboxKey, key); err != nil {
			t.Fatal(err)
		}
		defer boxes[i].Close()
		hosts[i] = strings.TrimSuffix(strings.TrimPrefix(al.Endpoint, "tcp://"), fmt.Sprintf(":%d", kubealloc.DataPort))
	}
	initA := fmt.Sprintf("%s:%d", hosts[0], kubealloc.InitPort)
	dataA := fmt.Sprintf("%s:%d", hosts[0], kubealloc.DataPort)
	dataB := fmt.Sprintf("%s:%d", hosts[1], kubealloc.DataPort)
	// The agent (this host) still reaches its sandbox over the data plane.
	if _, err := boxes[0].Run(ctx, "true"); err != nil {
		t.Fatalf("the agent lost its sandbox under the policies: %v", err)
	}
	// An agent pod reaches the data port (so the probe can see an open port) but not init.
	got := probe(t, n, "agents", map[string]string{"fusebox.dev/role": "agent"}, dataA+"+", initA)
	if got[dataA] != "open" || got[initA] != "blocked" {
		t.Fatalf("from an agent pod: %v, want the data port open and init blocked", got)
	}
	// Any other pod reaches neither.
	got = probe(t, n, "elsewhere", map[string]string{"app": "curious"}, dataA, initA)
	if got[dataA] != "blocked" || got[initA] != "blocked" {
		t.Fatalf("from a pod outside the agents: %v, want both ports blocked", got)
	}
	// The sandbox reaches neither the node's kubelet nor another sandbox.
	kubelet := nodetest.NodeIP + ":20250"
	res, err := boxes[0].Run(ctx, append([]string{"python3", "-c", nodetest.ProbeScript}, kubelet, dataB)...)
	if err != nil {
		t.Fatal(err)
	}
	got = nodetest.ProbeResults(string(res.Stdout))
	if got[kubelet] != "blocked" || got[dataB] != "blocked" {
		t.Fatalf("from inside a sandbox: %v (stderr %q), want the node and the other sandbox blocked", got, res.Stderr)
	}
}
