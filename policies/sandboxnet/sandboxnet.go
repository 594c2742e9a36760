// Package sandboxnet is the one source of truth for the network policies of fusebox's sandbox
// namespace: the policy names and specs that the Pulumi program creates for the namespace
// (NamespacePolicies) and the kube allocator creates per bound sandbox (SandboxPolicies), and
// that the manager checks before it starts (DefaultDeny).
//
// One intent, rendered three ways (Flavour):
//   - Cilium: CiliumNetworkPolicy (cilium.io/v2), where Cilium runs as the CNI (EKS with
//     Cilium, AKS with Azure CNI powered by Cilium). Names are allowed with toFQDNs, which
//     needs a DNS rule that Cilium's DNS proxy enforces; denies are egressDeny rules.
//   - GKE: Kubernetes NetworkPolicy for L3/L4 plus GKE's FQDNNetworkPolicy
//     (networking.gke.io/v1alpha1) for names: GKE Dataplane V2 serves no namespaced
//     CiliumNetworkPolicy.
//   - Kubernetes: plain NetworkPolicy (kube-router, Calico, ...). Egress allowlists take IP
//     addresses only; a name is refused with ErrFQDNUnsupported.
//
// The intent: every pod of the sandbox namespace denies all traffic by default, in both
// directions; the manager's pods reach the init port of every sandbox (sFuse happens before a
// sandbox is bound); the agents (pods of the agent namespaces with the agent labels, or the
// agent CIDRs) reach the data port of every sandbox; cloud metadata and host agents are never
// reachable, and on Cilium neither are the node, the other nodes and the API server. A warm,
// unbound sandbox reaches nothing (not even DNS). A bound sandbox whose allocation allows
// egress gets one more policy of its own: it reaches exactly its allowlist, plus DNS when the
// allowlist names hosts; on Cilium the private ranges it does not allowlist are denied
// explicitly. An allocation without an allowlist gets no policy of its own.
//
// The agents' rule is namespace-wide, not per sandbox, because a policy made at allocation
// races the agent's first connection: until the cluster's network plugin enforces it, the
// default deny drops the agent's SYN and the connection waits for TCP's retransmission (about
// a second). Opening the data port of warm sandboxes to the agents admits nothing: a sandbox's
// data listener serves no byte before its fuse blows, and afterwards only TLS 1.3 with the
// pinned agent key (sandbox-server/fuse). The init port stays the manager's alone.
//
// Nothing here talks to a cluster or to Pulumi: the values are plain data that the components
// and the allocator turn into objects (Object.Unstructured).
package sandboxnet

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Flavour is how a stack's cluster enforces network policy.
type Flavour string

// The flavours.
const (
	Cilium     Flavour = "cilium"
	GKE        Flavour = "gke"
	Kubernetes Flavour = "kubernetes"
)

// Flavours lists every flavour, in the order used by error messages.
var Flavours = []Flavour{Cilium, GKE, Kubernetes}

// ParseFlavour returns the flavour named s.
func ParseFlavour(s string) (Flavour, error) {
	for _, f := range Flavours {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("network policy flavour %q: want cilium, gke or kubernetes", s)
}

// SupportsFQDN reports whether egress allowlists may name hosts under f.
func (f Flavour) SupportsFQDN() bool { return f == Cilium || f == GKE }

// API versions, kinds and resources of the objects rendered.
const (
	CiliumAPIVersion        = "cilium.io/v2"
	CiliumKind              = "CiliumNetworkPolicy"
	NetworkPolicyAPIVersion = "networking.k8s.io/v1"
	NetworkPolicyKind       = "NetworkPolicy"
	FQDNAPIVersion          = "networking.gke.io/v1alpha1"
	FQDNKind                = "FQDNNetworkPolicy"
)

// Names of the namespace-wide policies (the same under every flavour that renders them).
const (
	// DefaultDenyName is the namespace-wide default deny the manager refuses to start without.
	DefaultDenyName = "fusebox-sandbox-default-deny"
	// DenyInternalName denies cloud metadata, the nodes and the API server (Cilium only:
	// NetworkPolicy has no deny rules; there the default deny covers them).
	DenyInternalName = "fusebox-sandbox-deny-internal"
	// AllowManagerInitName admits the manager's pods to every sandbox's init port.
	AllowManagerInitName = "fusebox-sandbox-allow-manager-init"
	// AllowAgentsDataName admits the agents to every sandbox's data port.
	AllowAgentsDataName = "fusebox-sandbox-allow-agents-data"
)

// SandboxPolicyName is the name of sandbox id's own policies (one per kind).
func SandboxPolicyName(id string) string { return "fusebox-sandbox-" + id }

// Labels every sandbox pod carries (set by the kube allocator).
const (
	LabelApp       = "app.kubernetes.io/name"
	AppName        = "fusebox-sandbox"
	LabelSandboxID = "fusebox.dev/sandbox-id"
	// LabelPartOf marks every policy rendered here.
	LabelPartOf = "app.kubernetes.io/part-of"
)

// MetadataCIDRs are the cloud instance-metadata and host-agent addresses no sandbox ever
// reaches, whatever its allowlist says: 169.254.169.254 (AWS, GCP, Azure IMDS), fd00:ec2::254
// (AWS IMDS over IPv6), 169.254.170.2 (ECS/EKS container credentials), 169.254.170.23 and
// fd00:ec2::23 (EKS Pod Identity agent), 168.63.129.16 (Azure WireServer).
var MetadataCIDRs = []string{
	"169.254.169.254/32", "fd00:ec2::254/128", "169.254.170.2/32",
	"169.254.170.23/32", "fd00:ec2::23/128", "168.63.129.16/32",
}

// PrivateCIDRs are the ranges a bound sandbox reaches only where its allowlist names an
// address in them: RFC 1918, carrier-grade NAT (RFC 6598), link-local, IPv6 unique-local and
// link-local. On Cilium they are denied explicitly (egressDeny with the allowlisted addresses
// as exceptions); elsewhere the default deny covers them.
var PrivateCIDRs = []string{
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
	"fc00::/7", "fe80::/10",
}

// DeniedEntities are the Cilium entities no sandbox reaches: its own node (and so the
// kubelet), the other nodes, and the API server.
var DeniedEntities = []string{"host", "remote-node", "kube-apiserver"}

// Errors.
var (
	// ErrInvalid is wrapped by the errors of an unusable Network.
	ErrInvalid = errors.New("invalid sandbox network settings")
	// ErrFQDNUnsupported is wrapped when an allowlist names a host under a flavour whose
	// policies take IP addresses only.
	ErrFQDNUnsupported = errors.New("egress allowlist names a host, but this cluster's network policies take IP addresses only")
	// ErrDeniedDestination is wrapped when an allowlist names an address no sandbox may reach.
	ErrDeniedDestination = errors.New("egress allowlist names an address no sandbox may reach")
)

// Network is the intent's parameters.
type Network struct {
	// SandboxNamespace holds the sandbox pods; ManagerNamespace the manager's. Required.
	SandboxNamespace string
	ManagerNamespace string
	// ManagerLabels select the manager's pods in ManagerNamespace. Required.
	ManagerLabels map[string]string
	// AgentNamespaces are the namespaces whose pods (with AgentLabels) may reach a sandbox's
	// data port; AgentCIDRs may reach it from outside the cluster. At least one of the two is
	// required.
	AgentNamespaces []string
	AgentLabels     map[string]string
	AgentCIDRs      []string
	// InitPort and DataPort are the sandbox server's listeners (1-65535).
	InitPort, DataPort int
	// DNS is where the cluster's pods send DNS queries (empty: KubeDNS): the peer of the
	// DNS rule of a sandbox whose allowlist names hosts.
	DNS ClusterDNS
}

// Validate checks n.
func (n Network) Validate() error {
	switch {
	case n.SandboxNamespace == "" || n.ManagerNamespace == "":
		return fmt.Errorf("%w: sandbox and manager namespaces are required", ErrInvalid)
	case n.SandboxNamespace == n.ManagerNamespace:
		return fmt.Errorf("%w: the manager cannot share the sandbox namespace %s", ErrInvalid, n.SandboxNamespace)
	case len(n.ManagerLabels) == 0:
		return fmt.Errorf("%w: manager labels are required (an empty selector would admit every pod of the manager namespace)", ErrInvalid)
	case len(n.AgentNamespaces) == 0 && len(n.AgentCIDRs) == 0:
		return fmt.Errorf("%w: agent namespaces (or agent CIDRs) are required: without them no agent can reach its sandbox", ErrInvalid)
	case n.InitPort <= 0 || n.InitPort > 65535 || n.DataPort <= 0 || n.DataPort > 65535 || n.InitPort == n.DataPort:
		return fmt.Errorf("%w: init and data ports must be two different ports in 1-65535", ErrInvalid)
	}
	if _, err := ParseClusterDNS(string(n.DNS)); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for _, ns := range n.AgentNamespaces {
		if ns == "" {
			return fmt.Errorf("%w: empty agent namespace", ErrInvalid)
		}
		if ns == n.SandboxNamespace {
			return fmt.Errorf("%w: agents cannot live in the sandbox namespace %s", ErrInvalid, ns)
		}
	}
	for _, c := range n.AgentCIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			return fmt.Errorf("%w: agent CIDR %q: %v", ErrInvalid, c, err)
		}
	}
	return nil
}

// Object is one rendered policy: its kind, name, labels and spec (JSON-encodable with the
// API's field names).
type Object struct {
	APIVersion, Kind, Name string
	Labels                 map[string]string
	Spec                   any
}

// NamespacePolicies returns the sandbox namespace's policies under f: the default deny
// (DefaultDenyName), the manager's access to the init port (AllowManagerInitName), the agents'
// access to the data port (AllowAgentsDataName) and, on Cilium, the deny of metadata, nodes
// and API server (DenyInternalName).
func NamespacePolicies(f Flavour, n Network) ([]Object, error) {
	if _, err := ParseFlavour(string(f)); err != nil {
		return nil, err
	}
	if err := n.Validate(); err != nil {
		return nil, err
	}
	if err := CheckClusterDNS(f, n.DNS); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	dd, err := DefaultDeny(f)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{LabelPartOf: "fusebox"}
	if f == Cilium {
		return []Object{dd,
			{APIVersion: CiliumAPIVersion, Kind: CiliumKind, Name: DenyInternalName, Labels: labels, Spec: &CiliumSpec{
				Description:      "fusebox: cloud metadata, the nodes (kubelet) and the API server are never reachable from sandboxes",
				EndpointSelector: Selector{},
				EgressDeny: []CiliumEgressDeny{
					{ToCIDR: slices.Clone(MetadataCIDRs)},
					{ToEntities: slices.Clone(DeniedEntities)},
				},
			}},
			{APIVersion: CiliumAPIVersion, Kind: CiliumKind, Name: AllowManagerInitName, Labels: labels, Spec: &CiliumSpec{
				Description:      "fusebox: only the manager reaches the init port",
				EndpointSelector: Selector{},
				Ingress:          []CiliumIngress{{FromEndpoints: []Selector{ciliumPods(n.ManagerNamespace, n.ManagerLabels)}, ToPorts: ciliumTCP(n.InitPort)}},
			}},
			{APIVersion: CiliumAPIVersion, Kind: CiliumKind, Name: AllowAgentsDataName, Labels: labels, Spec: &CiliumSpec{
				Description:      "fusebox: the agents reach the data port (served only to the agent whose key a sandbox pinned)",
				EndpointSelector: Selector{},
				Ingress:          ciliumAgents(n),
			}},
		}, nil
	}
	return []Object{dd,
		{APIVersion: NetworkPolicyAPIVersion, Kind: NetworkPolicyKind, Name: AllowManagerInitName, Labels: labels, Spec: &NetworkPolicySpec{
			PodSelector: Selector{},
			PolicyTypes: []string{"Ingress"},
			Ingress:     []NetworkPolicyIngress{{From: []NetworkPolicyPeer{npPods(n.ManagerNamespace, n.ManagerLabels)}, Ports: npTCP(n.InitPort)}},
		}},
		{APIVersion: NetworkPolicyAPIVersion, Kind: NetworkPolicyKind, Name: AllowAgentsDataName, Labels: labels, Spec: &NetworkPolicySpec{
			PodSelector: Selector{},
			PolicyTypes: []string{"Ingress"},
			Ingress:     []NetworkPolicyIngress{{From: npAgents(n), Ports: npTCP(n.DataPort)}},
		}},
	}, nil
}

// ciliumAgents are the agents' ingress rules to the data port.
func ciliumAgents(n Network) []CiliumIngress {
	var in []CiliumIngress
	for _, ns := range n.AgentNamespaces {
		in = append(in, CiliumIngress{FromEndpoints: []Selector{ciliumPods(ns, n.AgentLabels)}, ToPorts: ciliumTCP(n.DataPort)})
	}
	if len(n.AgentCIDRs) > 0 {
		in = append(in, CiliumIngress{FromCIDR: slices.Clone(n.AgentCIDRs), ToPorts: ciliumTCP(n.DataPort)})
	}
	return in
}

// npAgents are the agents as NetworkPolicy peers.
func npAgents(n Network) []NetworkPolicyPeer {
	var from []NetworkPolicyPeer
	for _, ns := range n.AgentNamespaces {
		from = append(from, npPods(ns, n.AgentLabels))
	}
	for _, c := range n.AgentCIDRs {
		from = append(from, NetworkPolicyPeer{IPBlock: &IPBlock{CIDR: c}})
	}
	return from
}

// DefaultDeny returns the namespace-wide default deny under f: it selects every pod of the
// namespace and allows nothing in either direction.
func DefaultDeny(f Flavour) (Object, error) {
	labels := map[string]string{LabelPartOf: "fusebox"}
	switch f {
	case Cilium:
		return Object{APIVersion: CiliumAPIVersion, Kind: CiliumKind, Name: DefaultDenyName, Labels: labels, Spec: &CiliumSpec{
			Description:       "fusebox: sandboxes get no traffic but what other fusebox policies allow",
			EndpointSelector:  Selector{},
			EnableDefaultDeny: &DefaultDenyModes{Ingress: true, Egress: true},
			Ingress:           []CiliumIngress{{}},
			Egress:            []CiliumEgress{{}},
		}}, nil
	case GKE, Kubernetes:
		return Object{APIVersion: NetworkPolicyAPIVersion, Kind: NetworkPolicyKind, Name: DefaultDenyName, Labels: labels, Spec: &NetworkPolicySpec{
			PodSelector: Selector{},
			PolicyTypes: []string{"Ingress", "Egress"},
		}}, nil
	}
	_, err := ParseFlavour(string(f))
	return Object{}, err
}

// SandboxPolicies returns bound sandbox id's own policies under f, all named
// SandboxPolicyName(id) and selecting its pod by LabelSandboxID: its egress. allow holds the
// allocation's canonical "host:port" entries (egress.Allowlist.Entries: "name:port",
// "*.suffix:port", "1.2.3.4:port", "[2001:db8::1]:port"); without any there is no policy (nil:
// the namespace's policies are all the sandbox needs). Entries naming a metadata address are
// refused (ErrDeniedDestination); under Kubernetes, entries naming a host are refused
// (ErrFQDNUnsupported).
//
// Cilium: one CiliumNetworkPolicy: egress per port to the names (toFQDNs) and addresses
// (toCIDR), a DNS rule to the cluster's DNS (Network.DNS) that lets exactly the allowlisted
// names be looked up (none when no name is allowed), and egressDeny of the PrivateCIDRs except
// the allowlisted addresses in them. GKE: a NetworkPolicy (DNS to the cluster's DNS when names
// are allowed; the addresses) and, when names are allowed, an FQDNNetworkPolicy with them.
// Kubernetes: the NetworkPolicy. A DNS setup f cannot express is refused (CheckClusterDNS).
func SandboxPolicies(f Flavour, n Network, id string, allow []string) ([]Object, error) {
	if _, err := ParseFlavour(string(f)); err != nil {
		return nil, err
	}
	if err := n.Validate(); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, fmt.Errorf("%w: empty sandbox id", ErrInvalid)
	}
	if err := CheckClusterDNS(f, n.DNS); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	groups, err := allowedGroups(f, allow)
	if err != nil {
		return nil, err
	}
	if len(groups) == 0 {
		return nil, nil
	}
	p := sandboxPolicy{
		dns:    n.dnsSetup(),
		id:     id,
		name:   SandboxPolicyName(id),
		labels: map[string]string{LabelPartOf: "fusebox", LabelApp: AppName, LabelSandboxID: id},
		self:   Selector{MatchLabels: map[string]string{LabelSandboxID: id}},
		groups: groups,
	}
	if f == Cilium {
		return []Object{p.cilium()}, nil
	}
	return p.networkPolicies(), nil
}

// sandboxPolicy is one sandbox's allowlist, grouped by port, to render as its policies.
type sandboxPolicy struct {
	dns      ClusterDNS
	id, name string
	labels   map[string]string
	self     Selector // the sandbox's pod
	groups   []portGroup
}

// hasNames reports whether the allowlist names any host (then the sandbox may look names
// up).
func (p sandboxPolicy) hasNames() bool {
	return slices.ContainsFunc(p.groups, func(g portGroup) bool { return len(g.names) > 0 })
}

// cilium is the sandbox's CiliumNetworkPolicy: DNS for exactly the allowlisted names, the
// names and addresses on their ports, and the private ranges denied except the allowlisted
// addresses in them.
func (p sandboxPolicy) cilium() Object {
	spec := &CiliumSpec{
		Description:      "fusebox: sandbox " + p.id + ": exactly its allowlist",
		EndpointSelector: p.self,
	}
	if p.hasNames() {
		spec.Egress = append(spec.Egress, p.ciliumDNS())
	}
	var ips []netip.Addr
	for _, g := range p.groups {
		tp := ciliumTCP(g.port)
		if len(g.names) > 0 {
			var fq []FQDNSelector
			for _, h := range g.names {
				fq = append(fq, h.cilium())
			}
			spec.Egress = append(spec.Egress, CiliumEgress{ToFQDNs: fq, ToPorts: tp})
		}
		if len(g.ips) > 0 {
			var cidrs []string
			for _, a := range g.ips {
				cidrs = append(cidrs, netip.PrefixFrom(a, a.BitLen()).String())
				ips = append(ips, a)
			}
			spec.Egress = append(spec.Egress, CiliumEgress{ToCIDR: cidrs, ToPorts: tp})
		}
	}
	spec.EgressDeny = []CiliumEgressDeny{{ToCIDRSet: privateExcept(ips)}}
	return Object{APIVersion: CiliumAPIVersion, Kind: CiliumKind, Name: p.name, Labels: p.labels, Spec: spec}
}

// ciliumDNS lets the sandbox ask the cluster's DNS (ciliumDNSPeers) for exactly the
// allowlisted names.
func (p sandboxPolicy) ciliumDNS() CiliumEgress {
	var lookups []FQDNSelector
	for _, g := range p.groups {
		for _, h := range g.names {
			if !slices.Contains(lookups, h.cilium()) {
				lookups = append(lookups, h.cilium())
			}
		}
	}
	return CiliumEgress{
		ToEndpoints: ciliumDNSPeers(p.dns),
		ToPorts: []CiliumPortRule{{
			Ports: []PortProtocol{{Port: "53", Protocol: "UDP"}, {Port: "53", Protocol: "TCP"}},
			Rules: &L7Rules{DNS: lookups},
		}},
	}
}

// privateExcept denies PrivateCIDRs, each except the addresses of ips in it.
func privateExcept(ips []netip.Addr) []CIDRRule {
	var deny []CIDRRule
	for _, c := range PrivateCIDRs {
		p := netip.MustParsePrefix(c)
		r := CIDRRule{CIDR: c}
		for _, a := range ips {
			if p.Contains(a) {
				x := netip.PrefixFrom(a, a.BitLen()).String()
				if !slices.Contains(r.Except, x) {
					r.Except = append(r.Except, x)
				}
			}
		}
		deny = append(deny, r)
	}
	return deny
}

// networkPolicies are the sandbox's NetworkPolicy (the cluster's DNS, npDNSPeers, when it
// names hosts; the addresses on their ports) and, for names (GKE), its FQDNNetworkPolicy.
func (p sandboxPolicy) networkPolicies() []Object {
	np := &NetworkPolicySpec{PodSelector: p.self, PolicyTypes: []string{"Egress"}}
	if p.hasNames() {
		// One rule: any of the DNS peers, on port 53 only (a node-local resolver's address
		// may be the metadata server's, whose other ports stay denied).
		np.Egress = append(np.Egress, NetworkPolicyEgress{
			To:    npDNSPeers(p.dns),
			Ports: []NetworkPolicyPort{{Protocol: "UDP", Port: DNSPort}, {Protocol: "TCP", Port: DNSPort}},
		})
	}
	var fqdn *FQDNSpec
	for _, g := range p.groups {
		if len(g.ips) > 0 {
			var to []NetworkPolicyPeer
			for _, a := range g.ips {
				to = append(to, NetworkPolicyPeer{IPBlock: &IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}})
			}
			np.Egress = append(np.Egress, NetworkPolicyEgress{To: to, Ports: npTCP(g.port)})
		}
		if len(g.names) > 0 {
			if fqdn == nil {
				fqdn = &FQDNSpec{PodSelector: p.self}
			}
			var m []FQDNMatch
			for _, h := range g.names {
				m = append(m, h.gke())
			}
			fqdn.Egress = append(fqdn.Egress, FQDNEgress{Matches: m, Ports: []FQDNPort{{Protocol: "TCP", Port: g.port}}})
		}
	}
	out := []Object{{APIVersion: NetworkPolicyAPIVersion, Kind: NetworkPolicyKind, Name: p.name, Labels: p.labels, Spec: np}}
	if fqdn != nil {
		out = append(out, Object{APIVersion: FQDNAPIVersion, Kind: FQDNKind, Name: p.name, Labels: p.labels, Spec: fqdn})
	}
	return out
}

// SandboxKinds are the kinds SandboxPolicies may render under f, for deletion.
func SandboxKinds(f Flavour) []Object {
	switch f {
	case Cilium:
		return []Object{{APIVersion: CiliumAPIVersion, Kind: CiliumKind}}
	case GKE:
		return []Object{{APIVersion: NetworkPolicyAPIVersion, Kind: NetworkPolicyKind}, {APIVersion: FQDNAPIVersion, Kind: FQDNKind}}
	}
	return []Object{{APIVersion: NetworkPolicyAPIVersion, Kind: NetworkPolicyKind}}
}

// CheckAllowlist reports whether SandboxPolicies would accept allow under f, without
// rendering anything: the manager asks before it spends a warm sandbox on an allocation.
func CheckAllowlist(f Flavour, allow []string) error {
	_, err := allowedGroups(f, allow)
	return err
}

// allowedGroups groups allow by port, refusing names where f cannot select by name.
func allowedGroups(f Flavour, allow []string) ([]portGroup, error) {
	groups, err := groupAllowlist(allow)
	if err != nil {
		return nil, err
	}
	if !f.SupportsFQDN() {
		for _, g := range groups {
			if len(g.names) > 0 {
				return nil, fmt.Errorf("%w: %q (allow its IP address instead, e.g. 192.0.2.10:%d)", ErrFQDNUnsupported, g.names[0].String(g.port), g.port)
			}
		}
	}
	return groups, nil
}

// host is an allowlisted name: exact, or a wildcard "*.suffix".
type host struct {
	name     string
	wildcard bool
}

func (h host) String(port int) string {
	if h.wildcard {
		return fmt.Sprintf("*.%s:%d", h.name, port)
	}
	return fmt.Sprintf("%s:%d", h.name, port)
}

func (h host) cilium() FQDNSelector {
	if h.wildcard {
		return FQDNSelector{MatchPattern: "*." + h.name}
	}
	return FQDNSelector{MatchName: h.name}
}

func (h host) gke() FQDNMatch {
	if h.wildcard {
		return FQDNMatch{Pattern: "*." + h.name}
	}
	return FQDNMatch{Name: h.name}
}

// portGroup is the allowlist's destinations on one port, in first-seen order.
type portGroup struct {
	port  int
	names []host
	ips   []netip.Addr
}

// groupAllowlist groups canonical allowlist entries by port (ports in first-seen order).
func groupAllowlist(allow []string) ([]portGroup, error) {
	var out []portGroup
	idx := map[int]int{}
	for _, e := range allow {
		i := strings.LastIndexByte(e, ':')
		if i <= 0 {
			return nil, fmt.Errorf("%w: allowlist entry %q is not host:port", ErrInvalid, e)
		}
		h, ps := e[:i], e[i+1:]
		var port int
		if _, err := fmt.Sscanf(ps, "%d", &port); err != nil || port < 1 || port > 65535 || fmt.Sprint(port) != ps {
			return nil, fmt.Errorf("%w: allowlist entry %q: port %q", ErrInvalid, e, ps)
		}
		j, ok := idx[port]
		if !ok {
			j = len(out)
			idx[port] = j
			out = append(out, portGroup{port: port})
		}
		g := &out[j]
		if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
			a = a.Unmap()
			for _, m := range MetadataCIDRs {
				if netip.MustParsePrefix(m).Contains(a) {
					return nil, fmt.Errorf("%w: %q is cloud metadata or a host agent", ErrDeniedDestination, e)
				}
			}
			if !slices.Contains(g.ips, a) {
				g.ips = append(g.ips, a)
			}
			continue
		}
		if h == "" || strings.ContainsAny(h, " /[]") || strings.Contains(h[min(1, len(h)):], "*") {
			return nil, fmt.Errorf("%w: allowlist entry %q", ErrInvalid, e)
		}
		hh := host{name: h}
		if rest, ok := strings.CutPrefix(h, "*."); ok {
			hh = host{name: rest, wildcard: true}
		} else if strings.HasPrefix(h, "*") {
			return nil, fmt.Errorf("%w: allowlist entry %q", ErrInvalid, e)
		}
		if !slices.Contains(g.names, hh) {
			g.names = append(g.names, hh)
		}
	}
	return out, nil
}

// namespaceNameLabel is the label the API server sets on every namespace to its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// ciliumPods selects the pods with labels in namespace ns (Cilium endpoint labels).
func ciliumPods(ns string, labels map[string]string) Selector {
	m := map[string]string{"k8s:io.kubernetes.pod.namespace": ns}
	for k, v := range labels {
		m["k8s:"+k] = v
	}
	return Selector{MatchLabels: m}
}

func ciliumKubeDNS() Selector {
	return Selector{MatchLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}
}

func ciliumTCP(port int) []CiliumPortRule {
	return []CiliumPortRule{{Ports: []PortProtocol{{Port: fmt.Sprint(port), Protocol: "TCP"}}}}
}

// npPods selects the pods with labels (every pod for none) in namespace ns.
func npPods(ns string, labels map[string]string) NetworkPolicyPeer {
	p := NetworkPolicyPeer{NamespaceSelector: &Selector{MatchLabels: map[string]string{namespaceNameLabel: ns}}}
	if len(labels) > 0 {
		p.PodSelector = &Selector{MatchLabels: cloneMap(labels)}
	} else {
		p.PodSelector = &Selector{}
	}
	return p
}

func npTCP(port int) []NetworkPolicyPort {
	return []NetworkPolicyPort{{Protocol: "TCP", Port: port}}
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
