package sandboxnet

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func network() Network {
	return Network{
		SandboxNamespace: "fusebox-sandboxes", ManagerNamespace: "fusebox-system",
		ManagerLabels:   map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		AgentNamespaces: []string{"agents", "ci"},
		AgentLabels:     map[string]string{"fusebox.dev/agent": "true"},
		InitPort:        7070, DataPort: 7071,
	}
}

func specJSON(t *testing.T, o Object) string {
	t.Helper()
	b, err := json.Marshal(o.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func names(objs []Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Kind+"/"+o.Name)
	}
	return out
}

func TestNamespacePolicies(t *testing.T) {
	for _, tc := range []struct {
		f           Flavour
		want        []string
		defaultDeny string
	}{
		{Cilium, []string{"CiliumNetworkPolicy/fusebox-sandbox-default-deny", "CiliumNetworkPolicy/fusebox-sandbox-deny-internal", "CiliumNetworkPolicy/fusebox-sandbox-allow-manager-init",
			"CiliumNetworkPolicy/fusebox-sandbox-allow-agents-data"},
			`{"description":"fusebox: sandboxes get no traffic but what other fusebox policies allow","endpointSelector":{},"enableDefaultDeny":{"ingress":true,"egress":true},"ingress":[{}],"egress":[{}]}`},
		{GKE, []string{"NetworkPolicy/fusebox-sandbox-default-deny", "NetworkPolicy/fusebox-sandbox-allow-manager-init", "NetworkPolicy/fusebox-sandbox-allow-agents-data"},
			`{"podSelector":{},"policyTypes":["Ingress","Egress"]}`},
		{Kubernetes, []string{"NetworkPolicy/fusebox-sandbox-default-deny", "NetworkPolicy/fusebox-sandbox-allow-manager-init", "NetworkPolicy/fusebox-sandbox-allow-agents-data"},
			`{"podSelector":{},"policyTypes":["Ingress","Egress"]}`},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			objs, err := NamespacePolicies(tc.f, network())
			if err != nil {
				t.Fatal(err)
			}
			if got := names(objs); !slices.Equal(got, tc.want) {
				t.Fatalf("policies %v, want %v", got, tc.want)
			}
			// The manager checks for exactly this object.
			dd, err := DefaultDeny(tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if objs[0].Name != DefaultDenyName || specJSON(t, objs[0]) != specJSON(t, dd) || specJSON(t, dd) != tc.defaultDeny {
				t.Errorf("default deny %s\nwant %s", specJSON(t, objs[0]), tc.defaultDeny)
			}
			// A warm, unbound sandbox reaches nothing: no namespace policy allows any egress
			// (not even DNS), and the only ingress is the manager's to the init port and the
			// agents' to the data port.
			for _, o := range objs {
				js := specJSON(t, o)
				switch spec := o.Spec.(type) {
				case *CiliumSpec:
					if len(spec.EndpointSelector.MatchLabels) != 0 {
						t.Errorf("%s selects %v, want every pod", o.Name, spec.EndpointSelector)
					}
					for _, e := range spec.Egress {
						if len(e.ToEndpoints)+len(e.ToCIDR)+len(e.ToFQDNs)+len(e.ToPorts) != 0 {
							t.Errorf("%s allows egress: %s", o.Name, js)
						}
					}
					for _, in := range spec.Ingress {
						if len(in.FromEndpoints)+len(in.FromCIDR) != 0 && o.Name != AllowManagerInitName && o.Name != AllowAgentsDataName {
							t.Errorf("%s allows ingress: %s", o.Name, js)
						}
					}
				case *NetworkPolicySpec:
					if len(spec.Egress) != 0 {
						t.Errorf("%s allows egress: %s", o.Name, js)
					}
					if len(spec.Ingress) != 0 && o.Name != AllowManagerInitName && o.Name != AllowAgentsDataName {
						t.Errorf("%s allows ingress: %s", o.Name, js)
					}
				default:
					t.Errorf("%s: spec %T", o.Name, o.Spec)
				}
			}
			init := specJSON(t, objs[len(objs)-2])
			for _, s := range []string{"fusebox-system", "fusebox-manager", "7070"} {
				if !strings.Contains(init, s) {
					t.Errorf("manager init rule %s lacks %q", init, s)
				}
			}
			if strings.Contains(init, "7071") {
				t.Errorf("the manager rule opens the data port: %s", init)
			}
			// The agents of each agent namespace, with the agent labels, reach the data port
			// of every sandbox, and nothing else.
			data := specJSON(t, objs[len(objs)-1])
			var want string
			if tc.f == Cilium {
				want = `{"description":"fusebox: the agents reach the data port (served only to the agent whose key a sandbox pinned)","endpointSelector":{},"ingress":[` +
					`{"fromEndpoints":[{"matchLabels":{"k8s:fusebox.dev/agent":"true","k8s:io.kubernetes.pod.namespace":"agents"}}],"toPorts":[{"ports":[{"port":"7071","protocol":"TCP"}]}]},` +
					`{"fromEndpoints":[{"matchLabels":{"k8s:fusebox.dev/agent":"true","k8s:io.kubernetes.pod.namespace":"ci"}}],"toPorts":[{"ports":[{"port":"7071","protocol":"TCP"}]}]}]}`
			} else {
				want = `{"podSelector":{},"policyTypes":["Ingress"],"ingress":[{"from":[` +
					`{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"agents"}},"podSelector":{"matchLabels":{"fusebox.dev/agent":"true"}}},` +
					`{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"ci"}},"podSelector":{"matchLabels":{"fusebox.dev/agent":"true"}}}],"ports":[{"protocol":"TCP","port":7071}]}]}`
			}
			if data != want {
				t.Errorf("agents' rule\n got %s\nwant %s", data, want)
			}
		})
	}
}

func TestCiliumDeniesInternal(t *testing.T) {
	objs, err := NamespacePolicies(Cilium, network())
	if err != nil {
		t.Fatal(err)
	}
	deny := objs[1].Spec.(*CiliumSpec)
	var cidrs, entities []string
	for _, d := range deny.EgressDeny {
		cidrs = append(cidrs, d.ToCIDR...)
		entities = append(entities, d.ToEntities...)
	}
	for _, want := range []string{"169.254.169.254/32", "169.254.170.23/32", "fd00:ec2::254/128", "169.254.170.2/32", "168.63.129.16/32"} {
		if !slices.Contains(cidrs, want) {
			t.Errorf("metadata deny lacks %s: %v", want, cidrs)
		}
	}
	for _, want := range []string{"host", "remote-node", "kube-apiserver"} {
		if !slices.Contains(entities, want) {
			t.Errorf("entity deny lacks %s: %v", want, entities)
		}
	}
}

var allow = []string{"a.example.com:443", "*.pypi.org:443", "10.0.0.1:5432", "[2001:db8::1]:443", "b.example.com:80"}

func TestSandboxPoliciesCilium(t *testing.T) {
	objs, err := SandboxPolicies(Cilium, network(), "sb-1", allow)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(objs); !slices.Equal(got, []string{"CiliumNetworkPolicy/fusebox-sandbox-sb-1"}) {
		t.Fatalf("objects %v", got)
	}
	s := objs[0].Spec.(*CiliumSpec)
	if !maps1(s.EndpointSelector.MatchLabels, LabelSandboxID, "sb-1") {
		t.Errorf("selector %v", s.EndpointSelector)
	}
	// Egress only: the agents' ingress is the namespace's (AllowAgentsDataName).
	if len(s.Ingress) != 0 {
		t.Errorf("ingress %+v", s.Ingress)
	}
	var eg []string
	for _, e := range s.Egress {
		b, _ := json.Marshal(e)
		eg = append(eg, string(b))
	}
	wantEg := []string{
		// DNS: exactly the allowlisted names may be looked up.
		`{"toEndpoints":[{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"kube-system","k8s:k8s-app":"kube-dns"}}],"toPorts":[{"ports":[{"port":"53","protocol":"UDP"},{"port":"53","protocol":"TCP"}],"rules":{"dns":[{"matchName":"a.example.com"},{"matchPattern":"*.pypi.org"},{"matchName":"b.example.com"}]}}]}`,
		`{"toFQDNs":[{"matchName":"a.example.com"},{"matchPattern":"*.pypi.org"}],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}`,
		`{"toCIDR":["2001:db8::1/128"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}`,
		`{"toCIDR":["10.0.0.1/32"],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}`,
		`{"toFQDNs":[{"matchName":"b.example.com"}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}`,
	}
	if !slices.Equal(eg, wantEg) {
		t.Errorf("egress\n got %v\nwant %v", strings.Join(eg, "\n"), strings.Join(wantEg, "\n"))
	}
	// Private ranges are denied except the allowlisted address in them.
	if len(s.EgressDeny) != 1 {
		t.Fatalf("egressDeny %+v", s.EgressDeny)
	}
	for _, r := range s.EgressDeny[0].ToCIDRSet {
		switch r.CIDR {
		case "10.0.0.0/8":
			if !slices.Equal(r.Except, []string{"10.0.0.1/32"}) {
				t.Errorf("10/8 except %v", r.Except)
			}
		default:
			if len(r.Except) != 0 {
				t.Errorf("%s except %v", r.CIDR, r.Except)
			}
		}
	}
	if len(s.EgressDeny[0].ToCIDRSet) != len(PrivateCIDRs) {
		t.Errorf("private deny %+v", s.EgressDeny[0].ToCIDRSet)
	}

	// No names: no DNS at all.
	objs, err = SandboxPolicies(Cilium, network(), "sb-2", []string{"192.0.2.1:443"})
	if err != nil {
		t.Fatal(err)
	}
	if js := specJSON(t, objs[0]); strings.Contains(js, "kube-dns") || strings.Contains(js, `"53"`) {
		t.Errorf("an allowlist without names gets DNS: %s", js)
	}
}

// An allocation without an allowlist gets no policy of its own (and so no API write).
func TestNoAllowlistNoPolicy(t *testing.T) {
	for _, f := range Flavours {
		objs, err := SandboxPolicies(f, network(), "sb-3", nil)
		if err != nil || len(objs) != 0 {
			t.Errorf("%s, empty allowlist: %v, %v; want no policy", f, names(objs), err)
		}
	}
}

func maps1(m map[string]string, k, v string) bool { return len(m) == 1 && m[k] == v }

func TestSandboxPoliciesGKE(t *testing.T) {
	n := network()
	n.AgentCIDRs = []string{"192.0.2.0/24"}
	objs, err := SandboxPolicies(GKE, n, "sb-1", allow)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(objs); !slices.Equal(got, []string{"NetworkPolicy/fusebox-sandbox-sb-1", "FQDNNetworkPolicy/fusebox-sandbox-sb-1"}) {
		t.Fatalf("objects %v", got)
	}
	np := specJSON(t, objs[0])
	want := `{"podSelector":{"matchLabels":{"fusebox.dev/sandbox-id":"sb-1"}},"policyTypes":["Egress"],` +
		`"egress":[{"to":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}},"podSelector":{"matchLabels":{"k8s-app":"kube-dns"}}}],"ports":[{"protocol":"UDP","port":53},{"protocol":"TCP","port":53}]},` +
		`{"to":[{"ipBlock":{"cidr":"2001:db8::1/128"}}],"ports":[{"protocol":"TCP","port":443}]},` +
		`{"to":[{"ipBlock":{"cidr":"10.0.0.1/32"}}],"ports":[{"protocol":"TCP","port":5432}]}]}`
	if np != want {
		t.Errorf("NetworkPolicy\n got %s\nwant %s", np, want)
	}
	fq := specJSON(t, objs[1])
	wantFQ := `{"podSelector":{"matchLabels":{"fusebox.dev/sandbox-id":"sb-1"}},"egress":[` +
		`{"matches":[{"name":"a.example.com"},{"pattern":"*.pypi.org"}],"ports":[{"protocol":"TCP","port":443}]},` +
		`{"matches":[{"name":"b.example.com"}],"ports":[{"protocol":"TCP","port":80}]}]}`
	if fq != wantFQ {
		t.Errorf("FQDNNetworkPolicy\n got %s\nwant %s", fq, wantFQ)
	}
	// Addresses only: no FQDNNetworkPolicy and no DNS.
	objs, err = SandboxPolicies(GKE, n, "sb-2", []string{"192.0.2.1:443"})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || strings.Contains(specJSON(t, objs[0]), "kube-dns") {
		t.Errorf("addresses only: %v %s", names(objs), specJSON(t, objs[0]))
	}
}

func TestSandboxPoliciesKubernetes(t *testing.T) {
	objs, err := SandboxPolicies(Kubernetes, network(), "sb-1", []string{"10.0.0.1:5432", "[2001:db8::1]:443"})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(objs); !slices.Equal(got, []string{"NetworkPolicy/fusebox-sandbox-sb-1"}) {
		t.Fatalf("objects %v", got)
	}
	for _, e := range []string{"pypi.org:443", "*.pypi.org:443"} {
		_, err := SandboxPolicies(Kubernetes, network(), "sb-2", []string{"10.0.0.1:5432", e})
		if !errors.Is(err, ErrFQDNUnsupported) || !strings.Contains(err.Error(), e) {
			t.Errorf("%s on a plain NetworkPolicy stack: %v", e, err)
		}
		if err := CheckAllowlist(Kubernetes, []string{e}); !errors.Is(err, ErrFQDNUnsupported) {
			t.Errorf("CheckAllowlist(%s) = %v", e, err)
		}
		if err := CheckAllowlist(Cilium, []string{e}); err != nil {
			t.Errorf("CheckAllowlist(cilium, %s) = %v", e, err)
		}
	}
}

func TestMetadataNeverAllowed(t *testing.T) {
	for _, f := range Flavours {
		for _, e := range []string{"169.254.169.254:80", "169.254.170.23:80", "[fd00:ec2::254]:80", "168.63.129.16:80"} {
			if _, err := SandboxPolicies(f, network(), "sb", []string{e}); !errors.Is(err, ErrDeniedDestination) {
				t.Errorf("%s %s: %v", f, e, err)
			}
		}
	}
}

func TestNetworkRefused(t *testing.T) {
	for name, mut := range map[string]func(*Network){
		"no sandbox namespace": func(n *Network) { n.SandboxNamespace = "" },
		"shared namespace":     func(n *Network) { n.ManagerNamespace = n.SandboxNamespace },
		"no manager labels":    func(n *Network) { n.ManagerLabels = nil },
		"no agents":            func(n *Network) { n.AgentNamespaces = nil },
		"agents in sandbox ns": func(n *Network) { n.AgentNamespaces = []string{"fusebox-sandboxes"} },
		"bad port":             func(n *Network) { n.DataPort = 0 },
		"same ports":           func(n *Network) { n.DataPort = n.InitPort },
		"bad cidr":             func(n *Network) { n.AgentCIDRs = []string{"10.0.0.0"} },
	} {
		t.Run(name, func(t *testing.T) {
			n := network()
			mut(&n)
			if _, err := NamespacePolicies(Cilium, n); !errors.Is(err, ErrInvalid) {
				t.Errorf("NamespacePolicies: %v", err)
			}
			if _, err := SandboxPolicies(GKE, n, "x", nil); !errors.Is(err, ErrInvalid) {
				t.Errorf("SandboxPolicies: %v", err)
			}
		})
	}
	if _, err := NamespacePolicies("calico", network()); err == nil {
		t.Error("unknown flavour accepted")
	}
}

func TestUnstructured(t *testing.T) {
	dd, _ := DefaultDeny(GKE)
	u, err := dd.Unstructured("ns")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(u)
	if want := `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"labels":{"app.kubernetes.io/part-of":"fusebox"},"name":"fusebox-sandbox-default-deny","namespace":"ns"},"spec":{"podSelector":{},"policyTypes":["Ingress","Egress"]}}`; string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}
