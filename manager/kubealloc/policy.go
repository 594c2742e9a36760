package kubealloc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"

	"github.com/fusebox-dev/fusebox/manager/egress"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// CiliumNetworkPolicyGVR is cilium.io/v2 ciliumnetworkpolicies.
var CiliumNetworkPolicyGVR = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}

// DefaultDenyName is the namespace-wide default-deny policy CheckDefaultDeny looks for.
const DefaultDenyName = "fusebox-sandbox-default-deny"

// ErrNoDefaultDeny is returned by CheckDefaultDeny when the sandbox namespace lacks the
// default-deny policy or holds a different one under its name.
var ErrNoDefaultDeny = errors.New("sandbox namespace lacks the fusebox default-deny CiliumNetworkPolicy")

// PolicyName is the name of sandbox id's CiliumNetworkPolicy.
func PolicyName(id string) string { return "fusebox-sandbox-" + id }

// The typed subset of Cilium's rule schema that fusebox writes (cilium.io/v2 field names),
// converted to unstructured with runtime.DefaultUnstructuredConverter.
type (
	cnpSpec struct {
		EndpointSelector selector     `json:"endpointSelector"`
		Ingress          []ingress    `json:"ingress"`
		Egress           []egressRule `json:"egress"`
	}
	selector struct {
		MatchLabels map[string]string `json:"matchLabels,omitempty"`
	}
	ingress struct {
		FromEndpoints []selector `json:"fromEndpoints,omitempty"`
		ToPorts       []portRule `json:"toPorts,omitempty"`
	}
	egressRule struct {
		ToEndpoints []selector `json:"toEndpoints,omitempty"`
		ToFQDNs     []fqdn     `json:"toFQDNs,omitempty"`
		ToCIDR      []string   `json:"toCIDR,omitempty"`
		ToPorts     []portRule `json:"toPorts,omitempty"`
	}
	fqdn struct {
		MatchName    string `json:"matchName,omitempty"`
		MatchPattern string `json:"matchPattern,omitempty"`
	}
	portRule struct {
		Ports []port   `json:"ports"`
		Rules *l7Rules `json:"rules,omitempty"`
	}
	port struct {
		Port     string `json:"port"`
		Protocol string `json:"protocol"`
	}
	l7Rules struct {
		DNS []fqdn `json:"dns,omitempty"`
	}
)

// PolicySelectors say which pods may reach a sandbox. Both are Cilium endpoint label
// selectors (matchLabels); for pods in another namespace add
// "k8s:io.kubernetes.pod.namespace": "<ns>".
type PolicySelectors struct {
	// Agents may reach the data port.
	Agents map[string]string
	// Manager may reach the init port (sFuse).
	Manager map[string]string
}

// dnsRule lets a sandbox ask kube-dns anything: toFQDNs only works when Cilium's DNS proxy
// sees the lookups, which needs an L7 DNS rule (matchPattern "*": the names themselves are
// limited by toFQDNs, not by what may be looked up).
func dnsRule() egressRule {
	return egressRule{
		ToEndpoints: []selector{{MatchLabels: map[string]string{
			"k8s:io.kubernetes.pod.namespace": "kube-system",
			"k8s:k8s-app":                     "kube-dns",
		}}},
		ToPorts: []portRule{{
			Ports: []port{{Port: "53", Protocol: "UDP"}, {Port: "53", Protocol: "TCP"}},
			Rules: &l7Rules{DNS: []fqdn{{MatchPattern: "*"}}},
		}},
	}
}

// SandboxPolicy returns sandbox id's CiliumNetworkPolicy: it selects the pod by its
// sandbox-id label; egress is the DNS rule plus, per port of the allowlist, the names
// (toFQDNs: matchName, or matchPattern for "*." wildcards) and the IP literals (toCIDR /32 or
// /128) allowed on it (TCP); ingress is the data port from Agents and the init port from
// Manager, nothing else. The allowlist is parsed with egress.ParseAllowlist; its errors wrap
// egress.ErrBadEntry. An empty allowlist leaves DNS as the only egress.
func SandboxPolicy(namespace, id string, allow []string, sel PolicySelectors) (*unstructured.Unstructured, error) {
	al, err := egress.ParseAllowlist(allow)
	if err != nil {
		return nil, err
	}
	type group struct {
		names []fqdn
		cidrs []string
	}
	var ports []string
	groups := map[string]*group{}
	for _, e := range al.Entries() {
		i := strings.LastIndexByte(e, ':')
		host, p := e[:i], e[i+1:]
		g := groups[p]
		if g == nil {
			g = &group{}
			groups[p] = g
			ports = append(ports, p)
		}
		switch {
		case strings.HasPrefix(host, "["):
			a := netip.MustParseAddr(strings.Trim(host, "[]"))
			g.cidrs = append(g.cidrs, netip.PrefixFrom(a, a.BitLen()).String())
		case strings.HasPrefix(host, "*."):
			g.names = append(g.names, fqdn{MatchPattern: host})
		default:
			if a, err := netip.ParseAddr(host); err == nil {
				g.cidrs = append(g.cidrs, netip.PrefixFrom(a, a.BitLen()).String())
			} else {
				g.names = append(g.names, fqdn{MatchName: host})
			}
		}
	}
	spec := cnpSpec{
		EndpointSelector: selector{MatchLabels: map[string]string{LabelSandboxID: id}},
		Ingress: []ingress{
			{FromEndpoints: []selector{{MatchLabels: maps.Clone(sel.Agents)}}, ToPorts: tcp(DataPort)},
			{FromEndpoints: []selector{{MatchLabels: maps.Clone(sel.Manager)}}, ToPorts: tcp(InitPort)},
		},
		Egress: []egressRule{dnsRule()},
	}
	for _, p := range ports {
		g := groups[p]
		tp := []portRule{{Ports: []port{{Port: p, Protocol: "TCP"}}}}
		if len(g.names) > 0 {
			spec.Egress = append(spec.Egress, egressRule{ToFQDNs: g.names, ToPorts: tp})
		}
		if len(g.cidrs) > 0 {
			spec.Egress = append(spec.Egress, egressRule{ToCIDR: g.cidrs, ToPorts: tp})
		}
	}
	return newPolicy(namespace, PolicyName(id), map[string]string{LabelApp: AppName, LabelSandboxID: id}, spec)
}

func tcp(p int32) []portRule {
	return []portRule{{Ports: []port{{Port: strconv.Itoa(int(p)), Protocol: "TCP"}}}}
}

// DefaultDenyPolicy returns the namespace-wide default-deny policy for sandbox pods: it
// selects every pod labelled app.kubernetes.io/name=fusebox-sandbox and has one empty ingress
// and one empty egress rule, which in Cilium puts both directions into default deny while
// allowing nothing. Deliberately no DNS: a sandbox that has no bound allowlist (a warm pod,
// or one whose per-sandbox policy is missing) has no egress at all, not even lookups (DNS is
// an exfiltration channel); the per-sandbox policy adds the DNS rule with the allowlist.
func DefaultDenyPolicy(namespace string) (*unstructured.Unstructured, error) {
	spec := cnpSpec{
		EndpointSelector: selector{MatchLabels: map[string]string{LabelApp: AppName}},
		Ingress:          []ingress{{}},
		Egress:           []egressRule{{}},
	}
	return newPolicy(namespace, DefaultDenyName, map[string]string{LabelApp: AppName}, spec)
}

func newPolicy(namespace, name string, labels map[string]string, spec cnpSpec) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec)
	if err != nil {
		return nil, fmt.Errorf("converting policy %s: %w", name, err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": m}}
	u.SetAPIVersion("cilium.io/v2")
	u.SetKind("CiliumNetworkPolicy")
	u.SetNamespace(namespace)
	u.SetName(name)
	u.SetLabels(labels)
	return u, nil
}

// CheckDefaultDeny fails with ErrNoDefaultDeny unless namespace holds DefaultDenyPolicy's
// spec under DefaultDenyName. Run it at manager start: sandboxes must never exist in a
// namespace where an unbound pod could reach the network.
func CheckDefaultDeny(ctx context.Context, dyn dynamic.Interface, namespace string) error {
	return checkDefaultDeny(ctx, newRetrier(DefaultBackoff()), dyn, namespace)
}

func checkDefaultDeny(ctx context.Context, r retrier, dyn dynamic.Interface, namespace string) error {
	var got *unstructured.Unstructured
	_, err := r.do(ctx, func(ctx context.Context) error {
		var err error
		got, err = dyn.Resource(CiliumNetworkPolicyGVR).Namespace(namespace).Get(ctx, DefaultDenyName, metav1.GetOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: CiliumNetworkPolicy %s/%s not found (install it with the infra module or kubealloc.DefaultDenyPolicy)", ErrNoDefaultDeny, namespace, DefaultDenyName)
	}
	if err != nil {
		return fmt.Errorf("reading CiliumNetworkPolicy %s/%s: %w", namespace, DefaultDenyName, err)
	}
	want, err := DefaultDenyPolicy(namespace)
	if err != nil {
		return err
	}
	if !equality.Semantic.DeepEqual(got.Object["spec"], want.Object["spec"]) {
		return fmt.Errorf("%w: CiliumNetworkPolicy %s/%s exists but its spec is not the default-deny spec", ErrNoDefaultDeny, namespace, DefaultDenyName)
	}
	return nil
}
