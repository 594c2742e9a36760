// Package cilium provides the Cilium component: optionally Cilium itself, installed with Helm
// from a configurable chart source (a repository, or a local chart path for in-VPC mirrors) with
// the values gVisor needs and, for in-VPC installs, every image the chart runs taken from a
// mirror. The sandbox namespace's policies are components/netpolicy's.
//
// gVisor sandboxes have their own network stack, so Cilium's socket-level load balancing must
// stay in the host namespace (socketLB.hostNamespaceOnly=true) or service traffic from sandboxes
// bypasses it.
package cilium

import (
	"errors"
	"fmt"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/internal/customresource"
	helmv3 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/helm/v3"
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

// Images override the images the chart runs (each repository@sha256:..., e.g. an in-VPC
// mirror's copy); empty ones keep the chart's defaults, which name public registries.
type Images struct {
	Agent    string `pulumi:"agent" json:"agent"`
	Operator string `pulumi:"operator" json:"operator"`
	Envoy    string `pulumi:"envoy" json:"envoy"`
}

// CiliumArgs configure the Cilium component.
type CiliumArgs struct {
	// Install installs Cilium with Helm; false uses the cluster's existing Cilium (which must
	// already have socketLB.hostNamespaceOnly=true: `fusebox up` checks it).
	Install bool `pulumi:"install"`
	// Chart is required when Install is set.
	Chart ChartSource `pulumi:"chart"`
	// Images, when set, replace the chart's images (Install only).
	Images Images `pulumi:"images"`
	// ReleaseNamespace is where Cilium is installed (default kube-system).
	ReleaseNamespace string `pulumi:"releaseNamespace"`
}

// HelmValues are the chart values fusebox sets.
type HelmValues struct {
	SocketLB SocketLB `json:"socketLB"`
	// Image, Operator and Envoy override the chart's images ("override" takes a whole
	// reference, digest included).
	Image    *ImageValue     `json:"image,omitempty"`
	Operator *OperatorValues `json:"operator,omitempty"`
	Envoy    *EnvoyValues    `json:"envoy,omitempty"`
}

// SocketLB holds Cilium's socket load-balancing values.
type SocketLB struct {
	HostNamespaceOnly bool `json:"hostNamespaceOnly"`
}

// ImageValue is a chart image value.
type ImageValue struct {
	Override  string `json:"override"`
	UseDigest bool   `json:"useDigest"`
}

// OperatorValues hold the operator's image.
type OperatorValues struct {
	Image ImageValue `json:"image"`
}

// EnvoyValues hold the Envoy DaemonSet's image.
type EnvoyValues struct {
	Image ImageValue `json:"image"`
}

// Cilium is the installed (or reused) Cilium.
type Cilium struct {
	pulumi.ResourceState

	// Installed reports whether this stack installed Cilium.
	Installed pulumi.BoolOutput `pulumi:"installed"`
	// Release is the Helm release (nil when Install is off), for dependencies.
	Release pulumi.Resource `pulumi:"-"`
}

// ReleaseTimeoutSeconds bounds Helm's wait for the Cilium release (docs/deploy.md): its agents
// roll out on every node, each pulling its images.
const ReleaseTimeoutSeconds = 900

// ErrNoChart is returned when Install is set without a usable chart source.
var ErrNoChart = errors.New("cilium chart source: set path, or repo with a pinned version")

// NewCilium registers the component and, if Install, the Helm release.
func NewCilium(ctx *pulumi.Context, name string, args *CiliumArgs, opts ...pulumi.ResourceOption) (*Cilium, error) {
	if args == nil {
		return nil, fmt.Errorf("cilium %s: args are required", name)
	}
	if args.Install && args.Chart.Path == "" && (args.Chart.Repo == "" || args.Chart.Version == "") {
		return nil, fmt.Errorf("cilium %s: %w", name, ErrNoChart)
	}
	values, err := args.values()
	if err != nil {
		return nil, fmt.Errorf("cilium %s: %w", name, err)
	}
	c := &Cilium{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}
	if args.Install {
		rel, err := newRelease(ctx, name, args, values, c)
		if err != nil {
			return nil, fmt.Errorf("cilium %s: helm release: %w", name, err)
		}
		c.Release = rel
	}
	c.Installed = pulumi.Bool(args.Install).ToBoolOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{"installed": c.Installed}); err != nil {
		return nil, err
	}
	return c, nil
}

// values returns the chart values, refusing image overrides not pinned by digest.
func (a *CiliumArgs) values() (HelmValues, error) {
	v := HelmValues{SocketLB: SocketLB{HostNamespaceOnly: true}}
	for _, im := range []struct {
		key, ref string
		set      func(ImageValue)
	}{
		{"agent", a.Images.Agent, func(i ImageValue) { v.Image = &i }},
		{"operator", a.Images.Operator, func(i ImageValue) { v.Operator = &OperatorValues{Image: i} }},
		{"envoy", a.Images.Envoy, func(i ImageValue) { v.Envoy = &EnvoyValues{Image: i} }},
	} {
		if im.ref == "" {
			continue
		}
		if !a.Install {
			return v, fmt.Errorf("images.%s is set but install is off (the cluster's own Cilium keeps its images)", im.key)
		}
		if err := components.ValidateImage(im.ref); err != nil {
			return v, fmt.Errorf("images.%s: %w", im.key, err)
		}
		im.set(ImageValue{Override: im.ref, UseDigest: true})
	}
	return v, nil
}

func newRelease(ctx *pulumi.Context, name string, args *CiliumArgs, v HelmValues, parent pulumi.Resource) (*helmv3.Release, error) {
	values, err := customresource.ToMap(v)
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
		// Helm waits for every Cilium agent (one per node) and the operator: ReleaseTimeout,
		// not Helm's 5 minutes (a Helm release takes no customTimeouts).
		Timeout: pulumi.Int(ReleaseTimeoutSeconds),
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
