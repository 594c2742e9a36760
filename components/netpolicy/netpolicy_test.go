package netpolicy

import (
	"reflect"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

func network() sandboxnet.Network {
	return sandboxnet.Network{
		SandboxNamespace: "sbx", ManagerNamespace: "mgr",
		ManagerLabels:   map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		AgentNamespaces: []string{"agents"}, InitPort: 7070, DataPort: 7071,
	}
}

// TestPoliciesAreSandboxnets: what the program creates is exactly sandboxnet's rendering (the
// specs the manager checks and extends), as typed NetworkPolicy or as CiliumNetworkPolicy per
// flavour, in the sandbox namespace and parented to the component.
func TestPoliciesAreSandboxnets(t *testing.T) {
	for _, tc := range []struct {
		f   sandboxnet.Flavour
		typ string
	}{
		{sandboxnet.Cilium, "kubernetes:cilium.io/v2:CiliumNetworkPolicy"},
		{sandboxnet.GKE, "kubernetes:networking.k8s.io/v1:NetworkPolicy"},
		{sandboxnet.Kubernetes, "kubernetes:networking.k8s.io/v1:NetworkPolicy"},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
				_, err := NewSandboxPolicies(ctx, "fb", &SandboxPoliciesArgs{Flavour: tc.f, Namespace: pulumi.String("sbx"), Network: network()})
				return err
			})
			m.One(t, Type)
			m.AssertParented(t, Type)
			want, err := sandboxnet.NamespacePolicies(tc.f, network())
			if err != nil {
				t.Fatal(err)
			}
			got := m.ByType(tc.typ)
			if len(got) != len(want) || len(m.All()) != len(want)+1 {
				t.Fatalf("%d %s of %d resources, want %d", len(got), tc.typ, len(m.All()), len(want))
			}
			// Matched by name: the mock records registrations in the order they complete.
			byName := map[string]sandboxnet.Object{}
			for _, w := range want {
				byName[w.Name] = w
			}
			for _, r := range got {
				p := r.Props()
				w, ok := byName[mocktest.Str(p, "metadata", "name")]
				if !ok || mocktest.Str(p, "metadata", "namespace") != "sbx" ||
					mocktest.Str(p, "metadata", "labels", "app.kubernetes.io/part-of") != "fusebox" {
					t.Errorf("metadata %v", p["metadata"])
					continue
				}
				delete(byName, w.Name)
				spec, err := w.SpecMap()
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(p["spec"], spec) {
					t.Errorf("%s spec\n got %#v\nwant %#v", w.Name, p["spec"], spec)
				}
			}
			if len(byName) != 0 {
				t.Errorf("not created: %v", byName)
			}
		})
	}
}

func TestRefusesBadNetwork(t *testing.T) {
	n := network()
	n.AgentNamespaces = nil
	_, err := mocktest.Run(func(ctx *pulumi.Context) error {
		_, err := NewSandboxPolicies(ctx, "fb", &SandboxPoliciesArgs{Flavour: sandboxnet.GKE, Namespace: pulumi.String("sbx"), Network: n})
		return err
	})
	if err == nil {
		t.Fatal("no agent namespaces accepted")
	}
}
