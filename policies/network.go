// Package policies holds fusebox's security policies as data: the Cilium network policies of the
// sandbox namespace (default deny; DNS to kube-dns; the manager to the init port; agents to the
// data port; cloud metadata unreachable) and the ValidatingAdmissionPolicies with which the API
// server itself refuses sandbox pods that would weaken isolation. Components turn these values
// into Kubernetes objects; nothing here talks to a cluster or to Pulumi's engine.
package policies

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// CiliumNetworkPolicy API version and kind.
const (
	CiliumAPIVersion = "cilium.io/v2"
	CiliumPolicyKind = "CiliumNetworkPolicy"
)

// MetadataCIDRs are the cloud instance-metadata and host-agent addresses sandboxes must never
// reach: 169.254.169.254 (AWS, GCP, Azure IMDS), fd00:ec2::254 (AWS IMDS over IPv6),
// 169.254.170.2 (AWS container credentials) and 168.63.129.16 (Azure WireServer).
var MetadataCIDRs = []string{"169.254.169.254/32", "fd00:ec2::254/128", "169.254.170.2/32", "168.63.129.16/32"}

// CiliumNetworkPolicy is a namespaced cilium.io/v2 CiliumNetworkPolicy.
type CiliumNetworkPolicy struct {
	Name string
	Spec CiliumNetworkPolicySpec
}

// CiliumNetworkPolicySpec is the subset of a Cilium policy rule fusebox uses.
type CiliumNetworkPolicySpec struct {
	Description       string           `json:"description,omitempty"`
	EndpointSelector  EndpointSelector `json:"endpointSelector"`
	EnableDefaultDeny *DefaultDeny     `json:"enableDefaultDeny,omitempty"`
	Ingress           []IngressRule    `json:"ingress,omitempty"`
	Egress            []EgressRule     `json:"egress,omitempty"`
	EgressDeny        []EgressDenyRule `json:"egressDeny,omitempty"`
}

// DefaultDeny turns default deny on per direction for the selected endpoints.
type DefaultDeny struct {
	Ingress bool `json:"ingress"`
	Egress  bool `json:"egress"`
}

// EndpointSelector selects endpoints by labels; empty selects every pod of the namespace.
type EndpointSelector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// IngressRule admits traffic from the listed peers to the listed ports. An empty rule admits
// nothing.
type IngressRule struct {
	FromEndpoints []EndpointSelector `json:"fromEndpoints,omitempty"`
	FromCIDR      []string           `json:"fromCIDR,omitempty"`
	ToPorts       []PortRule         `json:"toPorts,omitempty"`
}

// EgressRule allows traffic to the listed peers and ports. An empty rule allows nothing.
type EgressRule struct {
	ToEndpoints []EndpointSelector `json:"toEndpoints,omitempty"`
	ToCIDRSet   []CIDRRule         `json:"toCIDRSet,omitempty"`
	ToFQDNs     []FQDNSelector     `json:"toFQDNs,omitempty"`
	ToPorts     []PortRule         `json:"toPorts,omitempty"`
}

// EgressDenyRule denies traffic regardless of any allow rule.
type EgressDenyRule struct {
	ToCIDR []string `json:"toCIDR,omitempty"`
}

// CIDRRule is a CIDR with exceptions.
type CIDRRule struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// FQDNSelector matches DNS names (toFQDNs works only with a DNS rule that observes lookups).
type FQDNSelector struct {
	MatchName    string `json:"matchName,omitempty"`
	MatchPattern string `json:"matchPattern,omitempty"`
}

// PortRule lists ports and optional L7 rules.
type PortRule struct {
	Ports []PortProtocol `json:"ports"`
	Rules *L7Rules       `json:"rules,omitempty"`
}

// PortProtocol is a port and protocol (TCP, UDP, ANY).
type PortProtocol struct {
	Port     string `json:"port"`
	Protocol string `json:"protocol"`
}

// L7Rules are the L7 rules fusebox uses: DNS visibility.
type L7Rules struct {
	DNS []DNSRule `json:"dns,omitempty"`
}

// DNSRule lets matching names be looked up (and observed, for toFQDNs).
type DNSRule struct {
	MatchPattern string `json:"matchPattern,omitempty"`
}

// SandboxNetwork parameterises SandboxNetworkPolicies.
type SandboxNetwork struct {
	// SandboxNamespace and ManagerNamespace are required.
	SandboxNamespace string
	ManagerNamespace string
	// InitPort and DataPort are the sandbox server's listeners.
	InitPort, DataPort int
	// ManagerLabels select the manager's pods (in ManagerNamespace). Required.
	ManagerLabels map[string]string
	// DataClientNamespaces are namespaces whose pods (the agents) may reach the data port; the
	// manager namespace always may.
	DataClientNamespaces []string
	// DataClientCIDRs may reach the data port from outside the cluster.
	DataClientCIDRs []string
	// EgressCIDRs and EgressFQDNs are the egress defaults: destinations every sandbox may reach
	// besides DNS (default none). Metadata addresses stay unreachable whatever is listed.
	EgressCIDRs []string
	EgressFQDNs []string
}

// ErrInvalidNetwork is wrapped by SandboxNetworkPolicies' errors.
var ErrInvalidNetwork = errors.New("invalid sandbox network settings")

// Names of the sandbox namespace's policies.
const (
	PolicyDefaultDeny  = "fusebox-default-deny"
	PolicyDenyMetadata = "fusebox-deny-metadata"
	PolicyAllowDNS     = "fusebox-allow-dns"
	PolicyAllowInit    = "fusebox-allow-manager-init"
	PolicyAllowData    = "fusebox-allow-agents-data"
	PolicyAllowEgress  = "fusebox-allow-egress-defaults"
)

// SandboxNetworkPolicies returns the policies of the sandbox namespace. Every policy selects all
// pods of the namespace; together they allow only: DNS to kube-dns, the manager's pods to the
// init port, the data clients to the data port, and the configured egress defaults. The
// metadata deny is an egressDeny, which wins over every allow.
func SandboxNetworkPolicies(n SandboxNetwork) ([]CiliumNetworkPolicy, error) {
	if err := n.validate(); err != nil {
		return nil, err
	}
	all := EndpointSelector{}
	tcp := func(port int) []PortRule {
		return []PortRule{{Ports: []PortProtocol{{Port: strconv.Itoa(port), Protocol: "TCP"}}}}
	}
	manager := EndpointSelector{MatchLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": n.ManagerNamespace}}
	for k, v := range n.ManagerLabels {
		manager.MatchLabels["k8s:"+k] = v
	}

	out := []CiliumNetworkPolicy{
		{Name: PolicyDefaultDeny, Spec: CiliumNetworkPolicySpec{
			Description:       "fusebox: sandboxes get no traffic but what other fusebox policies allow",
			EndpointSelector:  all,
			EnableDefaultDeny: &DefaultDeny{Ingress: true, Egress: true},
			Ingress:           []IngressRule{{}},
			Egress:            []EgressRule{{}},
		}},
		{Name: PolicyDenyMetadata, Spec: CiliumNetworkPolicySpec{
			Description:      "fusebox: cloud metadata and host agents are never reachable from sandboxes",
			EndpointSelector: all,
			EgressDeny:       []EgressDenyRule{{ToCIDR: append([]string(nil), MetadataCIDRs...)}},
		}},
		{Name: PolicyAllowDNS, Spec: CiliumNetworkPolicySpec{
			Description:      "fusebox: DNS to kube-dns only (the DNS rule also makes toFQDNs work)",
			EndpointSelector: all,
			Egress: []EgressRule{{
				ToEndpoints: []EndpointSelector{{MatchLabels: map[string]string{
					"k8s:io.kubernetes.pod.namespace": "kube-system",
					"k8s:k8s-app":                     "kube-dns",
				}}},
				ToPorts: []PortRule{{
					Ports: []PortProtocol{{Port: "53", Protocol: "ANY"}},
					Rules: &L7Rules{DNS: []DNSRule{{MatchPattern: "*"}}},
				}},
			}},
		}},
		{Name: PolicyAllowInit, Spec: CiliumNetworkPolicySpec{
			Description:      "fusebox: only the manager reaches the init port",
			EndpointSelector: all,
			Ingress:          []IngressRule{{FromEndpoints: []EndpointSelector{manager}, ToPorts: tcp(n.InitPort)}},
		}},
	}

	data := []IngressRule{{FromEndpoints: []EndpointSelector{{MatchLabels: map[string]string{
		"k8s:io.kubernetes.pod.namespace": n.ManagerNamespace,
	}}}, ToPorts: tcp(n.DataPort)}}
	for _, ns := range n.DataClientNamespaces {
		data = append(data, IngressRule{
			FromEndpoints: []EndpointSelector{{MatchLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": ns}}},
			ToPorts:       tcp(n.DataPort),
		})
	}
	if len(n.DataClientCIDRs) > 0 {
		data = append(data, IngressRule{FromCIDR: append([]string(nil), n.DataClientCIDRs...), ToPorts: tcp(n.DataPort)})
	}
	out = append(out, CiliumNetworkPolicy{Name: PolicyAllowData, Spec: CiliumNetworkPolicySpec{
		Description:      "fusebox: agents reach the data port",
		EndpointSelector: all,
		Ingress:          data,
	}})

	if len(n.EgressCIDRs) > 0 || len(n.EgressFQDNs) > 0 {
		var rules []EgressRule
		if len(n.EgressCIDRs) > 0 {
			var set []CIDRRule
			for _, c := range n.EgressCIDRs {
				set = append(set, CIDRRule{CIDR: c, Except: metadataWithin(c)})
			}
			rules = append(rules, EgressRule{ToCIDRSet: set})
		}
		if len(n.EgressFQDNs) > 0 {
			var fq []FQDNSelector
			for _, f := range n.EgressFQDNs {
				if strings.Contains(f, "*") {
					fq = append(fq, FQDNSelector{MatchPattern: f})
				} else {
					fq = append(fq, FQDNSelector{MatchName: f})
				}
			}
			rules = append(rules, EgressRule{ToFQDNs: fq})
		}
		out = append(out, CiliumNetworkPolicy{Name: PolicyAllowEgress, Spec: CiliumNetworkPolicySpec{
			Description:      "fusebox: egress defaults of this installation",
			EndpointSelector: all,
			Egress:           rules,
		}})
	}
	return out, nil
}

func (n SandboxNetwork) validate() error {
	switch {
	case n.SandboxNamespace == "" || n.ManagerNamespace == "":
		return fmt.Errorf("%w: sandbox and manager namespaces are required", ErrInvalidNetwork)
	case len(n.ManagerLabels) == 0:
		return fmt.Errorf("%w: manager labels are required (an empty selector would admit every pod)", ErrInvalidNetwork)
	case n.InitPort <= 0 || n.InitPort > 65535 || n.DataPort <= 0 || n.DataPort > 65535:
		return fmt.Errorf("%w: init and data ports must be 1-65535", ErrInvalidNetwork)
	}
	for _, c := range append(append([]string(nil), n.DataClientCIDRs...), n.EgressCIDRs...) {
		if _, err := netip.ParsePrefix(c); err != nil {
			return fmt.Errorf("%w: CIDR %q: %v", ErrInvalidNetwork, c, err)
		}
	}
	for _, f := range n.EgressFQDNs {
		if f == "" || strings.ContainsAny(f, " /:") {
			return fmt.Errorf("%w: FQDN %q", ErrInvalidNetwork, f)
		}
	}
	return nil
}

// metadataWithin returns the metadata CIDRs inside cidr, to list as exceptions (the egressDeny
// already blocks them; the exception keeps the allow rule honest to readers).
func metadataWithin(cidr string) []string {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range MetadataCIDRs {
		mp := netip.MustParsePrefix(m)
		if p.Addr().Is4() == mp.Addr().Is4() && p.Bits() <= mp.Bits() && p.Contains(mp.Addr()) {
			out = append(out, m)
		}
	}
	return out
}
