// Package netpolicy provides the SandboxPolicies component: the network policies of the
// sandbox namespace (sandboxnet.NamespacePolicies: the default deny the manager checks for at
// start, the manager's access to the init port and, on Cilium, the deny of metadata, nodes and
// API server) in the stack's flavour: CiliumNetworkPolicy where Cilium runs, Kubernetes
// NetworkPolicy elsewhere (GKE Dataplane V2, kube-router). The per-sandbox policies are the
// manager's (kubealloc), from the same package.
package netpolicy

import (
	"fmt"

	"github.com/fusebox-dev/fusebox/components/internal/customresource"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apiextensions"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	networkingv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/networking/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Type is the component's type token.
const Type = "fusebox:components:SandboxPolicies"

// SandboxPoliciesArgs configure the component.
type SandboxPoliciesArgs struct {
	// Flavour is how the cluster enforces network policy. Required.
	Flavour sandboxnet.Flavour `pulumi:"flavour"`
	// Namespace is the sandbox namespace the policies are created in: pass the Namespaces
	// component's output so they wait for it. It must name Network.SandboxNamespace.
	Namespace pulumi.StringInput `pulumi:"namespace"`
	// Network parameterises the policies.
	Network sandboxnet.Network `pulumi:"-"`
	// After lists resources the policies wait for (a Cilium install, whose CRDs they need).
	After []pulumi.Resource `pulumi:"-"`
}

// SandboxPolicies are the sandbox namespace's policies.
type SandboxPolicies struct {
	pulumi.ResourceState

	// PolicyNames are "Kind/name" of the created policies.
	PolicyNames pulumi.StringArrayOutput `pulumi:"policyNames"`
	// Policies are the created objects, for dependencies.
	Policies []pulumi.Resource `pulumi:"-"`
}

// NewSandboxPolicies registers the component and the policies.
func NewSandboxPolicies(ctx *pulumi.Context, name string, args *SandboxPoliciesArgs, opts ...pulumi.ResourceOption) (*SandboxPolicies, error) {
	if args == nil || args.Namespace == nil {
		return nil, fmt.Errorf("sandbox policies %s: args with the sandbox namespace are required", name)
	}
	objs, err := sandboxnet.NamespacePolicies(args.Flavour, args.Network)
	if err != nil {
		return nil, fmt.Errorf("sandbox policies %s: %w", name, err)
	}
	c := &SandboxPolicies{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}
	var names pulumi.StringArray
	for _, o := range objs {
		meta := metav1.ObjectMetaArgs{
			Name:      pulumi.String(o.Name),
			Namespace: args.Namespace,
			Labels:    pulumi.ToStringMap(o.Labels),
		}
		ropts := []pulumi.ResourceOption{pulumi.Parent(c), pulumi.DependsOn(args.After)}
		var res pulumi.Resource
		switch spec := o.Spec.(type) {
		case *sandboxnet.NetworkPolicySpec:
			res, err = networkingv1.NewNetworkPolicy(ctx, name+"-"+o.Name, &networkingv1.NetworkPolicyArgs{
				Metadata: meta, Spec: NetworkPolicySpecArgs(spec),
			}, ropts...)
		default:
			var cr *apiextensions.CustomResourceArgs
			if cr, err = customresource.Args(o.APIVersion, o.Kind, meta, o.Spec); err == nil {
				res, err = apiextensions.NewCustomResource(ctx, name+"-"+o.Name, cr, ropts...)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox policies %s: %s %s: %w", name, o.Kind, o.Name, err)
		}
		c.Policies = append(c.Policies, res)
		names = append(names, pulumi.String(o.Kind+"/"+o.Name))
	}
	c.PolicyNames = names.ToStringArrayOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{"policyNames": c.PolicyNames}); err != nil {
		return nil, err
	}
	return c, nil
}

// NetworkPolicySpecArgs converts a rendered NetworkPolicy spec into the typed Pulumi input.
func NetworkPolicySpecArgs(s *sandboxnet.NetworkPolicySpec) networkingv1.NetworkPolicySpecArgs {
	out := networkingv1.NetworkPolicySpecArgs{
		PodSelector: selector(s.PodSelector),
		PolicyTypes: pulumi.ToStringArray(s.PolicyTypes),
	}
	if len(s.Ingress) > 0 {
		var in networkingv1.NetworkPolicyIngressRuleArray
		for _, r := range s.Ingress {
			in = append(in, networkingv1.NetworkPolicyIngressRuleArgs{From: peers(r.From), Ports: ports(r.Ports)})
		}
		out.Ingress = in
	}
	if len(s.Egress) > 0 {
		var eg networkingv1.NetworkPolicyEgressRuleArray
		for _, r := range s.Egress {
			eg = append(eg, networkingv1.NetworkPolicyEgressRuleArgs{To: peers(r.To), Ports: ports(r.Ports)})
		}
		out.Egress = eg
	}
	return out
}

func selector(s sandboxnet.Selector) metav1.LabelSelectorArgs {
	a := metav1.LabelSelectorArgs{}
	if len(s.MatchLabels) > 0 {
		a.MatchLabels = pulumi.ToStringMap(s.MatchLabels)
	}
	return a
}

func peers(ps []sandboxnet.NetworkPolicyPeer) networkingv1.NetworkPolicyPeerArray {
	if len(ps) == 0 {
		return nil
	}
	var out networkingv1.NetworkPolicyPeerArray
	for _, p := range ps {
		a := networkingv1.NetworkPolicyPeerArgs{}
		if p.NamespaceSelector != nil {
			a.NamespaceSelector = selector(*p.NamespaceSelector)
		}
		if p.PodSelector != nil {
			a.PodSelector = selector(*p.PodSelector)
		}
		if p.IPBlock != nil {
			a.IpBlock = networkingv1.IPBlockArgs{Cidr: pulumi.String(p.IPBlock.CIDR), Except: pulumi.ToStringArray(p.IPBlock.Except)}
		}
		out = append(out, a)
	}
	return out
}

func ports(ps []sandboxnet.NetworkPolicyPort) networkingv1.NetworkPolicyPortArray {
	if len(ps) == 0 {
		return nil
	}
	var out networkingv1.NetworkPolicyPortArray
	for _, p := range ps {
		out = append(out, networkingv1.NetworkPolicyPortArgs{Protocol: pulumi.String(p.Protocol), Port: pulumi.Int(p.Port)})
	}
	return out
}
