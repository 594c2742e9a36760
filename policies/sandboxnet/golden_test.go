package sandboxnet

import (
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest/golden"
)

// TestSandboxPoliciesGolden: the objects SandboxPolicies renders per flavour, and its
// refusals, are what testdata/sandbox-policies.json holds.
func TestSandboxPoliciesGolden(t *testing.T) {
	lists := map[string][]string{
		"mixed":        allow,
		"ips only":     {"192.0.2.1:443", "10.1.2.3:443", "10.1.2.3:443", "172.16.0.9:8080", "[fd00::1]:22"},
		"names only":   {"a.example.com:443", "a.example.com:443", "*.example.org:443", "a.example.com:80"},
		"empty":        nil,
		"metadata":     {"169.254.169.254:80"},
		"bad port":     {"a.example.com:0"},
		"bad wildcard": {"a*.example.com:443"},
	}
	out := map[string]any{}
	for _, f := range []Flavour{Cilium, GKE, Kubernetes, "calico"} {
		for name, l := range lists {
			objs, err := SandboxPolicies(f, network(), "sb-1", l)
			key := string(f) + ": " + name
			if err != nil {
				out[key] = "error: " + err.Error()
				if cerr := CheckAllowlist(f, l); f != "calico" && (cerr == nil || cerr.Error() != err.Error()) {
					t.Errorf("%s: CheckAllowlist %v, SandboxPolicies %v", key, cerr, err)
				}
				continue
			}
			out[key] = objs
		}
	}
	for name, n := range map[string]Network{"no sandbox namespace": {}, "no agents": {SandboxNamespace: "s", ManagerNamespace: "m", InitPort: 1, DataPort: 2}} {
		_, err := SandboxPolicies(Cilium, n, "sb-1", allow)
		out["network: "+name] = "error: " + err.Error()
	}
	_, err := SandboxPolicies(Cilium, network(), "", allow)
	out["empty id"] = "error: " + err.Error()

	golden.JSON(t, filepath.Join("testdata", "sandbox-policies.json"), out)
}
