// Package gvisor provides the GVisor component: the "gvisor" RuntimeClass that sandbox pods must
// use, and the node-side install of runsc and containerd-shim-runsc-v1 on sandbox nodes.
//
// Per cloud: on GKE, GKE Sandbox (node pools with sandboxConfig type gvisor) provides runsc and
// its own RuntimeClass "gvisor", so the component creates nothing. On EKS it creates the
// RuntimeClass, the nodes install runsc from their EC2NodeClass userData (EKSUserData, passed
// to the karpenter component), and the node installer runs in verify-only mode: it removes the
// node's startup taint once runsc is registered with containerd. On AKS, whose AKSNodeClass takes no userData, it creates the
// RuntimeClass and a node-installer DaemonSet in kube-system that runs only on the sandbox pool
// (node-installer.sh: runsc and its shim from the installer image, checked against the digests
// recorded at image build, containerd runtime entry, containerd restart, removal of the node's
// startup taint, node label fusebox.dev/gvisor=ready). The startup taint
// (karpenter.StartupTaintKey, set by the AKS NodePool on new nodes) keeps sandbox pods off a
// node until the installer has removed it, and stays where the install fails. On local
// clusters it creates the RuntimeClass and expects runsc on the nodes already.
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

// The RuntimeClass's overhead.podFixed, from gVisor measured with the pinned runsc
// (hack/gvisor-overhead.sh; docs/performance.md, "gVisor's pod overhead"): an idle pod of a
// pause container and one container costs its sentry and two gofers at most 89,420 KiB of
// resident memory in ten runs, rounded up to 88 MiB, and no measurable CPU while idle (no
// clock tick in 30 s, under 0.34 millicores), rounded up to Kubernetes's smallest unit.
const (
	OverheadMemory = "88Mi"
	OverheadCPU    = "1m"
)

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
	// NodeInstaller configures the node-side install on AKS. Required on AKS, refused
	// elsewhere (EKS installs through userData, GKE Sandbox and local nodes bring runsc).
	NodeInstaller *NodeInstallerArgs `pulumi:"nodeInstaller"`
}

// GVisor is the installed gVisor runtime.
type GVisor struct {
	pulumi.ResourceState

	// RuntimeClassName is the RuntimeClass sandbox pods use ("gvisor").
	RuntimeClassName pulumi.StringOutput `pulumi:"runtimeClassName"`
	// RuntimeClassSource says who provides it: "created" or "gke-sandbox".
	RuntimeClassSource pulumi.StringOutput `pulumi:"runtimeClassSource"`
	// NodeInstaller is "namespace/name" of the node-installer DaemonSet, or "" where there is
	// none (every cloud but AKS).
	NodeInstaller pulumi.StringOutput `pulumi:"nodeInstaller"`
}

// NewGVisor registers the component and, except on GKE, the RuntimeClass, and on AKS and EKS
// the node installer.
func NewGVisor(ctx *pulumi.Context, name string, args *GVisorArgs, opts ...pulumi.ResourceOption) (*GVisor, error) {
	if err := checkArgs(name, args); err != nil {
		return nil, err
	}
	c := &GVisor{}
	if err := ctx.RegisterComponentResource(Type, name, c, opts...); err != nil {
		return nil, err
	}
	source, err := runtimeClass(ctx, name, args, c)
	if err != nil {
		return nil, err
	}
	installer := ""
	if args.NodeInstaller != nil {
		if _, err := newNodeInstaller(ctx, name, args.NodeInstaller, c); err != nil {
			return nil, fmt.Errorf("gvisor %s: %w", name, err)
		}
		installer = args.NodeInstaller.namespace() + "/" + InstallerName
	}

	c.RuntimeClassName = pulumi.String(components.RuntimeClassName).ToStringOutput()
	c.RuntimeClassSource = pulumi.String(source).ToStringOutput()
	c.NodeInstaller = pulumi.String(installer).ToStringOutput()
	if err := ctx.RegisterResourceOutputs(c, pulumi.Map{
		"runtimeClassName":   c.RuntimeClassName,
		"runtimeClassSource": c.RuntimeClassSource,
		"nodeInstaller":      c.NodeInstaller,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// checkArgs refuses a node installer where the cloud needs another (or none).
func checkArgs(name string, args *GVisorArgs) error {
	if args == nil {
		return fmt.Errorf("gvisor %s: args are required", name)
	}
	if _, err := components.ParseCloud(string(args.Cloud)); err != nil {
		return fmt.Errorf("gvisor %s: %w", name, err)
	}
	switch {
	case args.Cloud == components.AKS && (args.NodeInstaller == nil || args.NodeInstaller.VerifyOnly):
		return fmt.Errorf("gvisor %s: %w: an installing one is required on aks (AKSNodeClass has no userData)", name, ErrBadInstaller)
	case args.Cloud == components.EKS && (args.NodeInstaller == nil || !args.NodeInstaller.VerifyOnly):
		return fmt.Errorf("gvisor %s: %w: a verify-only one is required on eks (it removes the startup taint once the userData's runsc is registered)", name, ErrBadInstaller)
	case args.Cloud != components.AKS && args.Cloud != components.EKS && args.NodeInstaller != nil:
		return fmt.Errorf("gvisor %s: %w: only used on aks and eks, not on %s", name, ErrBadInstaller, args.Cloud)
	case args.NodeInstaller != nil:
		if err := args.NodeInstaller.validate(); err != nil {
			return fmt.Errorf("gvisor %s: %w", name, err)
		}
	}
	return nil
}

// runtimeClass registers the "gvisor" RuntimeClass, except on GKE, and returns who provides
// it (RuntimeClassSource).
func runtimeClass(ctx *pulumi.Context, name string, args *GVisorArgs, parent pulumi.Resource) (string, error) {
	if args.Cloud == components.GKE {
		// GKE Sandbox installs RuntimeClass "gvisor" (handler runsc) with its own node
		// selector and toleration for sandbox-enabled node pools; creating ours would conflict.
		return SourceGKESandbox, nil
	}
	rc := &nodev1.RuntimeClassArgs{
		Metadata: metav1.ObjectMetaArgs{
			Name:   pulumi.String(components.RuntimeClassName),
			Labels: pulumi.StringMap{"app.kubernetes.io/part-of": pulumi.String("fusebox")},
		},
		Handler: pulumi.String(components.RuntimeHandler),
		// What the sandbox costs beyond its containers: the scheduler adds it to each
		// sandbox pod's requests, and the kubelet to its pod cgroup's limit.
		Overhead: nodev1.OverheadArgs{PodFixed: pulumi.StringMap{
			"cpu":    pulumi.String(OverheadCPU),
			"memory": pulumi.String(OverheadMemory),
		}},
	}
	if args.ScheduleOnSandboxNodes {
		rc.Scheduling = sandboxNodeScheduling()
	}
	if _, err := nodev1.NewRuntimeClass(ctx, name+"-runtimeclass", rc, pulumi.Parent(parent)); err != nil {
		return "", fmt.Errorf("gvisor %s: RuntimeClass: %w", name, err)
	}
	return SourceCreated, nil
}

// sandboxNodeScheduling places the RuntimeClass's pods on the sandbox node pool: its label
// selected, its taint tolerated.
//
// It does not also select ReadyLabelKey (set by the AKS node installer once runsc works):
// Karpenter launches nodes only for pods whose node selectors its NodePool's labels satisfy,
// and a label added after launch is not among them, so sandbox pods would stay pending on an
// empty pool. The gate on AKS is the NodePool's startup taint instead, which these
// tolerations deliberately leave out: Karpenter provisions for pods that do not tolerate a
// startup taint, and the scheduler places them only once the installer has removed it.
func sandboxNodeScheduling() nodev1.SchedulingArgs {
	return nodev1.SchedulingArgs{
		NodeSelector: pulumi.StringMap{components.SandboxPoolLabelKey: pulumi.String(components.SandboxPoolLabelValue)},
		Tolerations: corev1.TolerationArray{corev1.TolerationArgs{
			Key:      pulumi.String(components.SandboxTaintKey),
			Operator: pulumi.String("Equal"),
			Value:    pulumi.String(components.SandboxTaintValue),
			Effect:   pulumi.String(components.SandboxTaintEffect),
		}},
	}
}
