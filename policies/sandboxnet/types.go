package sandboxnet

import (
	"encoding/json"
	"fmt"
)

// The typed subsets of the three APIs that fusebox writes, with the APIs' JSON field names.

// Selector is a label selector (Cilium's endpointSelector, NetworkPolicy's podSelector and
// namespaceSelector). Empty selects every pod of the policy's namespace.
type Selector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// CiliumSpec is the subset of a cilium.io/v2 CiliumNetworkPolicy rule fusebox uses.
type CiliumSpec struct {
	Description       string             `json:"description,omitempty"`
	EndpointSelector  Selector           `json:"endpointSelector"`
	EnableDefaultDeny *DefaultDenyModes  `json:"enableDefaultDeny,omitempty"`
	Ingress           []CiliumIngress    `json:"ingress,omitempty"`
	Egress            []CiliumEgress     `json:"egress,omitempty"`
	EgressDeny        []CiliumEgressDeny `json:"egressDeny,omitempty"`
}

// DefaultDenyModes turns default deny on per direction for the selected endpoints.
type DefaultDenyModes struct {
	Ingress bool `json:"ingress"`
	Egress  bool `json:"egress"`
}

// CiliumIngress admits traffic from the listed peers to the listed ports. An empty rule
// admits nothing.
type CiliumIngress struct {
	FromEndpoints []Selector       `json:"fromEndpoints,omitempty"`
	FromCIDR      []string         `json:"fromCIDR,omitempty"`
	ToPorts       []CiliumPortRule `json:"toPorts,omitempty"`
}

// CiliumEgress allows traffic to the listed peers and ports. An empty rule allows nothing.
type CiliumEgress struct {
	ToEndpoints []Selector       `json:"toEndpoints,omitempty"`
	ToCIDR      []string         `json:"toCIDR,omitempty"`
	ToFQDNs     []FQDNSelector   `json:"toFQDNs,omitempty"`
	ToPorts     []CiliumPortRule `json:"toPorts,omitempty"`
}

// CiliumEgressDeny denies traffic whatever any allow rule says.
type CiliumEgressDeny struct {
	ToCIDR     []string   `json:"toCIDR,omitempty"`
	ToCIDRSet  []CIDRRule `json:"toCIDRSet,omitempty"`
	ToEntities []string   `json:"toEntities,omitempty"`
}

// CIDRRule is a CIDR with exceptions.
type CIDRRule struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// FQDNSelector matches DNS names (in toFQDNs, and in DNS rules as the names that may be
// looked up).
type FQDNSelector struct {
	MatchName    string `json:"matchName,omitempty"`
	MatchPattern string `json:"matchPattern,omitempty"`
}

// CiliumPortRule lists ports and optional L7 rules.
type CiliumPortRule struct {
	Ports []PortProtocol `json:"ports"`
	Rules *L7Rules       `json:"rules,omitempty"`
}

// PortProtocol is a port and protocol (TCP, UDP, ANY).
type PortProtocol struct {
	Port     string `json:"port"`
	Protocol string `json:"protocol"`
}

// L7Rules are the L7 rules fusebox uses: which names may be looked up.
type L7Rules struct {
	DNS []FQDNSelector `json:"dns,omitempty"`
}

// NetworkPolicySpec is the subset of a networking.k8s.io/v1 NetworkPolicy spec fusebox uses.
type NetworkPolicySpec struct {
	PodSelector Selector               `json:"podSelector"`
	PolicyTypes []string               `json:"policyTypes"`
	Ingress     []NetworkPolicyIngress `json:"ingress,omitempty"`
	Egress      []NetworkPolicyEgress  `json:"egress,omitempty"`
}

// NetworkPolicyIngress admits traffic from any of From to any of Ports.
type NetworkPolicyIngress struct {
	From  []NetworkPolicyPeer `json:"from,omitempty"`
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
}

// NetworkPolicyEgress allows traffic to any of To on any of Ports.
type NetworkPolicyEgress struct {
	To    []NetworkPolicyPeer `json:"to,omitempty"`
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
}

// NetworkPolicyPeer is pods (a namespace selector and a pod selector, both required to
// match) or an IP block.
type NetworkPolicyPeer struct {
	NamespaceSelector *Selector `json:"namespaceSelector,omitempty"`
	PodSelector       *Selector `json:"podSelector,omitempty"`
	IPBlock           *IPBlock  `json:"ipBlock,omitempty"`
}

// IPBlock is a CIDR with exceptions.
type IPBlock struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// NetworkPolicyPort is a protocol and a numeric port.
type NetworkPolicyPort struct {
	Protocol string `json:"protocol"`
	Port     int    `json:"port"`
}

// FQDNSpec is the spec of a networking.gke.io/v1alpha1 FQDNNetworkPolicy.
type FQDNSpec struct {
	PodSelector Selector     `json:"podSelector"`
	Egress      []FQDNEgress `json:"egress,omitempty"`
}

// FQDNEgress allows the matched names on the listed ports.
type FQDNEgress struct {
	Matches []FQDNMatch `json:"matches"`
	Ports   []FQDNPort  `json:"ports,omitempty"`
}

// FQDNMatch is an exact name or a pattern ("*.example.com": GKE matches one label for "*").
type FQDNMatch struct {
	Name    string `json:"name,omitempty"`
	Pattern string `json:"pattern,omitempty"`
}

// FQDNPort is a protocol and port of an FQDNEgress.
type FQDNPort struct {
	Protocol string `json:"protocol"`
	Port     int    `json:"port"`
}

// SpecMap returns o's spec as JSON-decoded maps and slices (what unstructured objects and
// Pulumi's untyped inputs hold).
func (o Object) SpecMap() (map[string]any, error) {
	b, err := json.Marshal(o.Spec)
	if err != nil {
		return nil, fmt.Errorf("encoding %s %s: %w", o.Kind, o.Name, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decoding %s %s: %w", o.Kind, o.Name, err)
	}
	return m, nil
}

// Unstructured returns o as an object in namespace (apiVersion, kind, metadata, spec), ready
// for a dynamic client's apply.
func (o Object) Unstructured(namespace string) (map[string]any, error) {
	spec, err := o.SpecMap()
	if err != nil {
		return nil, err
	}
	labels := map[string]any{}
	for k, v := range o.Labels {
		labels[k] = v
	}
	return map[string]any{
		"apiVersion": o.APIVersion,
		"kind":       o.Kind,
		"metadata":   map[string]any{"name": o.Name, "namespace": namespace, "labels": labels},
		"spec":       spec,
	}, nil
}
