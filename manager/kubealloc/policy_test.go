package kubealloc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestProgramDefaultDenyPassesCheck: the default deny the Pulumi program creates (the
// namespace policies of sandboxnet) is the one the manager checks for at start.
func TestProgramDefaultDenyPassesCheck(t *testing.T) {
	objs, err := sandboxnet.NamespacePolicies(sandboxnet.Cilium, sandboxnet.Network{
		SandboxNamespace: testNS, ManagerNamespace: "fusebox-system",
		ManagerLabels: map[string]string{"app.kubernetes.io/name": "fusebox-manager"}, AgentNamespaces: []string{"agents"},
		InitPort: int(InitPort), DataPort: int(DataPort),
	})
	if err != nil {
		t.Fatal(err)
	}
	var created []runtime.Object
	for _, o := range objs {
		m, err := o.Unstructured(testNS)
		if err != nil {
			t.Fatal(err)
		}
		created = append(created, &unstructured.Unstructured{Object: m})
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{CiliumNetworkPolicyGVR: "CiliumNetworkPolicyList"}, created...)
	if err := CheckDefaultDeny(context.Background(), dyn, testNS, sandboxnet.Cilium); err != nil {
		t.Fatalf("the program's default deny fails the manager's check: %v", err)
	}
}

var policyListKinds = map[schema.GroupVersionResource]string{
	CiliumNetworkPolicyGVR: "CiliumNetworkPolicyList", NetworkPolicyGVR: "NetworkPolicyList", FQDNNetworkPolicyGVR: "FQDNNetworkPolicyList",
}

func TestCheckDefaultDenyPerFlavour(t *testing.T) {
	for _, f := range sandboxnet.Flavours {
		t.Run(string(f), func(t *testing.T) {
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), policyListKinds)
			if err := CheckDefaultDeny(context.Background(), dyn, testNS, f); !errors.Is(err, ErrNoDefaultDeny) || !strings.Contains(err.Error(), DefaultDenyName) {
				t.Fatalf("empty namespace: %v", err)
			}
			dd, err := DefaultDenyPolicy(f, testNS)
			if err != nil {
				t.Fatal(err)
			}
			res, _ := gvr(dd.GetKind())
			if _, err := dyn.Resource(res).Namespace(testNS).Create(context.Background(), dd, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := CheckDefaultDeny(context.Background(), dyn, testNS, f); err != nil {
				t.Fatalf("with the default deny: %v", err)
			}
			// A policy of the right name that allows something is not the default deny.
			weak := dd.DeepCopy()
			if err := unstructured.SetNestedField(weak.Object, map[string]any{"matchLabels": map[string]any{"x": "y"}}, "spec", selectorField(f)); err != nil {
				t.Fatal(err)
			}
			if _, err := dyn.Resource(res).Namespace(testNS).Update(context.Background(), weak, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := CheckDefaultDeny(context.Background(), dyn, testNS, f); !errors.Is(err, ErrNoDefaultDeny) {
				t.Fatalf("a different spec: %v", err)
			}
		})
	}
}

func selectorField(f sandboxnet.Flavour) string {
	if f == sandboxnet.Cilium {
		return "endpointSelector"
	}
	return "podSelector"
}

// TestBindEgressPerFlavour: the objects applied at bind time, and deleted by Destroy, are the
// flavour's; a plain-NetworkPolicy allocator refuses names before a sandbox is spent on them.
func TestBindEgressPerFlavour(t *testing.T) {
	for _, tc := range []struct {
		f       sandboxnet.Flavour
		allow   []string
		applied []string
	}{
		{sandboxnet.Cilium, []string{"api.example.com:443"}, []string{"ciliumnetworkpolicies"}},
		{sandboxnet.GKE, []string{"api.example.com:443", "192.0.2.1:443"}, []string{"networkpolicies", "fqdnnetworkpolicies"}},
		{sandboxnet.GKE, []string{"192.0.2.1:443"}, []string{"networkpolicies"}},
		{sandboxnet.Kubernetes, []string{"192.0.2.1:443"}, []string{"networkpolicies"}},
	} {
		t.Run(string(tc.f)+" "+strings.Join(tc.allow, ","), func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.Flavour = tc.f }, readyPod("sb-1"))
			var mu sync.Mutex
			var applied, deleted []string
			f.dyn.PrependReactor("patch", "*", func(act k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				applied = append(applied, act.GetResource().Resource)
				if p, ok := act.(k8stesting.PatchAction); !ok || p.GetName() != "fusebox-sandbox-sb-1" || !strings.Contains(string(p.GetPatch()), `"kind":"Pod"`) {
					t.Errorf("apply %v", act)
				}
				return true, nil, nil
			})
			f.dyn.PrependReactor("delete", "*", func(act k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				deleted = append(deleted, act.GetResource().Resource)
				return true, nil, nil
			})
			if err := f.a.CheckEgress(tc.allow); err != nil {
				t.Fatalf("CheckEgress: %v", err)
			}
			if err := f.a.BindEgress(context.Background(), "sb-1", tc.allow); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(applied, tc.applied) {
				t.Errorf("applied %v, want %v", applied, tc.applied)
			}
			if err := f.a.Destroy(context.Background(), "sb-1"); err != nil {
				t.Fatal(err)
			}
			kinds := map[sandboxnet.Flavour][]string{
				sandboxnet.Cilium: {"ciliumnetworkpolicies"}, sandboxnet.GKE: {"networkpolicies", "fqdnnetworkpolicies"},
				sandboxnet.Kubernetes: {"networkpolicies"},
			}[tc.f]
			if !slices.Equal(deleted, kinds) {
				t.Errorf("deleted %v, want %v", deleted, kinds)
			}
		})
	}
	f := newFixture(t, func(o *Options) { o.Flavour = sandboxnet.Kubernetes }, readyPod("sb-1"))
	for _, e := range []string{"pypi.org:443", "*.pypi.org:443"} {
		err := f.a.CheckEgress([]string{"192.0.2.1:443", e})
		if !errors.Is(err, manager.ErrInvalid) || !errors.Is(err, sandboxnet.ErrFQDNUnsupported) || !strings.Contains(err.Error(), e) {
			t.Errorf("CheckEgress(%s) on a plain NetworkPolicy cluster = %v", e, err)
		}
		if err := f.a.BindEgress(context.Background(), "sb-1", []string{e}); !errors.Is(err, manager.ErrInvalid) {
			t.Errorf("BindEgress(%s) = %v", e, err)
		}
	}
	if err := f.a.CheckEgress([]string{"169.254.169.254:80"}); !errors.Is(err, sandboxnet.ErrDeniedDestination) {
		t.Errorf("metadata: %v", err)
	}
}
