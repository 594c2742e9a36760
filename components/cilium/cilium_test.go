package cilium

import (
	"errors"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/policies"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	cnpType     = "kubernetes:cilium.io/v2:CiliumNetworkPolicy"
	releaseType = "kubernetes:helm.sh/v3:Release"
)

func args(install bool, chart ChartSource) *CiliumArgs {
	return &CiliumArgs{
		Install: install, Chart: chart, PolicyNamespace: pulumi.String("sbx"),
		Network: policies.SandboxNetwork{
			SandboxNamespace: "sbx", ManagerNamespace: "mgr", InitPort: 7070, DataPort: 7071,
			ManagerLabels: map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
		},
	}
}

func run(t *testing.T, a *CiliumArgs) *mocktest.Mocks {
	t.Helper()
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewCilium(ctx, "fb", a)
		return err
	})
	m.One(t, Type)
	m.AssertParented(t, Type)
	return m
}

func TestPoliciesWithExistingCilium(t *testing.T) {
	m := run(t, args(false, ChartSource{}))
	if n := len(m.ByType(releaseType)); n != 0 {
		t.Fatalf("existing Cilium: %d releases", n)
	}
	names := map[string]bool{}
	for _, r := range m.ByType(cnpType) {
		p := r.Props()
		if mocktest.Str(p, "metadata", "namespace") != "sbx" {
			t.Errorf("%s in namespace %v", r.Name, mocktest.Dig(p, "metadata", "namespace"))
		}
		names[mocktest.Str(p, "metadata", "name")] = true
		if r.Name != "fb-"+mocktest.Str(p, "metadata", "name") {
			t.Errorf("logical name %s", r.Name)
		}
		if mocktest.Dig(p, "spec", "endpointSelector") == nil {
			t.Errorf("%s has no endpointSelector", r.Name)
		}
		if mocktest.Str(p, "metadata", "name") == policies.PolicyDefaultDeny {
			if mocktest.Dig(p, "spec", "enableDefaultDeny", "egress") != true || mocktest.Dig(p, "spec", "enableDefaultDeny", "ingress") != true {
				t.Errorf("default deny spec %v", mocktest.Dig(p, "spec"))
			}
		}
	}
	for _, want := range []string{policies.PolicyDefaultDeny, policies.PolicyDenyMetadata, policies.PolicyAllowDNS, policies.PolicyAllowInit, policies.PolicyAllowData} {
		if !names[want] {
			t.Errorf("missing policy %s (have %v)", want, names)
		}
	}
}

func TestInstallFromRepository(t *testing.T) {
	m := run(t, args(true, ChartSource{Repo: "https://helm.cilium.io", Version: "1.18.4"}))
	p := m.One(t, releaseType).Props()
	if mocktest.Str(p, "chart") != "cilium" || mocktest.Str(p, "version") != "1.18.4" ||
		mocktest.Str(p, "repositoryOpts", "repo") != "https://helm.cilium.io" || mocktest.Str(p, "namespace") != "kube-system" {
		t.Errorf("release %v", p)
	}
	if mocktest.Dig(p, "values", "socketLB", "hostNamespaceOnly") != true {
		t.Errorf("values %v", mocktest.Dig(p, "values"))
	}
	if len(m.ByType(cnpType)) == 0 {
		t.Error("no policies")
	}
}

func TestInstallFromLocalPath(t *testing.T) {
	m := run(t, args(true, ChartSource{Path: "/mirror/charts/cilium-1.18.4.tgz"}))
	p := m.One(t, releaseType).Props()
	if mocktest.Str(p, "chart") != "/mirror/charts/cilium-1.18.4.tgz" || mocktest.Dig(p, "repositoryOpts") != nil {
		t.Errorf("release %v", p)
	}
}

func TestInstallNeedsPinnedChart(t *testing.T) {
	_, err := mocktest.Run(func(ctx *pulumi.Context) error {
		_, err := NewCilium(ctx, "fb", args(true, ChartSource{Repo: "https://helm.cilium.io"}))
		return err
	})
	if !errors.Is(err, ErrNoChart) {
		t.Fatalf("want ErrNoChart, got %v", err)
	}
}
