package preflight

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
)

// NodeLocal DNSCache's DaemonSet (the upstream addon's and GKE's name).
const (
	NodeLocalDNSNamespace = "kube-system"
	NodeLocalDNSName      = "node-local-dns"
)

// dnsProblems: the DNS setup the sandboxes' DNS rules are rendered for (fusebox:clusterDNS)
// is the cluster's, as far as the cluster shows it: NodeLocal DNSCache is a DaemonSet, so
// its presence with kube-dns, or its absence with nodelocaldns, is refused; with
// nodelocaldns it must listen on the address the rules allow and, under Cilium, run as pods
// (Cilium's Local Redirect Policy setup), not on the host, which Cilium's policies deny. GKE
// Cloud DNS and AKS LocalDNS live outside the cluster's objects (the kubelet's clusterDNS and
// the node's own service): docs/deploy.md says how to tell.
func dnsProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	if !s.Flavour.SupportsFQDN() {
		return nil, nil // no allowlist names a host, so no sandbox gets a DNS rule
	}
	dns := s.ClusterDNS
	if dns == "" {
		dns = sandboxnet.KubeDNS
	}
	ds, err := c.DaemonSet(ctx, NodeLocalDNSNamespace, NodeLocalDNSName)
	found := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("reading DaemonSet %s/%s: %w", NodeLocalDNSNamespace, NodeLocalDNSName, err)
	}
	where := fmt.Sprintf("DaemonSet %s/%s", NodeLocalDNSNamespace, NodeLocalDNSName)
	switch {
	case found && dns != sandboxnet.NodeLocalDNS:
		return []string{fmt.Sprintf("the cluster runs NodeLocal DNSCache (%s), so pods ask it, not %s: sandboxes allowed names could not look them up. Set fusebox:clusterDNS: nodelocaldns in %s", where, dns, s.file())}, nil
	case !found && dns == sandboxnet.NodeLocalDNS:
		return []string{fmt.Sprintf("fusebox:clusterDNS is nodelocaldns, but the cluster runs no NodeLocal DNSCache (%s not found): set fusebox:clusterDNS: kube-dns in %s, or install it", where, s.file())}, nil
	case !found:
		return nil, nil
	}
	if s.Flavour == sandboxnet.Cilium {
		if ds.HostNetwork {
			return []string{fmt.Sprintf("NodeLocal DNSCache (%s) runs in the host network: its queries reach the node, which the sandboxes' Cilium policies deny (toEntities host), so no sandbox could look a name up. Run it as Cilium documents (Local Redirect Policy, \"Node-local DNS cache\": node-local-dns pods outside the host network, and a CiliumLocalRedirectPolicy for the kube-dns Service), or set fusebox:networkPolicy: kubernetes in %s", where, s.file())}, nil
		}
		return nil, nil
	}
	// In its iptables mode node-cache also answers on the kube-dns Service address
	// (-localip 169.254.20.10,<kube-dns ClusterIP>) for pods whose resolv.conf still names
	// it, untranslated: that destination is no peer of the DNS rules.
	if ips := localIPs(ds.Args); !slices.Equal(ips, []string{sandboxnet.NodeLocalDNSAddress}) {
		return []string{fmt.Sprintf("NodeLocal DNSCache (%s) listens on %s; the sandboxes' DNS rules (fusebox:clusterDNS: nodelocaldns) allow %s and the kube-dns pods only, so a query to any other address it answers on is dropped. Run it with -localip %s alone and the kubelet's clusterDNS set to %s (the addon's IPVS-mode setup)",
			where, strings.Join(ips, ","), sandboxnet.NodeLocalDNSAddress, sandboxnet.NodeLocalDNSAddress, sandboxnet.NodeLocalDNSAddress)}, nil
	}
	return nil, nil
}

// localIPs are the addresses node-cache listens on: its -localip flag ("-localip a,b",
// "-localip=a,b"), or "none" when the flag is missing.
func localIPs(args []string) []string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "localip="); ok {
			return strings.Split(v, ",")
		}
		if a == "localip" && i+1 < len(args) {
			return strings.Split(args[i+1], ",")
		}
	}
	return []string{"none"}
}
