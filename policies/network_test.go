package policies

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func network() SandboxNetwork {
	return SandboxNetwork{
		SandboxNamespace: "fusebox-sandboxes", ManagerNamespace: "fusebox-system",
		InitPort: 7070, DataPort: 7071,
		ManagerLabels:        map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		DataClientNamespaces: []string{"agents"},
	}
}

func byName(ps []CiliumNetworkPolicy) map[string]CiliumNetworkPolicySpec {
	m := map[string]CiliumNetworkPolicySpec{}
	for _, p := range ps {
		m[p.Name] = p.Spec
	}
	return m
}

func TestSandboxNetworkPolicies(t *testing.T) {
	ps, err := SandboxNetworkPolicies(network())
	if err != nil {
		t.Fatal(err)
	}
	m := byName(ps)
	if _, ok := m[PolicyAllowEgress]; ok {
		t.Error("egress defaults policy without egress defaults")
	}
	for name, spec := range m {
		if len(spec.EndpointSelector.MatchLabels) != 0 {
			t.Errorf("%s selects %v, want every pod of the namespace", name, spec.EndpointSelector)
		}
	}

	dd := m[PolicyDefaultDeny]
	if dd.EnableDefaultDeny == nil || !dd.EnableDefaultDeny.Ingress || !dd.EnableDefaultDeny.Egress ||
		len(dd.Ingress) != 1 || len(dd.Egress) != 1 {
		t.Errorf("default deny %+v", dd)
	}
	b, _ := json.Marshal(dd)
	if want := `{"description":"fusebox: sandboxes get no traffic but what other fusebox policies allow","endpointSelector":{},"enableDefaultDeny":{"ingress":true,"egress":true},"ingress":[{}],"egress":[{}]}`; string(b) != want {
		t.Errorf("default deny JSON\n got %s\nwant %s", b, want)
	}

	md := m[PolicyDenyMetadata]
	if len(md.EgressDeny) != 1 || !slices.Contains(md.EgressDeny[0].ToCIDR, "169.254.169.254/32") {
		t.Errorf("metadata deny %+v", md)
	}

	dns := m[PolicyAllowDNS]
	if len(dns.Egress) != 1 || len(dns.Ingress) != 0 {
		t.Fatalf("dns %+v", dns)
	}
	e := dns.Egress[0]
	if e.ToEndpoints[0].MatchLabels["k8s:k8s-app"] != "kube-dns" || e.ToEndpoints[0].MatchLabels["k8s:io.kubernetes.pod.namespace"] != "kube-system" ||
		e.ToPorts[0].Ports[0].Port != "53" || e.ToPorts[0].Rules.DNS[0].MatchPattern != "*" || len(e.ToCIDRSet) != 0 {
		t.Errorf("dns egress %+v", e)
	}

	init := m[PolicyAllowInit]
	if len(init.Ingress) != 1 || len(init.Egress) != 0 {
		t.Fatalf("init %+v", init)
	}
	from := init.Ingress[0].FromEndpoints[0].MatchLabels
	if from["k8s:io.kubernetes.pod.namespace"] != "fusebox-system" || from["k8s:app.kubernetes.io/name"] != "fusebox-manager" ||
		init.Ingress[0].ToPorts[0].Ports[0] != (PortProtocol{Port: "7070", Protocol: "TCP"}) {
		t.Errorf("init ingress %+v", init.Ingress[0])
	}

	data := m[PolicyAllowData]
	var nss []string
	for _, r := range data.Ingress {
		if r.ToPorts[0].Ports[0] != (PortProtocol{Port: "7071", Protocol: "TCP"}) {
			t.Errorf("data rule to %+v", r.ToPorts)
		}
		for _, f := range r.FromEndpoints {
			nss = append(nss, f.MatchLabels["k8s:io.kubernetes.pod.namespace"])
		}
	}
	if !slices.Equal(nss, []string{"fusebox-system", "agents"}) {
		t.Errorf("data clients %v", nss)
	}

	// Only the DNS policy allows any egress.
	for name, spec := range m {
		if name != PolicyAllowDNS && name != PolicyDefaultDeny && len(spec.Egress) != 0 {
			t.Errorf("%s allows egress: %+v", name, spec.Egress)
		}
	}
}

func TestEgressDefaults(t *testing.T) {
	n := network()
	n.EgressCIDRs = []string{"0.0.0.0/0", "10.0.0.0/8"}
	n.EgressFQDNs = []string{"pypi.org", "*.pythonhosted.org"}
	ps, err := SandboxNetworkPolicies(n)
	if err != nil {
		t.Fatal(err)
	}
	eg := byName(ps)[PolicyAllowEgress]
	if len(eg.Egress) != 2 {
		t.Fatalf("egress %+v", eg)
	}
	set := eg.Egress[0].ToCIDRSet
	if set[0].CIDR != "0.0.0.0/0" || !slices.Contains(set[0].Except, "169.254.169.254/32") || len(set[1].Except) != 0 {
		t.Errorf("cidr set %+v", set)
	}
	fq := eg.Egress[1].ToFQDNs
	if fq[0] != (FQDNSelector{MatchName: "pypi.org"}) || fq[1] != (FQDNSelector{MatchPattern: "*.pythonhosted.org"}) {
		t.Errorf("fqdns %+v", fq)
	}
}

func TestSandboxNetworkRefuses(t *testing.T) {
	for name, mut := range map[string]func(*SandboxNetwork){
		"no sandbox namespace": func(n *SandboxNetwork) { n.SandboxNamespace = "" },
		"no manager labels":    func(n *SandboxNetwork) { n.ManagerLabels = nil },
		"bad port":             func(n *SandboxNetwork) { n.DataPort = 0 },
		"bad cidr":             func(n *SandboxNetwork) { n.EgressCIDRs = []string{"10.0.0.0"} },
		"bad fqdn":             func(n *SandboxNetwork) { n.EgressFQDNs = []string{"http://x"} },
	} {
		t.Run(name, func(t *testing.T) {
			n := network()
			mut(&n)
			if _, err := SandboxNetworkPolicies(n); !errors.Is(err, ErrInvalidNetwork) {
				t.Fatalf("want ErrInvalidNetwork, got %v", err)
			}
		})
	}
}
