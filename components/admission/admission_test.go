package admission

import (
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	policyType  = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
	bindingType = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
)

func TestSandboxAdmission(t *testing.T) {
	var name string
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		a, err := NewSandboxAdmission(ctx, "fb", &SandboxAdmissionArgs{SandboxNamespace: "sbx"})
		if err != nil {
			return err
		}
		name, err = mocktest.Await[string](ctx, a.PolicyName)
		return err
	})
	m.One(t, Type)
	m.AssertParented(t, Type)

	pol := m.One(t, policyType)
	p := pol.Props()
	if pol.Name != "fb-policy" || mocktest.Str(p, "metadata", "name") != name {
		t.Errorf("policy %s %v, output %q", pol.Name, mocktest.Dig(p, "metadata"), name)
	}
	if mocktest.Str(p, "spec", "failurePolicy") != "Fail" {
		t.Errorf("failurePolicy %v", mocktest.Dig(p, "spec", "failurePolicy"))
	}
	mc := mocktest.Dig(p, "spec", "matchConstraints")
	if mocktest.Str(mc, "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name") != "sbx" ||
		mocktest.Str(mc, "resourceRules", 0, "resources", 0) != "pods" {
		t.Errorf("matchConstraints %v", mc)
	}
	vals, _ := mocktest.Dig(p, "spec", "validations").([]any)
	if len(vals) != 7 {
		t.Fatalf("want 7 validations, got %d", len(vals))
	}
	for _, v := range vals {
		if mocktest.Str(v, "expression") == "" || mocktest.Str(v, "message") == "" {
			t.Errorf("validation %v", v)
		}
	}
	if mocktest.Str(vals[0], "expression") != "has(object.spec.runtimeClassName) && object.spec.runtimeClassName == 'gvisor'" {
		t.Errorf("runtime class rule %v", vals[0])
	}

	b := m.One(t, bindingType).Props()
	if mocktest.Str(b, "spec", "policyName") != name || mocktest.Str(b, "spec", "validationActions", 0) != "Deny" {
		t.Errorf("binding spec %v", mocktest.Dig(b, "spec"))
	}
	if got := mocktest.Str(b, "spec", "matchResources", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"); got != "sbx" {
		t.Errorf("binding bound to namespace %q, want sbx", got)
	}
}

func TestSandboxAdmissionNeedsNamespace(t *testing.T) {
	if _, err := mocktest.Run(func(ctx *pulumi.Context) error {
		_, err := NewSandboxAdmission(ctx, "fb", &SandboxAdmissionArgs{})
		return err
	}); err == nil {
		t.Fatal("policy without a namespace was accepted")
	}
}
