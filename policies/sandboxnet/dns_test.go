package sandboxnet

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest/golden"
)

// dnsNetwork is network() with the DNS setup d.
func dnsNetwork(d ClusterDNS) Network {
	n := network()
	n.DNS = d
	return n
}

// TestDNSPeersNetworkPolicy: a sandbox whose allowlist names hosts may send DNS queries where
// the cluster's pods send them, on port 53 only. The addresses are the resolvers' own:
// NodeLocal DNSCache's default -localip (kubernetes cluster/addons/dns/nodelocaldns README),
// the GKE metadata server that serves Cloud DNS (GKE "Using Cloud DNS for GKE": the kubelet
// writes nameserver 169.254.169.254 into resolv.conf; tektoncd/operator#4000), and AKS
// LocalDNS's KubeDNS listener (AKS "Configure LocalDNS": queries answered by 169.254.10.10
// or 169.254.10.11; the cluster listener, CLUSTER_IP=169.254.10.11 in AgentBaker's LocalDNS
// e2e).
func TestDNSPeersNetworkPolicy(t *testing.T) {
	kubeDNS := `{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}},"podSelector":{"matchLabels":{"k8s-app":"kube-dns"}}}`
	for _, tc := range []struct {
		dns  ClusterDNS
		want []string
	}{
		{"", []string{kubeDNS}},
		{KubeDNS, []string{kubeDNS}},
		{NodeLocalDNS, []string{`{"ipBlock":{"cidr":"169.254.20.10/32"}}`, kubeDNS}},
		{GKECloudDNS, []string{`{"ipBlock":{"cidr":"169.254.169.254/32"}}`}},
	} {
		t.Run(string(tc.dns), func(t *testing.T) {
			objs, err := SandboxPolicies(GKE, dnsNetwork(tc.dns), "sb-1", []string{"a.example.com:443", "192.0.2.1:443"})
			if err != nil {
				t.Fatal(err)
			}
			np := objs[0].Spec.(*NetworkPolicySpec)
			dns := np.Egress[0]
			var got []string
			for _, p := range dns.To {
				got = append(got, specJSON(t, Object{Spec: p}))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("DNS peers %v, want %v", got, tc.want)
			}
			if want := []NetworkPolicyPort{{"UDP", 53}, {"TCP", 53}}; !slices.Equal(dns.Ports, want) {
				t.Errorf("DNS ports %v, want %v", dns.Ports, want)
			}
			// No other rule reaches a node-local resolver, whatever its port.
			for _, e := range np.Egress[1:] {
				for _, p := range e.To {
					if p.IPBlock != nil && strings.HasPrefix(p.IPBlock.CIDR, "169.254.") {
						t.Errorf("rule %+v reaches %s", e, p.IPBlock.CIDR)
					}
				}
			}
		})
	}
}

// TestCloudDNSNeverOpensMetadata: on GKE with Cloud DNS, the metadata address is reachable
// on port 53 only; an allowlist naming it on any port is still refused.
func TestCloudDNSNeverOpensMetadata(t *testing.T) {
	objs, err := SandboxPolicies(GKE, dnsNetwork(GKECloudDNS), "sb-1", []string{"a.example.com:443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range objs[0].Spec.(*NetworkPolicySpec).Egress {
		for _, p := range e.To {
			if p.IPBlock == nil || p.IPBlock.CIDR != GKECloudDNSAddress+"/32" {
				continue
			}
			for _, port := range e.Ports {
				if port.Port != DNSPort {
					t.Errorf("metadata address open on %s %d", port.Protocol, port.Port)
				}
			}
			if len(e.Ports) == 0 {
				t.Error("metadata address open on every port")
			}
		}
	}
	for _, a := range []string{"169.254.169.254:53", "169.254.169.254:80"} {
		if _, err := SandboxPolicies(GKE, dnsNetwork(GKECloudDNS), "sb-1", []string{a}); !errors.Is(err, ErrDeniedDestination) {
			t.Errorf("%s: %v, want ErrDeniedDestination", a, err)
		}
	}
}

// TestDNSPeersCilium: Cilium's DNS proxy sees the queries on the rule whose peer is where
// they go: under NodeLocal DNSCache with Cilium's Local Redirect Policy (Cilium docs,
// "Local Redirect Policy: Node-local DNS cache"; cilium-cli adds the same node-local-dns
// labels to its connectivity tests' DNS rules, cilium/cilium-cli#995) that is the
// node-local-dns pods as well as kube-dns.
func TestDNSPeersCilium(t *testing.T) {
	for _, tc := range []struct {
		dns  ClusterDNS
		want string
	}{
		{KubeDNS, `[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"kube-system","k8s:k8s-app":"kube-dns"}}]`},
		{NodeLocalDNS, `[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"kube-system","k8s:k8s-app":"kube-dns"}},{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"kube-system","k8s:k8s-app":"node-local-dns"}}]`},
	} {
		objs, err := SandboxPolicies(Cilium, dnsNetwork(tc.dns), "sb-1", []string{"a.example.com:443"})
		if err != nil {
			t.Fatal(err)
		}
		dns := objs[0].Spec.(*CiliumSpec).Egress[0]
		if got := specJSON(t, Object{Spec: dns.ToEndpoints}); got != tc.want {
			t.Errorf("%s: DNS peers %s, want %s", tc.dns, got, tc.want)
		}
		if dns.ToPorts[0].Rules == nil || len(dns.ToPorts[0].Rules.DNS) != 1 {
			t.Errorf("%s: DNS rule without the allowlisted names: %+v", tc.dns, dns.ToPorts)
		}
	}
}

// TestClusterDNSRefused: a setup a flavour cannot express is refused, naming it, by both
// renderers; an unknown one too.
func TestClusterDNSRefused(t *testing.T) {
	for _, tc := range []struct {
		f    Flavour
		dns  ClusterDNS
		want string
	}{
		{Cilium, GKECloudDNS, "GKE only"},
		{Kubernetes, GKECloudDNS, "GKE only"},
		{Cilium, AKSLocalDNS, "toEntities host"},
		{GKE, "coredns", `cluster DNS "coredns": want one of kube-dns, nodelocaldns, gke-clouddns, aks-localdns`},
	} {
		_, errNS := NamespacePolicies(tc.f, dnsNetwork(tc.dns))
		_, errSB := SandboxPolicies(tc.f, dnsNetwork(tc.dns), "sb-1", []string{"192.0.2.1:443"})
		for _, err := range []error{errNS, errSB} {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s with %s: %v, want ErrInvalid with %q", tc.f, tc.dns, err, tc.want)
			}
		}
	}
	for _, tc := range []struct {
		f   Flavour
		dns ClusterDNS
	}{{Kubernetes, AKSLocalDNS}, {Kubernetes, NodeLocalDNS}, {GKE, NodeLocalDNS}, {Cilium, NodeLocalDNS}, {GKE, GKECloudDNS}} {
		if err := CheckClusterDNS(tc.f, tc.dns); err != nil {
			t.Errorf("%s with %s refused: %v", tc.f, tc.dns, err)
		}
	}
}

// TestDNSPoliciesGolden: every flavour's sandbox policy under every DNS setup, for an
// allowlist with names and addresses, is what testdata/dns-policies.json holds.
func TestDNSPoliciesGolden(t *testing.T) {
	out := map[string]any{}
	for _, f := range Flavours {
		for _, d := range ClusterDNSes {
			key := string(f) + ", " + string(d)
			objs, err := SandboxPolicies(f, dnsNetwork(d), "sb-1", []string{"a.example.com:443", "*.example.org:443", "10.1.2.3:5432"})
			if err != nil {
				out[key] = "error: " + err.Error()
				continue
			}
			out[key] = objs
		}
	}
	golden.JSON(t, filepath.Join("testdata", "dns-policies.json"), out)
}
