package manager

import (
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// TestManagerGolden: what NewManager registers, and its outputs, are what testdata/<case>.json
// holds, for the defaults and for every argument set.
func TestManagerGolden(t *testing.T) {
	everything := func() *ManagerArgs {
		a := args()
		a.SkipAwait = true
		a.Replicas = 3
		a.RequiredAntiAffinity = true
		a.PoolSize, a.PoolMax, a.Estimator = 1, 4, "pid"
		a.GRPCPort, a.MetricsPort = 7443, 9100
		a.ServiceType = "LoadBalancer"
		a.CPU, a.Memory = "1", "1Gi"
		a.TokenAudience = "agents.example.com"
		a.TLSSecret = "my-cert"
		a.Access = []AccessRule{{ServiceAccounts: []string{"agents/coder"}, Templates: []string{"default"}, Egress: []string{"10.0.0.1:443"}}, {Namespaces: []string{"ci"}}}
		a.Operators = []string{"ops/auditor"}
		a.NetworkPolicy = "gke"
		a.AgentNamespaces = []string{"agents", "ci"}
		a.AgentCIDRs = []string{"10.9.0.0/16"}
		a.AgentLabels = map[string]string{"team": "ml", "role": "agent"}
		a.ImagePullSecrets = []string{"regcred"}
		a.Sandbox.CPU, a.Sandbox.CPULimit, a.Sandbox.Memory = "2", "4", "4Gi"
		p := GKESandboxPlacement()
		a.Sandbox.Placement = &p
		return a
	}
	for name, mk := range map[string]func() *ManagerArgs{
		"default":    args,
		"everything": everything,
		"cidrs-only": func() *ManagerArgs {
			a := args()
			a.AgentNamespaces, a.AgentCIDRs, a.NetworkPolicy = nil, []string{"192.0.2.0/24"}, "kubernetes"
			return a
		},
	} {
		t.Run(name, func(t *testing.T) {
			outputs := map[string]any{}
			m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
				a := mk()
				if name == "everything" {
					// After: the Deployment waits for resources made before the component.
					before, err := corev1.NewConfigMap(ctx, "before", &corev1.ConfigMapArgs{Metadata: metav1.ObjectMetaArgs{Name: pulumi.String("before")}})
					if err != nil {
						return err
					}
					a.After = []pulumi.Resource{before}
				}
				mg, err := NewManager(ctx, "fb", a)
				if err != nil {
					return err
				}
				for k, o := range map[string]pulumi.StringOutput{
					"endpoint": mg.Endpoint, "serviceAccount": mg.ServiceAccount, "tokenAudience": mg.TokenAudience, "caConfigMap": mg.CAConfigMap,
				} {
					if outputs[k], err = mocktest.Await[string](ctx, o); err != nil {
						return err
					}
				}
				outputs["replicas"], err = mocktest.Await[int](ctx, mg.Replicas)
				return err
			})
			m.Golden(t, filepath.Join("testdata", name+".json"))
			mocktest.GoldenJSON(t, filepath.Join("testdata", name+".outputs.json"), outputs)
		})
	}
}
