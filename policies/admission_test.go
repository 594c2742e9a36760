package policies

import (
	"strings"
	"testing"
)

func TestSandboxPodPolicy(t *testing.T) {
	p, err := SandboxPodPolicy("fusebox-sandboxes", "gvisor")
	if err != nil {
		t.Fatal(err)
	}
	if p.Namespace != "fusebox-sandboxes" || !strings.Contains(p.Name, "fusebox-sandboxes") {
		t.Errorf("policy %s scoped to %q", p.Name, p.Namespace)
	}
	// Each rule: the fragments its expression must contain.
	want := map[string][]string{
		"runtime-class":            {"object.spec.runtimeClassName == 'gvisor'", "has(object.spec.runtimeClassName)"},
		"no-automount-token":       {"object.spec.automountServiceAccountToken == false", "has(object.spec.automountServiceAccountToken)"},
		"no-projected-token":       {"!has(s.serviceAccountToken)"},
		"no-privileged":            {"c.securityContext.privileged == false", "object.spec.containers.all(", "object.spec.initContainers.all(", "object.spec.ephemeralContainers.all("},
		"no-host-namespaces":       {"object.spec.hostNetwork", "object.spec.hostPID", "object.spec.hostIPC"},
		"no-host-path":             {"!has(v.hostPath)"},
		"only-server-capabilities": {"c.securityContext.capabilities.add.all(x, x in ['SETUID', 'SETGID', 'CAP_SETUID', 'CAP_SETGID'])", "object.spec.ephemeralContainers.all("},
	}
	got := map[string]Validation{}
	for _, v := range p.Validations {
		got[v.Name] = v
		if v.Message == "" {
			t.Errorf("%s has no message", v.Name)
		}
		if strings.Count(v.Expression, "(") != strings.Count(v.Expression, ")") {
			t.Errorf("%s: unbalanced parentheses: %s", v.Name, v.Expression)
		}
	}
	if len(got) != len(want) {
		t.Errorf("validations %v, want %d", got, len(want))
	}
	for name, frags := range want {
		v, ok := got[name]
		if !ok {
			t.Errorf("missing validation %s", name)
			continue
		}
		for _, f := range frags {
			if !strings.Contains(v.Expression, f) {
				t.Errorf("%s: expression lacks %q: %s", name, f, v.Expression)
			}
		}
	}
}

func TestSandboxPodPolicyNeedsNamespace(t *testing.T) {
	if _, err := SandboxPodPolicy("", "gvisor"); err != ErrNoNamespace {
		t.Fatalf("want ErrNoNamespace, got %v", err)
	}
}
