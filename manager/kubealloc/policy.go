package kubealloc

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The resources of the policies the allocator writes and checks.
var (
	// CiliumNetworkPolicyGVR is cilium.io/v2 ciliumnetworkpolicies.
	CiliumNetworkPolicyGVR = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	// NetworkPolicyGVR is networking.k8s.io/v1 networkpolicies.
	NetworkPolicyGVR = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
	// FQDNNetworkPolicyGVR is GKE's networking.gke.io/v1alpha1 fqdnnetworkpolicies.
	FQDNNetworkPolicyGVR = schema.GroupVersionResource{Group: "networking.gke.io", Version: "v1alpha1", Resource: "fqdnnetworkpolicies"}
)

// gvr returns the resource of a rendered policy's kind.
func gvr(kind string) (schema.GroupVersionResource, error) {
	switch kind {
	case sandboxnet.CiliumKind:
		return CiliumNetworkPolicyGVR, nil
	case sandboxnet.NetworkPolicyKind:
		return NetworkPolicyGVR, nil
	case sandboxnet.FQDNKind:
		return FQDNNetworkPolicyGVR, nil
	}
	return schema.GroupVersionResource{}, fmt.Errorf("unknown policy kind %q", kind)
}

// DefaultDenyName is the namespace-wide default-deny policy CheckDefaultDeny looks for: the
// one the Pulumi program creates (sandboxnet is the one source of both).
const DefaultDenyName = sandboxnet.DefaultDenyName

// ErrNoDefaultDeny is returned by CheckDefaultDeny when the sandbox namespace lacks the
// default-deny policy or holds a different one under its name.
var ErrNoDefaultDeny = errors.New("sandbox namespace lacks the fusebox default-deny network policy")

// PolicyName is the name of sandbox id's own policies (one per kind).
func PolicyName(id string) string { return sandboxnet.SandboxPolicyName(id) }

// PolicySelectors say which pods may reach a sandbox.
type PolicySelectors struct {
	// Agents are the labels of the agents' pods, which may reach a bound sandbox's data port
	// from any of AgentNamespaces (empty: every pod of those namespaces). Without
	// AgentNamespaces only AgentCIDRs reach it.
	Agents          map[string]string
	AgentNamespaces []string
	// AgentCIDRs may reach the data port from outside the cluster.
	AgentCIDRs []string
	// Manager are the labels of the manager's pods in ManagerNamespace, which alone reach the
	// init port (sFuse).
	Manager          map[string]string
	ManagerNamespace string
	// ClusterDNS is where the cluster's pods send DNS queries (empty: kube-dns): the peer of
	// the DNS rule of a sandbox whose allowlist names hosts.
	ClusterDNS sandboxnet.ClusterDNS
}

func (s PolicySelectors) network(sandboxNamespace string) sandboxnet.Network {
	return sandboxnet.Network{
		SandboxNamespace: sandboxNamespace, ManagerNamespace: s.ManagerNamespace,
		ManagerLabels: maps.Clone(s.Manager), AgentLabels: maps.Clone(s.Agents),
		AgentNamespaces: s.AgentNamespaces, AgentCIDRs: s.AgentCIDRs,
		InitPort: int(InitPort), DataPort: int(DataPort), DNS: s.ClusterDNS,
	}
}

// SandboxPolicies returns sandbox id's own policies under flavour f (sandboxnet.SandboxPolicies:
// its agents reach its data port; it reaches exactly allow, plus DNS for the names in it),
// labelled and named PolicyName(id). The allowlist is parsed with egress.ParseAllowlist first:
// its errors wrap egress.ErrBadEntry; a host under a flavour without FQDN support wraps
// sandboxnet.ErrFQDNUnsupported.
func SandboxPolicies(f sandboxnet.Flavour, namespace, id string, allow []string, sel PolicySelectors) ([]*unstructured.Unstructured, error) {
	al, err := egress.ParseAllowlist(allow)
	if err != nil {
		return nil, err
	}
	objs, err := sandboxnet.SandboxPolicies(f, sel.network(namespace), id, al.Entries())
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		m, err := o.Unstructured(namespace)
		if err != nil {
			return nil, err
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}

// DefaultDenyPolicy returns the namespace-wide default deny under flavour f
// (sandboxnet.DefaultDeny: every pod of the namespace, nothing allowed either way), as the
// Pulumi program creates it.
func DefaultDenyPolicy(f sandboxnet.Flavour, namespace string) (*unstructured.Unstructured, error) {
	o, err := sandboxnet.DefaultDeny(f)
	if err != nil {
		return nil, err
	}
	m, err := o.Unstructured(namespace)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// CheckDefaultDeny fails with ErrNoDefaultDeny unless namespace holds DefaultDenyPolicy(f)'s
// spec under DefaultDenyName (a CiliumNetworkPolicy under Cilium, a NetworkPolicy otherwise).
// Run it at manager start: sandboxes must never exist in a namespace where an unbound pod
// could reach the network.
func CheckDefaultDeny(ctx context.Context, dyn dynamic.Interface, namespace string, f sandboxnet.Flavour) error {
	return checkDefaultDeny(ctx, newRetrier(DefaultBackoff()), dyn, namespace, f)
}

func checkDefaultDeny(ctx context.Context, r retrier, dyn dynamic.Interface, namespace string, f sandboxnet.Flavour) error {
	want, err := DefaultDenyPolicy(f, namespace)
	if err != nil {
		return err
	}
	res, err := gvr(want.GetKind())
	if err != nil {
		return err
	}
	kind := want.GetKind()
	var got *unstructured.Unstructured
	_, err = r.do(ctx, func(ctx context.Context) error {
		var err error
		got, err = dyn.Resource(res).Namespace(namespace).Get(ctx, DefaultDenyName, metav1.GetOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s %s/%s not found (network policy flavour %s; install it with `fusebox up` or kubealloc.DefaultDenyPolicy)", ErrNoDefaultDeny, kind, namespace, DefaultDenyName, f)
	}
	if err != nil {
		return fmt.Errorf("reading %s %s/%s: %w", kind, namespace, DefaultDenyName, err)
	}
	if !equality.Semantic.DeepEqual(got.Object["spec"], want.Object["spec"]) {
		return fmt.Errorf("%w: %s %s/%s exists but its spec is not the default-deny spec", ErrNoDefaultDeny, kind, namespace, DefaultDenyName)
	}
	return nil
}
