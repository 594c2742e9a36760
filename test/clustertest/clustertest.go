// Package clustertest holds what the real-node test packages (test/cluster on kube-router,
// test/cilium on Cilium) share: the node started once per test binary with the test sandbox
// image, a manager on the kube allocator against it, the sandbox namespace's policies as the
// Pulumi program renders them for a flavour, and probes from pods.
//
// The agents of these tests are host processes on the node's address (the test itself) and
// pods in namespace AgentNamespace labelled fusebox.dev/role=agent; the manager is a host
// process too.
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/nodetest"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// SandboxImage is the name the test sandbox image is imported under.
const SandboxImage = "localhost/fusebox-test/sandbox:v1"

// AgentNamespace holds the agent pods; their label is AgentLabels.
const AgentNamespace = "agents"

// AgentLabels select the agent pods.
var AgentLabels = map[string]string{"fusebox.dev/role": "agent"}

// Node starts a real node once per test binary, with the test sandbox image imported.
type Node struct {
	once sync.Once
	node *nodetest.Node
	err  error
}

// Get returns the node, started with o on the first call (o.Images gets the test sandbox
// image). It skips t only when FUSEBOX_SKIP_KUBE=1 and the node's binaries are missing.
func (s *Node) Get(t *testing.T, o nodetest.Options) *nodetest.Node {
	t.Helper()
	bin := sandboxtest.SandboxBinary(t)
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		dir, err := os.MkdirTemp("", "cluster-test-")
		if err != nil {
			s.err = err
			return
		}
		defer os.RemoveAll(dir)
		archive := filepath.Join(dir, "sandbox.tar")
		if s.err = nodetest.WriteSandboxImage(bin, SandboxImage, archive); s.err != nil {
			return
		}
		o.Images = append(o.Images, archive)
		s.node, s.err = nodetest.Start(ctx, o)
	})
	if (errors.Is(s.err, nodetest.ErrNoBinaries) || errors.Is(s.err, nodetest.ErrNoCilium)) && os.Getenv("FUSEBOX_SKIP_KUBE") == "1" {
		t.Skip(s.err)
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.node
}

// StopAtExit stops the node, if one was started, after the tests ended with code (from
// TestMain's m.Run), and returns the code to exit with.
func (s *Node) StopAtExit(code int) int { return nodetest.StopAtExit(s.node, code) }

// Selectors are the policy selectors of these tests: the agents are AgentLabels pods in
// AgentNamespace and the node's address; the manager's pods would be in namespace fusebox.
func Selectors() kubealloc.PolicySelectors {
	return kubealloc.PolicySelectors{
		Agents:           AgentLabels,
		AgentNamespaces:  []string{AgentNamespace},
		AgentCIDRs:       []string{nodetest.NodeIP + "/32"},
		Manager:          map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		ManagerNamespace: "fusebox",
	}
}

// NewManager returns a started manager on the kube allocator with policy flavour f, its pods
// in a fresh namespace on the real node, with a pool of one.
func NewManager(t *testing.T, n *nodetest.Node, f sandboxnet.Flavour) (*manager.Manager, *kubealloc.Allocator, string) {
	return NewManagerWith(t, n, f, nil)
}

// NewManagerWith is NewManager with templates besides the default, each with a pool of one.
func NewManagerWith(t *testing.T, n *nodetest.Node, f sandboxnet.Flavour, templates map[string]kubealloc.Template) (*manager.Manager, *kubealloc.Allocator, string) {
	t.Helper()
	ns := n.Env.Namespace(t)
	tmpls := map[string]kubealloc.Template{manager.DefaultTemplate: kubealloc.DefaultTemplate(SandboxImage)}
	pools := []manager.TemplatePool{{Template: manager.DefaultTemplate, Estimator: estimator.Fixed{N: 1}}}
	for _, name := range slices.Sorted(maps.Keys(templates)) {
		tmpls[name] = templates[name]
		pools = append(pools, manager.TemplatePool{Template: name, Estimator: estimator.Fixed{N: 1}, Image: templates[name].Image})
	}
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = p.Template
	}
	a, err := kubealloc.New(kubealloc.Options{
		Client: n.Env.Client, Dynamic: n.Env.Dynamic, Namespace: ns, Identity: "replica-a",
		Templates:    tmpls,
		Selectors:    Selectors(),
		Flavour:      f,
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
	m, err := manager.New(manager.Options{Allocator: a, Templates: names, Pools: pools, Clock: manager.RealClock{},
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

// Allocate allocates a sandbox from m for a fresh agent key with egress allowlist egress,
// fails the test with the node's logs if it cannot, and releases it when the test ends (the
// node's CPU holds a few sandboxes, and later tests allocate on it too).
func Allocate(t *testing.T, ctx context.Context, n *nodetest.Node, m *manager.Manager, egress ...string) (manager.Allocation, *client.Key) {
	t.Helper()
	key, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return AllocateRequest(t, ctx, n, m, key, manager.AllocateRequest{Egress: egress}), key
}

// AllocateRequest is Allocate with the request r (for key, which it sets).
func AllocateRequest(t *testing.T, ctx context.Context, n *nodetest.Node, m *manager.Manager, key *client.Key, r manager.AllocateRequest) manager.Allocation {
	t.Helper()
	r.AgentPublicKey = key.PublicKey()
	al, err := m.Allocate(ctx, r)
	if err != nil {
		t.Fatalf("Allocate: %v\n%s", err, n.Logs())
	}
	t.Cleanup(func() { m.Release(context.Background(), al.ID, al.LeaseToken) })
	return al
}

// Dial allocates (Allocate) and dials the sandbox; the connection closes when the test ends.
func Dial(t *testing.T, ctx context.Context, n *nodetest.Node, m *manager.Manager, egress ...string) (*client.Sandbox, manager.Allocation) {
	t.Helper()
	al, key := Allocate(t, ctx, n, m, egress...)
	sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb, al
}

// policyResources are where the namespace policies of each kind go.
var policyResources = map[string]schema.GroupVersionResource{
	sandboxnet.NetworkPolicyKind: {Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	sandboxnet.CiliumKind:        {Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"},
}

// ApplyNamespacePolicies creates the sandbox namespace's policies as the Pulumi program
// renders them for flavour f (policies/sandboxnet).
func ApplyNamespacePolicies(t *testing.T, n *nodetest.Node, ns string, f sandboxnet.Flavour) {
	t.Helper()
	sel := Selectors()
	net := sandboxnet.Network{SandboxNamespace: ns, ManagerNamespace: sel.ManagerNamespace,
		ManagerLabels: sel.Manager, AgentLabels: sel.Agents, AgentNamespaces: sel.AgentNamespaces,
		AgentCIDRs: sel.AgentCIDRs, InitPort: int(kubealloc.InitPort), DataPort: int(kubealloc.DataPort)}
	objs, err := sandboxnet.NamespacePolicies(f, net)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		res, ok := policyResources[o.Kind]
		if !ok {
			t.Fatalf("no resource for policy kind %s", o.Kind)
		}
		obj, err := o.Unstructured(ns)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := n.Env.Dynamic.Resource(res).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s %s: %v", o.Kind, o.Name, err)
		}
	}
}

// Probe runs nodetest.ProbeScript in a pod of namespace ns with labels, from the test
// sandbox image.
func Probe(t *testing.T, n *nodetest.Node, ns string, labels map[string]string, targets ...string) map[string]string {
	t.Helper()
	res, err := n.Probe(context.Background(), ns, labels, SandboxImage, targets...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// ProbeFrom runs nodetest.ProbeScript inside sandbox sb.
func ProbeFrom(t *testing.T, ctx context.Context, sb *client.Sandbox, targets ...string) map[string]string {
	t.Helper()
	res, err := sb.Run(ctx, append([]string{"python3", "-c", nodetest.ProbeScript}, targets...)...)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("the probe in the sandbox exited %d: %s", res.ExitCode, res.Stderr)
	}
	return nodetest.ProbeResults(string(res.Stdout))
}

// Want fails t unless got[target] is want for every target of want, naming where from.
func Want(t *testing.T, from string, got, want map[string]string) {
	t.Helper()
	for target, w := range want {
		if got[target] != w {
			t.Errorf("from %s: %s is %q, want %s (all: %v)", from, target, got[target], w, got)
		}
	}
}

// HostPort joins host and port.
func HostPort(host string, port int) string { return fmt.Sprintf("%s:%d", host, port) }
