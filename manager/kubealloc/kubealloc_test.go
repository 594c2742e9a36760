package kubealloc

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

var testSelectors = PolicySelectors{
	Agents:           map[string]string{"fusebox.dev/role": "agent"},
	AgentNamespaces:  []string{"agents"},
	Manager:          map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
	ManagerNamespace: "fusebox-system",
}

func TestNewRefusesMissingOptions(t *testing.T) {
	ok := Options{
		Client: fake.NewClientset(), Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
		Namespace: "sandboxes", Identity: "r1",
		Templates: map[string]Template{"default": DefaultTemplate("img")},
		Selectors: testSelectors,
	}
	if _, err := New(ok); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for name, mut := range map[string]func(*Options){
		"no client":           func(o *Options) { o.Client = nil },
		"no namespace":        func(o *Options) { o.Namespace = "" },
		"no identity":         func(o *Options) { o.Identity = "" },
		"no templates":        func(o *Options) { o.Templates = nil },
		"no image":            func(o *Options) { o.Templates = map[string]Template{"default": {}} },
		"no agent namespaces": func(o *Options) { o.Selectors.AgentNamespaces = nil },
		"no manager selector": func(o *Options) { o.Selectors.Manager = nil },
		"no manager ns":       func(o *Options) { o.Selectors.ManagerNamespace = "" },
		"unknown flavour":     func(o *Options) { o.Flavour = "calico" },
	} {
		t.Run(name, func(t *testing.T) {
			o := ok
			mut(&o)
			if _, err := New(o); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}

// TestSandboxPoliciesClusterDNS: the DNS rule of a bound sandbox allowed names goes where
// PolicySelectors.ClusterDNS says the cluster's pods send their queries.
func TestSandboxPoliciesClusterDNS(t *testing.T) {
	sel := testSelectors
	sel.ClusterDNS = sandboxnet.GKECloudDNS
	us, err := SandboxPolicies(sandboxnet.GKE, "ns", "sb-1", []string{"a.example.com:443"}, sel)
	if err != nil {
		t.Fatal(err)
	}
	to := fmt.Sprint(us[0].Object["spec"].(map[string]any)["egress"].([]any)[0])
	if !strings.Contains(to, "169.254.169.254/32") || strings.Contains(to, "kube-dns") {
		t.Errorf("DNS rule %s, want the GKE metadata server's port 53 only", to)
	}
	sel.ClusterDNS = sandboxnet.AKSLocalDNS
	if _, err := SandboxPolicies(sandboxnet.Cilium, "ns", "sb-1", []string{"a.example.com:443"}, sel); !errors.Is(err, sandboxnet.ErrInvalid) {
		t.Errorf("AKS LocalDNS under Cilium: %v, want a refusal", err)
	}
}

func TestSandboxPolicies(t *testing.T) {
	allow := []string{"a.example.com:443", "*.pypi.org:443", "10.0.0.1:5432", "[2001:db8::1]:443", "a.example.com:443", "b.example.com:80"}
	for _, tc := range []struct {
		f     sandboxnet.Flavour
		kinds []string
	}{
		{sandboxnet.Cilium, []string{"CiliumNetworkPolicy"}},
		{sandboxnet.GKE, []string{"NetworkPolicy", "FQDNNetworkPolicy"}},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			us, err := SandboxPolicies(tc.f, "ns", "sb-1", allow, testSelectors)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, u := range us {
				kinds = append(kinds, u.GetKind())
				if u.GetName() != "fusebox-sandbox-sb-1" || u.GetNamespace() != "ns" || u.GetLabels()[LabelSandboxID] != "sb-1" {
					t.Errorf("metadata %v", u.Object["metadata"])
				}
				js := fmt.Sprint(u.Object["spec"])
				// The sandbox's egress only: the agents' ingress is the namespace's.
				if !strings.Contains(js, "sb-1") || strings.Contains(js, "agents") || strings.Contains(js, "ingress") {
					t.Errorf("%s: %s, want egress of sb-1 only", u.GetKind(), js)
				}
			}
			if fmt.Sprint(kinds) != fmt.Sprint(tc.kinds) {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
		})
	}
	for _, f := range sandboxnet.Flavours {
		if us, err := SandboxPolicies(f, "ns", "sb-2", nil, testSelectors); err != nil || len(us) != 0 {
			t.Errorf("%s, no allowlist: %d objects, %v; want none", f, len(us), err)
		}
	}
	if _, err := SandboxPolicies(sandboxnet.Cilium, "ns", "sb-3", []string{"*.com:443"}, testSelectors); !errors.Is(err, egress.ErrBadEntry) {
		t.Errorf("bad entry: %v", err)
	}
	if _, err := SandboxPolicies(sandboxnet.Kubernetes, "ns", "sb-3", []string{"pypi.org:443"}, testSelectors); !errors.Is(err, sandboxnet.ErrFQDNUnsupported) {
		t.Errorf("a name under plain NetworkPolicy: %v", err)
	}
}

func TestDefaultDenyPolicy(t *testing.T) {
	for f, want := range map[sandboxnet.Flavour]string{
		sandboxnet.Cilium:     "CiliumNetworkPolicy map[description:fusebox: sandboxes get no traffic but what other fusebox policies allow egress:[map[]] enableDefaultDeny:map[egress:true ingress:true] endpointSelector:map[] ingress:[map[]]]",
		sandboxnet.GKE:        "NetworkPolicy map[podSelector:map[] policyTypes:[Ingress Egress]]",
		sandboxnet.Kubernetes: "NetworkPolicy map[podSelector:map[] policyTypes:[Ingress Egress]]",
	} {
		u, err := DefaultDenyPolicy(f, "ns")
		if err != nil {
			t.Fatal(err)
		}
		if g := u.GetKind() + " " + fmt.Sprint(u.Object["spec"]); g != want || u.GetName() != "fusebox-sandbox-default-deny" {
			t.Errorf("%s: %s %s\nwant %s", f, u.GetName(), g, want)
		}
	}
}

func TestBuildPodOverrides(t *testing.T) {
	tpl := DefaultTemplate("img")
	tpl.ServerArgs = []string{"-max-file-bytes=1024"}
	p := BuildPod(PodSpec{ID: "x", Namespace: "ns", TemplateName: "t", Template: tpl, RuntimeClassName: "gvisor", Pool: DefaultNodePool()})
	args := p.Spec.Containers[0].Args
	if args[len(args)-1] != "-max-file-bytes=1024" {
		t.Errorf("template args not last: %v", args)
	}
	if p.Spec.NodeName != "" || p.Spec.NodeSelector["fusebox.dev/pool"] != "sandbox" || p.Spec.Tolerations[0].Key != "fusebox.dev/sandbox" {
		t.Errorf("placement %v %v %v", p.Spec.NodeName, p.Spec.NodeSelector, p.Spec.Tolerations)
	}
}

func TestRequestVerb(t *testing.T) {
	for _, c := range []struct{ method, url, want string }{
		{"GET", "/api/v1/namespaces/ns/pods", "list"},
		{"GET", "/api/v1/namespaces/ns/pods?watch=true", "watch"},
		{"GET", "/api/v1/namespaces/ns/pods/p", "get"},
		{"GET", "/api/v1/nodes", "list"},
		{"GET", "/api/v1/nodes/n", "get"},
		{"GET", "/api/v1/namespaces/ns", "get"},
		{"POST", "/api/v1/namespaces/ns/pods", "create"},
		{"PUT", "/api/v1/namespaces/ns/pods/p", "update"},
		{"PATCH", "/apis/cilium.io/v2/namespaces/ns/ciliumnetworkpolicies/x", "patch"},
		{"DELETE", "/apis/cilium.io/v2/namespaces/ns/ciliumnetworkpolicies/x", "delete"},
		{"DELETE", "/api/v1/namespaces/ns/pods", "deletecollection"},
		{"GET", "/readyz", "get"},
	} {
		r := httptest.NewRequest(c.method, c.url, nil)
		if got := requestVerb(r); got != c.want {
			t.Errorf("%s %s = %s, want %s", c.method, c.url, got, c.want)
		}
	}
	var counts RequestCounts
	rt := NewCountingTransport(&counts, roundTripFunc(func(*http.Request) (*http.Response, error) { return &http.Response{StatusCode: 200}, nil }))
	rt.RoundTrip(httptest.NewRequest("PUT", "/api/v1/namespaces/ns/pods/p", nil))
	rt.RoundTrip(httptest.NewRequest("GET", "/api/v1/namespaces/ns/pods/p", nil))
	if s := counts.Snapshot(); s["update"] != 1 || s["get"] != 1 || Writes(s) != 1 {
		t.Errorf("counts %v", s)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestClientConfigs(t *testing.T) {
	base := &rest.Config{Host: "https://127.0.0.1:6443", BearerToken: "t"}
	typed, dyn := ClientConfigs(base, 0, 0)
	if typed.QPS != DefaultQPS || typed.Burst != DefaultBurst || dyn.QPS != DefaultQPS || dyn.Burst != DefaultBurst {
		t.Errorf("rate limits: typed %v/%d, dynamic %v/%d", typed.QPS, typed.Burst, dyn.QPS, dyn.Burst)
	}
	if typed.ContentType != "application/vnd.kubernetes.protobuf" || dyn.ContentType != "" {
		t.Errorf("content types: typed %q, dynamic %q (custom resources have no protobuf)", typed.ContentType, dyn.ContentType)
	}
	if base.QPS != 0 || base.ContentType != "" {
		t.Errorf("the given config was modified: %+v", base)
	}
	typed, _ = ClientConfigs(base, 50, 60)
	if typed.QPS != 50 || typed.Burst != 60 || typed.Host != base.Host || typed.BearerToken != "t" {
		t.Errorf("explicit limits or connection settings lost: %+v", typed)
	}
}
