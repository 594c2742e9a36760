// Package cilium provides the Cilium component: optionally Cilium itself, installed with Helm
// from a configurable chart source (a repository, or a local chart path for in-VPC mirrors) with
// the values gVisor needs, and always the default-deny CiliumNetworkPolicies of the sandbox
// namespace (policies.SandboxNetworkPolicies).
//
// gVisor sandboxes have their own network stack, so Cilium's socket-level load balancing must
// stay in the host namespace (socketLB.hostNamespaceOnly=true) or service traffic from sandboxes
// bypasses it.
package cilium

import (
	"errors"
	"fmt"

	"github.com/fusebox-dev/fusebox/components/internal/customresource"
	"github.com/fusebox-dev/fusebox/policies"
	"github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apiextensions"
	helmv3 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/helm/v3"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Type is the component's type token.
const Type = "fusebox:components:Cilium"

// ChartSource says where the Cilium chart comes from: Path (a local chart directory or .tgz)
// or Repo with Name and a pinned Version.
type ChartSource struct {
	Repo    string `pulumi:"repo"`
	Name    string `pulumi:"name"` // default "cilium"
	Version string `pulumi:"version"`
	Path    string `pulumi:"path"`
}

// CiliumArgs configure the Cilium component.
type CiliumArgs struct {
	// Install installs Cilium with Helm; false uses the cluster's existing Cilium (which must
	// already have socketLB.hostNamespaceOnly=true).
	Install bool `pulumi:"install"`
	// Chart is required when Install is set.
	Chart ChartSource `pulumi:"chart"`
	// ReleaseNamespace is where Cilium is installed (default kube-system).
	ReleaseNamespace string `pulumi:"releaseNamespace"`
	// PolicyNamespace is the namespace the policies are created in: pass the sandbox
	// Namespace's output so they wait for it. It must name Network.SandboxNamespace.
	PolicyNamespace pulumi.StringInput `pulumi:"policyNamespace"`
	// Network parameterises the sandbox namespace's policies.
	Network policies.SandboxNetwork `pulumi:"-"`
}

// HelmValues are the chart values fusebox sets.
type HelmValues struct {
	SocketLB SocketLB `json:"socketLB"`
}

// SocketLB holds Cilium's socket load-balancing values.
type SocketLB struct {
	HostNamespaceOnly bool `json:"hostNamespaceOnly"`
}

// Cilium is the installed (or reused) Cilium with the sandbox policies.
type Cilium struct {
	pulumi.ResourceState

	// Installed reports whether this stack installed Cilium.
	Installed pulumi.BoolOutput `pulumi:"installed"`
	// PolicyNames are the CiliumNetworkPolicies created in the sandbox namespace.
	PolicyNames pulumi.StringArrayOutput `pulumi:"policyNames"`
	// Policies are the created policy objects, for dependencies.
	Policies []*apiextensions.CustomResource `pulumi:"-"`
}

// ErrNoChart is returned when Install is set without a usable chart source.
var ErrNoChart = errors.New("cilium chart source: set path, or repo with a pinned version")

// NewCilium registers the component, the Helm release if Install, and the policies.
func NewCilium(ctx *pulumi.Context, name string, args *CiliumArgs, opts ...pulumi.ResourceOption) (*Cilium, error) {
	if args == nil {
		return nil, fmt.Errorf("cilium %s: args are required", name)
	}
	if args.PolicyNamespace == nil {
		return nil, fmt.Errorf("cilium %s: policy namespace is required", name)
	}
	if args.Install && args.Chart.Path == "" && (args.Chart.Repo == "" || args.Chart.Version == "") {
		return nil, fmt.Errorf("cilium %s: %w", name, ErrNoChart)
	}
	nps, err := policies.SandboxNetworkPolicies(args.Network)
	if err != nil {
		return nil, fmt.Errorf("cilium %s: %w", name, err)
	}
	c := &Cilium{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}

	var after []pulumi.Resource
	if args.Install {
		rel, err := newRelease(ctx, name, args, c)
		if err != nil {
			return nil, fmt.Errorf("cilium %s: helm release: %w", name, err)
		}
		after = append(after, rel)
	}

	var names pulumi.StringArray
	for _, np := range nps {
		cr, err := customresource.Args(policies.CiliumAPIVersion, policies.CiliumPolicyKind, metav1.ObjectMetaArgs{
			Name:      pulumi.String(np.Name),
			Namespace: args.PolicyNamespace,
			Labels:    pulumi.StringMap{"app.kubernetes.io/part-of": pulumi.String("fusebox")},
		}, np.Spec)
		if err != nil {
			return nil, fmt.Errorf("cilium %s: %w", name, err)
		}
		res, err := apiextensions.NewCustomResource(ctx, name+"-"+np.Name, cr, pulumi.Parent(c), pulumi.DependsOn(after))
		if err != nil {
			return nil, fmt.Errorf("cilium %s: policy %s: %w", name, np.Name, err)
		}
		c.Policies = append(c.Policies, res)
		names = append(names, pulumi.String(np.Name))
	}

	c.Installed = pulumi.Bool(args.Install).ToBoolOutput()
	c.PolicyNames = names.ToStringArrayOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{
		"installed":   c.Installed,
		"policyNames": c.PolicyNames,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func newRelease(ctx *pulumi.Context, name string, args *CiliumArgs, parent pulumi.Resource) (*helmv3.Release, error) {
	values, err := customresource.ToMap(HelmValues{SocketLB: SocketLB{HostNamespaceOnly: true}})
	if err != nil {
		return nil, err
	}
	ns := args.ReleaseNamespace
	if ns == "" {
		ns = "kube-system"
	}
	ra := &helmv3.ReleaseArgs{
		Name:      pulumi.String("cilium"),
		Namespace: pulumi.String(ns),
		Values:    pulumi.ToMap(values),
	}
	if args.Chart.Path != "" {
		ra.Chart = pulumi.String(args.Chart.Path)
	} else {
		chart := args.Chart.Name
		if chart == "" {
			chart = "cilium"
		}
		ra.Chart = pulumi.String(chart)
		ra.Version = pulumi.String(args.Chart.Version)
		ra.RepositoryOpts = helmv3.RepositoryOptsArgs{Repo: pulumi.String(args.Chart.Repo)}
	}
	return helmv3.NewRelease(ctx, name+"-release", ra, pulumi.Parent(parent))
}
