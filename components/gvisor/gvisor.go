// Package gvisor provides the GVisor component: the "gvisor" RuntimeClass that sandbox pods must
// use, and (EKSUserData) the node-side install of runsc for Karpenter-provisioned EKS nodes.
//
// Per cloud: on GKE, GKE Sandbox (node pools with sandboxConfig type gvisor) provides runsc and
// its own RuntimeClass "gvisor", so the component creates nothing; on EKS and AKS it creates the
// RuntimeClass and the nodes get runsc from their node class; on local clusters it creates the
// RuntimeClass and expects runsc on the nodes already.
package gvisor

import (
	"fmt"

	"github.com/fusebox-dev/fusebox/components"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	nodev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/node/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Type is the component's type token.
const Type = "fusebox:components:GVisor"

// Sources of the RuntimeClass, reported in the RuntimeClassSource output.
const (
	SourceCreated    = "created"
	SourceGKESandbox = "gke-sandbox"
)

// GVisorArgs configure the GVisor component.
type GVisorArgs struct {
	// Cloud selects whether the RuntimeClass is created (not on GKE).
	Cloud components.Cloud `pulumi:"cloud"`
	// ScheduleOnSandboxNodes makes the RuntimeClass place its pods on the sandbox node pool
	// (nodeSelector on the pool label, toleration of the sandbox taint). Set it where Karpenter
	// provisions that pool; leave it off on clusters whose nodes all run runsc.
	ScheduleOnSandboxNodes bool `pulumi:"scheduleOnSandboxNodes"`
}

// GVisor is the installed gVisor runtime.
type GVisor struct {
	pulumi.ResourceState

	// RuntimeClassName is the RuntimeClass sandbox pods use ("gvisor").
	RuntimeClassName pulumi.StringOutput `pulumi:"runtimeClassName"`
	// RuntimeClassSource says who provides it: "created" or "gke-sandbox".
	RuntimeClassSource pulumi.StringOutput `pulumi:"runtimeClassSource"`
}

// NewGVisor registers the component and, except on GKE, the RuntimeClass.
func NewGVisor(ctx *pulumi.Context, name string, args *GVisorArgs, opts ...pulumi.ResourceOption) (*GVisor, error) {
	if args == nil {
		return nil, fmt.Errorf("gvisor %s: args are required", name)
	}
	if _, err := components.ParseCloud(string(args.Cloud)); err != nil {
		return nil, fmt.Errorf("gvisor %s: %w", name, err)
	}
	c := &GVisor{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}

	source := SourceCreated
	if args.Cloud == components.GKE {
		// GKE Sandbox installs RuntimeClass "gvisor" (handler runsc) with its own node
		// selector and toleration for sandbox-enabled node pools; creating ours would conflict.
		source = SourceGKESandbox
	} else {
		rc := &nodev1.RuntimeClassArgs{
			Metadata: metav1.ObjectMetaArgs{
				Name:   pulumi.String(components.RuntimeClassName),
				Labels: pulumi.StringMap{"app.kubernetes.io/part-of": pulumi.String("fusebox")},
			},
			Handler: pulumi.String(components.RuntimeHandler),
		}
		if args.ScheduleOnSandboxNodes {
			rc.Scheduling = nodev1.SchedulingArgs{
				NodeSelector: pulumi.StringMap{components.SandboxPoolLabelKey: pulumi.String(components.SandboxPoolLabelValue)},
				Tolerations: corev1.TolerationArray{corev1.TolerationArgs{
					Key:      pulumi.String(components.SandboxTaintKey),
					Operator: pulumi.String("Equal"),
					Value:    pulumi.String(components.SandboxTaintValue),
					Effect:   pulumi.String(components.SandboxTaintEffect),
				}},
			}
		}
		if _, err := nodev1.NewRuntimeClass(ctx, name+"-runtimeclass", rc, pulumi.Parent(c)); err != nil {
			return nil, fmt.Errorf("gvisor %s: RuntimeClass: %w", name, err)
		}
	}

	c.RuntimeClassName = pulumi.String(components.RuntimeClassName).ToStringOutput()
	c.RuntimeClassSource = pulumi.String(source).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{
		"runtimeClassName":   c.RuntimeClassName,
		"runtimeClassSource": c.RuntimeClassSource,
	}); err != nil {
		return nil, err
	}
	return c, nil
}
