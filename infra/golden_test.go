package infra

import (
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
)

// goldenCases are the stacks, each released with the test release, and variants of them that
// take the branches the stack files leave alone: every setting the components read.
func goldenCases(t *testing.T) map[string]struct {
	stack string
	cfg   map[string]string
} {
	t.Helper()
	cases := map[string]struct {
		stack string
		cfg   map[string]string
	}{}
	add := func(name, stack string, edit func(map[string]string)) {
		cfg := stackConfig(t, stack)
		if edit != nil {
			edit(cfg)
		}
		cases[name] = struct {
			stack string
			cfg   map[string]string
		}{stack, cfg}
	}
	for _, s := range []string{"eks-dev", "eks-prod", "gke-dev", "aks-dev", "local"} {
		add(s, s, nil)
	}
	add("eks-dev-everything", "eks-dev", func(c map[string]string) {
		c["fusebox:imagePullSecrets"] = `["regcred","other"]`
		c["fusebox:access"] = `[{"serviceAccounts":["agents/coder"],"templates":["default"],"egress":["10.1.2.3:443","*.example.com:443"]},{"namespaces":["ci"]}]`
		c["fusebox:operators"] = `["ops/auditor"]`
		c["fusebox:manager"] = `{"replicas":3,"requiredAntiAffinity":true,"serviceType":"LoadBalancer","cpu":"500m","memory":"512Mi","skipAwait":true}`
		c["fusebox:namespaces"] = `{"manager":"fb-system","sandbox":"fb-sandboxes","create":false}`
		c["fusebox:egress"] = `{"dataClientNamespaces":["agents","ci"],"dataClientCIDRs":["10.9.0.0/16"],"agentLabels":{"team":"ml","role":"agent"}}`
		c["fusebox:pool"] = `{"size":1,"max":5,"estimator":"pid","sandboxCPU":"2","sandboxCPULimit":"4","sandboxMemory":"4Gi"}`
		c["fusebox:cilium"] = `{"install":true,"chart":{"repo":"https://helm.cilium.io","name":"cilium","version":"1.16.5"}}`
	})
	add("eks-prod-in-vpc", "eks-prod", func(c map[string]string) {
		c["fusebox:inVPC"] = "true"
		c["fusebox:privateHosts"] = `["127.0.0.1", "registry.example.com", "*.example.com"]`
	})
	add("aks-dev-pull-secrets", "aks-dev", func(c map[string]string) {
		c["fusebox:imagePullSecrets"] = `["regcred"]`
		c["fusebox:networkPolicy"] = "kubernetes"
	})
	add("gke-dev-cidrs", "gke-dev", func(c map[string]string) {
		c["fusebox:egress"] = `{"dataClientCIDRs":["192.0.2.0/24"]}`
		c["fusebox:access"] = `[{"namespaces":["agents"]}]`
	})
	add("local-cilium", "local", func(c map[string]string) {
		c["fusebox:networkPolicy"] = "cilium"
		c["fusebox:namespaces"] = `{"create":true}`
	})
	return cases
}

// TestProgramGolden: everything Program registers for each case (type, name, parent,
// dependencies, inputs) is what testdata/program/<case>.json holds, so that a refactoring
// that changes any rendered object or the resource graph fails here.
func TestProgramGolden(t *testing.T) {
	for name, tc := range goldenCases(t) {
		t.Run(name, func(t *testing.T) {
			m, err := runStack(tc.stack, tc.cfg)
			if err != nil {
				t.Fatalf("Program: %v", err)
			}
			if len(m.All()) < 10 {
				t.Fatalf("only %d resources registered", len(m.All()))
			}
			m.Golden(t, filepath.Join("testdata", "program", name+".json"))
		})
	}
}

// TestConfigGolden: the configuration LoadStackFile reads for each case is what
// testdata/config/<case>.json holds.
func TestConfigGolden(t *testing.T) {
	for name, tc := range goldenCases(t) {
		t.Run(name, func(t *testing.T) {
			c, err := loadConfig(fileConfig(tc.cfg), tc.stack)
			if err != nil {
				t.Fatal(err)
			}
			mocktest.GoldenJSON(t, filepath.Join("testdata", "config", name+".json"), map[string]any{
				"config": c, "cloud": c.Cloud, "registry": c.Registry, "access": c.Access, "operators": c.Operators,
				"networkPolicy": c.NetworkPolicy, "inVPC": c.InVPC, "privateHosts": c.PrivateHosts,
				"imagePullSecrets": c.ImagePullSecrets, "preflight": c.Preflight(tc.stack),
			})
		})
	}
}
