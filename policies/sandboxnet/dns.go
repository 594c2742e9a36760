package sandboxnet

import (
	"fmt"
	"strings"
)

// ClusterDNS is where the cluster's pods send their DNS queries, and so where a bound
// sandbox whose allowlist names hosts must be allowed to send them (UDP and TCP 53 only). A
// policy that allows DNS to the kube-dns pods alone breaks every name allowlist on a cluster
// whose pods ask a node-local resolver: the query goes to a link-local address no pod
// selector matches (tektoncd/operator#4000 hit exactly this on GKE Dataplane V2).
type ClusterDNS string

// The DNS setups the policies can express.
const (
	// KubeDNS: pods ask the kube-dns Service, answered by the pods labelled k8s-app=kube-dns
	// in kube-system (CoreDNS on EKS, AKS, kubeadm and kind; kube-dns on GKE).
	KubeDNS ClusterDNS = "kube-dns"
	// NodeLocalDNS: NodeLocal DNSCache (the node-local-dns DaemonSet of
	// kubernetes/cluster/addons/dns/nodelocaldns; GKE's NodeLocal DNSCache add-on) answers on
	// the link-local NodeLocalDNSAddress on every node and forwards misses to kube-dns. Under
	// NetworkPolicy the peers are that address and the kube-dns pods. Under Cilium it is
	// supported only as Cilium documents it (Local Redirect Policy, "Node-local DNS cache"):
	// node-local-dns pods (not host-network) labelled k8s-app=node-local-dns, to which Cilium
	// redirects the queries for the kube-dns Service; a host-network cache is the node
	// itself, which the Cilium policies deny (DeniedEntities), and preflight refuses it.
	NodeLocalDNS ClusterDNS = "nodelocaldns"
	// GKECloudDNS: GKE with Cloud DNS for the cluster's DNS (--cluster-dns=clouddns): the
	// kubelet writes nameserver 169.254.169.254 into every pod's resolv.conf, the node's
	// metadata server answering DNS. That is also the cloud metadata address, which no
	// sandbox ever reaches otherwise: the rule allows it on UDP and TCP 53 only, never the
	// metadata port, and only on GKE (NetworkPolicy), where nothing else allows it.
	GKECloudDNS ClusterDNS = "gke-clouddns"
	// AKSLocalDNS: AKS LocalDNS, a DNS proxy on every node that answers the pods' cluster
	// DNS traffic (dnsPolicy ClusterFirst) on AKSLocalDNSAddress. It runs on the node, which
	// the Cilium policies deny: supported under NetworkPolicy (networkPolicy: kubernetes)
	// only.
	AKSLocalDNS ClusterDNS = "aks-localdns"
)

// ClusterDNSes lists every setup, in the order used by error messages.
var ClusterDNSes = []ClusterDNS{KubeDNS, NodeLocalDNS, GKECloudDNS, AKSLocalDNS}

// The addresses of the node-local resolvers.
const (
	// NodeLocalDNSAddress is NodeLocal DNSCache's default listen address (its -localip;
	// __PILLAR__LOCAL__DNS__ in the upstream manifest, 169.254.20.10 on GKE).
	NodeLocalDNSAddress = "169.254.20.10"
	// GKECloudDNSAddress is the GKE metadata server, which serves Cloud DNS to pods.
	GKECloudDNSAddress = "169.254.169.254"
	// AKSLocalDNSAddress is where AKS LocalDNS answers KubeDNS traffic (its cluster
	// listener; the node listener 169.254.10.10 serves dnsPolicy Default, which sandboxes do
	// not use).
	AKSLocalDNSAddress = "169.254.10.11"
)

// DNSPort is the only port any DNS rule opens.
const DNSPort = 53

// ParseClusterDNS returns the setup named s; empty is KubeDNS.
func ParseClusterDNS(s string) (ClusterDNS, error) {
	if s == "" {
		return KubeDNS, nil
	}
	for _, d := range ClusterDNSes {
		if string(d) == s {
			return d, nil
		}
	}
	names := make([]string, len(ClusterDNSes))
	for i, d := range ClusterDNSes {
		names[i] = string(d)
	}
	return "", fmt.Errorf("cluster DNS %q: want one of %s", s, strings.Join(names, ", "))
}

// CheckClusterDNS refuses a DNS setup that flavour f's policies cannot express.
func CheckClusterDNS(f Flavour, d ClusterDNS) error {
	d, err := ParseClusterDNS(string(d))
	if err != nil {
		return err
	}
	switch {
	case d == GKECloudDNS && f != GKE:
		return fmt.Errorf("cluster DNS %s under network policy %s: GKE Cloud DNS exists on GKE only (networkPolicy gke)", d, f)
	case d == AKSLocalDNS && f == Cilium:
		return fmt.Errorf("cluster DNS %s under network policy cilium: LocalDNS answers on the node itself, which the sandboxes' Cilium policies deny (toEntities host); disable LocalDNS on the sandbox node pool (LocalDNS profile mode Disabled) and use kube-dns, or use networkPolicy kubernetes (egress allowlists of IP addresses only)", d)
	}
	return nil
}

// dnsSetup returns n's DNS setup (KubeDNS when unset).
func (n Network) dnsSetup() ClusterDNS {
	if n.DNS == "" {
		return KubeDNS
	}
	return n.DNS
}

// npDNSPeers are where a sandbox sends DNS queries under d, as NetworkPolicy peers.
func npDNSPeers(d ClusterDNS) []NetworkPolicyPeer {
	kubeDNS := NetworkPolicyPeer{
		NamespaceSelector: &Selector{MatchLabels: map[string]string{namespaceNameLabel: "kube-system"}},
		PodSelector:       &Selector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
	}
	host := func(a string) NetworkPolicyPeer { return NetworkPolicyPeer{IPBlock: &IPBlock{CIDR: a + "/32"}} }
	switch d {
	case NodeLocalDNS:
		// The cache, and kube-dns for the queries that still go to its Service.
		return []NetworkPolicyPeer{host(NodeLocalDNSAddress), kubeDNS}
	case GKECloudDNS:
		return []NetworkPolicyPeer{host(GKECloudDNSAddress)}
	case AKSLocalDNS:
		return []NetworkPolicyPeer{host(AKSLocalDNSAddress)}
	}
	return []NetworkPolicyPeer{kubeDNS}
}

// ciliumDNSPeers are where a sandbox sends DNS queries under d, as Cilium endpoints: the
// DNS proxy sees the queries on the rule that selects their destination, so the rule's peer
// must be where the queries go.
func ciliumDNSPeers(d ClusterDNS) []Selector {
	peers := []Selector{ciliumKubeDNS()}
	if d == NodeLocalDNS {
		peers = append(peers, Selector{MatchLabels: map[string]string{"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "node-local-dns"}})
	}
	return peers
}
