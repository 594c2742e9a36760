// Package admission provides the SandboxAdmission component: the ValidatingAdmissionPolicy and
// its binding (from policies.SandboxPodPolicy) with which the API server refuses, in the sandbox
// namespace, pods without gVisor, with a service-account token, privileged, with host namespaces
// or host paths, or adding capabilities other than the sandbox server's SETUID and SETGID.
package admission

import (
	"fmt"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies"
	admissionregistrationv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/admissionregistration/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Type is the component's type token.
const Type = "fusebox:components:SandboxAdmission"

// SandboxAdmissionArgs configure the SandboxAdmission component.
type SandboxAdmissionArgs struct {
	// SandboxNamespace is the only namespace the policy applies to. Required.
	SandboxNamespace string `pulumi:"sandboxNamespace"`
	// RuntimeClassName sandbox pods must use (default "gvisor").
	RuntimeClassName string `pulumi:"runtimeClassName"`
}

// SandboxAdmission is the installed admission policy.
type SandboxAdmission struct {
	pulumi.ResourceState

	// PolicyName is the name of the policy and of its binding.
	PolicyName pulumi.StringOutput `pulumi:"policyName"`
	// Policy and Binding are the created objects, for dependencies.
	Policy  *admissionregistrationv1.ValidatingAdmissionPolicy        `pulumi:"-"`
	Binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding `pulumi:"-"`
}

// NewSandboxAdmission registers the component, the policy and its binding.
func NewSandboxAdmission(ctx *pulumi.Context, name string, args *SandboxAdmissionArgs, opts ...pulumi.ResourceOption) (*SandboxAdmission, error) {
	if args == nil {
		return nil, fmt.Errorf("admission %s: args are required", name)
	}
	rc := args.RuntimeClassName
	if rc == "" {
		rc = components.RuntimeClassName
	}
	p, err := policies.SandboxPodPolicy(args.SandboxNamespace, rc)
	if err != nil {
		return nil, fmt.Errorf("admission %s: %w", name, err)
	}
	c := &SandboxAdmission{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}
	c.Policy, err = admissionregistrationv1.NewValidatingAdmissionPolicy(ctx, name+"-policy", p.PolicyArgs(), pulumi.Parent(c))
	if err != nil {
		return nil, fmt.Errorf("admission %s: policy: %w", name, err)
	}
	c.Binding, err = admissionregistrationv1.NewValidatingAdmissionPolicyBinding(ctx, name+"-binding", p.BindingArgs(),
		pulumi.Parent(c), pulumi.DependsOn([]pulumi.Resource{c.Policy}))
	if err != nil {
		return nil, fmt.Errorf("admission %s: binding: %w", name, err)
	}
	c.PolicyName = pulumi.String(p.Name).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{"policyName": c.PolicyName}); err != nil {
		return nil, err
	}
	return c, nil
}
