package kubealloc

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/manager/egress"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

var testSelectors = PolicySelectors{
	Agents:  map[string]string{"fusebox.dev/role": "agent"},
	Manager: map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
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
		"no agent selector":   func(o *Options) { o.Selectors.Agents = nil },
		"no manager selector": func(o *Options) { o.Selectors.Manager = nil },
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

func TestSandboxPolicy(t *testing.T) {
	u, err := SandboxPolicy("ns", "sb-1", []string{"a.example.com:443", "*.pypi.org:443", "10.0.0.1:5432", "[2001:db8::1]:443", "a.example.com:443", "b.example.com:80"}, testSelectors)
	if err != nil {
		t.Fatal(err)
	}
	if u.GetName() != "fusebox-sandbox-sb-1" || u.GetNamespace() != "ns" || u.GetKind() != "CiliumNetworkPolicy" || u.GetAPIVersion() != "cilium.io/v2" {
		t.Fatalf("metadata %v", u.Object)
	}
	egressRules, _, _ := unstructured.NestedSlice(u.Object, "spec", "egress")
	got := fmt.Sprint(egressRules[1:])
	want := fmt.Sprint([]any{
		map[string]any{"toFQDNs": []any{map[string]any{"matchName": "a.example.com"}, map[string]any{"matchPattern": "*.pypi.org"}}, "toPorts": ports("443")},
		map[string]any{"toCIDR": []any{"2001:db8::1/128"}, "toPorts": ports("443")},
		map[string]any{"toCIDR": []any{"10.0.0.1/32"}, "toPorts": ports("5432")},
		map[string]any{"toFQDNs": []any{map[string]any{"matchName": "b.example.com"}}, "toPorts": ports("80")},
	})
	if got != want {
		t.Errorf("egress\n got %s\nwant %s", got, want)
	}
	dns := fmt.Sprint(egressRules[0])
	for _, s := range []string{"kube-dns", "kube-system", "matchPattern:*", "port:53 protocol:UDP", "port:53 protocol:TCP"} {
		if !strings.Contains(dns, s) {
			t.Errorf("DNS rule %s lacks %q", dns, s)
		}
	}
	ingress, _, _ := unstructured.NestedSlice(u.Object, "spec", "ingress")
	if g := fmt.Sprint(ingress); g != fmt.Sprint([]any{
		map[string]any{"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"fusebox.dev/role": "agent"}}}, "toPorts": ports("7071")},
		map[string]any{"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "fusebox-manager"}}}, "toPorts": ports("7070")},
	}) {
		t.Errorf("ingress %s", g)
	}
	sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "endpointSelector", "matchLabels")
	if len(sel) != 1 || sel[LabelSandboxID] != "sb-1" {
		t.Errorf("endpointSelector %v", sel)
	}

	empty, err := SandboxPolicy("ns", "sb-2", nil, testSelectors)
	if err != nil {
		t.Fatal(err)
	}
	if e, _, _ := unstructured.NestedSlice(empty.Object, "spec", "egress"); len(e) != 1 {
		t.Errorf("empty allowlist: %d egress rules, want only DNS", len(e))
	}
	if _, err := SandboxPolicy("ns", "sb-3", []string{"*.com:443"}, testSelectors); !errors.Is(err, egress.ErrBadEntry) {
		t.Errorf("bad entry: %v", err)
	}
}

func ports(p string) []any {
	return []any{map[string]any{"ports": []any{map[string]any{"port": p, "protocol": "TCP"}}}}
}

func TestDefaultDenyPolicy(t *testing.T) {
	u, err := DefaultDenyPolicy("ns")
	if err != nil {
		t.Fatal(err)
	}
	if g := fmt.Sprint(u.Object["spec"]); g != "map[egress:[map[]] endpointSelector:map[matchLabels:map[app.kubernetes.io/name:fusebox-sandbox]] ingress:[map[]]]" {
		t.Errorf("spec %s", g)
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
