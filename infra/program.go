// Package infra is fusebox's Pulumi program: Program reads the stack's typed configuration
// (LoadConfig; the only place that reads configuration) and composes the components that
// install fusebox into an existing cluster on EKS, GKE, AKS or a local control plane.
//
// Layout: Program lives here, in an importable package, so that both the standard Pulumi CLI
// (infra/Pulumi.yaml points its `main` at infra/cmd/pulumi-program, a main calling
// pulumi.Run(infra.Program)) and the fusebox CLI (Automation API inline program) run the same
// function. Stack files live in ../stacks (stackConfigDir).
package infra

import (
	"fmt"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/admission"
	"github.com/fusebox-dev/fusebox/components/cilium"
	"github.com/fusebox-dev/fusebox/components/gvisor"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/components/netpolicy"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Program installs fusebox as the stack's configuration says and exports:
// managerEndpoint, cloud, namespaces, runtimeClass, runtimeClassSource, gvisorNodeInstaller, nodePool,
// nodeClassKind, gkeNodePool, ciliumInstalled, networkPolicy, networkPolicies, admissionPolicy.
func Program(ctx *pulumi.Context) error {
	c, err := LoadConfig(ctx)
	if err != nil {
		return err
	}
	return Install(ctx, c)
}

// Install composes the components for a loaded configuration.
func Install(ctx *pulumi.Context, c *Config) error {
	karpenterCloud := c.Cloud == components.EKS || c.Cloud == components.AKS

	ns, err := manager.NewNamespaces(ctx, "fusebox", &manager.NamespacesArgs{
		Manager: c.Namespaces.Manager, Sandbox: c.Namespaces.Sandbox, Existing: !c.Namespaces.CreateNamespaces(),
	})
	if err != nil {
		return err
	}

	gargs := &gvisor.GVisorArgs{Cloud: c.Cloud, ScheduleOnSandboxNodes: karpenterCloud}
	switch c.Cloud {
	case components.AKS:
		gargs.NodeInstaller = &gvisor.NodeInstallerArgs{
			Image:            c.GVisor.InstallerImage,
			BinaryBaseURL:    c.GVisor.baseURL(),
			SHA256:           c.GVisor.SHA256,
			ImagePullSecrets: c.ImagePullSecrets,
		}
	case components.EKS:
		// The userData installs runsc; the installer only checks it and removes the taint.
		gargs.NodeInstaller = &gvisor.NodeInstallerArgs{
			Image: c.GVisor.InstallerImage, VerifyOnly: true, ImagePullSecrets: c.ImagePullSecrets,
		}
	}
	gv, err := gvisor.NewGVisor(ctx, "fusebox", gargs)
	if err != nil {
		return err
	}

	kargs, err := karpenterArgs(c)
	if err != nil {
		return err
	}
	kp, err := karpenter.NewKarpenter(ctx, "fusebox", kargs)
	if err != nil {
		return err
	}

	cil, err := cilium.NewCilium(ctx, "fusebox", &cilium.CiliumArgs{
		Install: c.Cilium.Install,
		Chart:   cilium.ChartSource(c.Cilium.Chart),
		Images:  c.Cilium.Images,
	})
	if err != nil {
		return err
	}
	network := sandboxnet.Network{
		SandboxNamespace: c.Namespaces.Sandbox,
		ManagerNamespace: c.Namespaces.Manager,
		ManagerLabels:    map[string]string{"app.kubernetes.io/name": components.ManagerAppLabel},
		AgentNamespaces:  c.Egress.DataClientNamespaces,
		AgentLabels:      agentLabels(c),
		AgentCIDRs:       c.Egress.DataClientCIDRs,
		InitPort:         components.InitPort,
		DataPort:         components.DataPort,
	}
	var policyAfter []pulumi.Resource
	if cil.Release != nil {
		policyAfter = append(policyAfter, cil.Release)
	}
	pols, err := netpolicy.NewSandboxPolicies(ctx, "fusebox", &netpolicy.SandboxPoliciesArgs{
		Flavour: c.NetworkPolicy, Namespace: ns.Sandbox, Network: network, After: policyAfter,
	})
	if err != nil {
		return err
	}

	adm, err := admission.NewSandboxAdmission(ctx, "fusebox", &admission.SandboxAdmissionArgs{
		SandboxNamespace: c.Namespaces.Sandbox,
	})
	if err != nil {
		return err
	}

	// The manager creates sandbox pods as soon as it runs: it waits for every policy that
	// protects them and for the runtime.
	after := append([]pulumi.Resource{adm.Policy, adm.Binding, gv}, pols.Policies...)
	var placement *manager.Placement
	if c.Cloud == components.GKE {
		p := manager.GKESandboxPlacement()
		placement = &p
	}
	mgr, err := manager.NewManager(ctx, "fusebox", &manager.ManagerArgs{
		Namespace:        ns.Manager,
		SandboxNamespace: ns.Sandbox,
		Image:            c.Images.Manager,
		Sandbox: manager.SandboxTemplate{
			Image:     c.Images.Sandbox,
			CPU:       c.Pool.SandboxCPU,
			CPULimit:  c.Pool.SandboxCPULimit,
			Memory:    c.Pool.SandboxMemory,
			Placement: placement,
		},
		NetworkPolicy:        string(c.NetworkPolicy),
		AgentNamespaces:      c.Egress.DataClientNamespaces,
		AgentCIDRs:           c.Egress.DataClientCIDRs,
		AgentLabels:          agentLabels(c),
		Access:               accessRules(c.Access),
		Operators:            c.Operators,
		ImagePullSecrets:     c.ImagePullSecrets,
		Replicas:             c.Manager.Replicas,
		SkipAwait:            c.Manager.SkipAwait,
		RequiredAntiAffinity: c.Manager.RequiredAntiAffinity,
		PoolSize:             c.Pool.Size,
		PoolMax:              c.Pool.Max,
		Estimator:            c.Pool.Estimator,
		ServiceType:          c.Manager.ServiceType,
		CPU:                  c.Manager.CPU,
		Memory:               c.Manager.Memory,
		After:                after,
	})
	if err != nil {
		return err
	}

	ctx.Export("managerEndpoint", mgr.Endpoint)
	ctx.Export("cloud", pulumi.String(string(c.Cloud)))
	ctx.Export("namespaces", pulumi.StringMap{"manager": ns.Manager, "sandbox": ns.Sandbox})
	ctx.Export("runtimeClass", gv.RuntimeClassName)
	ctx.Export("runtimeClassSource", gv.RuntimeClassSource)
	ctx.Export("gvisorNodeInstaller", gv.NodeInstaller)
	ctx.Export("nodePool", kp.NodePoolName)
	ctx.Export("nodeClassKind", kp.NodeClassKind)
	ctx.Export("gkeNodePool", kp.GKENodePool)
	ctx.Export("ciliumInstalled", cil.Installed)
	ctx.Export("networkPolicy", pulumi.String(string(c.NetworkPolicy)))
	ctx.Export("networkPolicies", pols.PolicyNames)
	ctx.Export("admissionPolicy", adm.PolicyName)
	return nil
}

func karpenterArgs(c *Config) (*karpenter.KarpenterArgs, error) {
	n := c.NodePool
	a := &karpenter.KarpenterArgs{
		Cloud:            c.Cloud,
		Name:             orDefault(n.Name, "fusebox-sandbox"),
		CPULimit:         n.CPULimit,
		MemoryLimit:      n.MemoryLimit,
		Requirements:     n.Requirements,
		ConsolidateAfter: n.ConsolidateAfter,
		DisruptionBudget: n.DisruptionBudget,
		ExpireAfter:      n.ExpireAfter,
		GKENodePool:      n.GKENodePool,
	}
	if c.Cloud == components.EKS {
		ud, err := gvisor.EKSUserData(gvisor.UserDataOptions{
			BinaryBaseURL: c.GVisor.baseURL(),
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %s:gvisor.binaryBaseURL: %v", ErrConfig, Namespace, err)
		}
		e := n.EC2
		a.EC2 = &karpenter.EC2Args{
			Role:                      e.Role,
			AMIAlias:                  e.AMIAlias,
			AMIID:                     e.AMIID,
			SubnetSelectorTags:        e.SubnetSelectorTags,
			SecurityGroupSelectorTags: e.SecurityGroupSelectorTags,
			UserData:                  ud,
			VolumeSize:                e.VolumeSize,
			Tags:                      e.Tags,
		}
	}
	if c.Cloud == components.AKS && n.AKS != nil {
		a.AKS = &karpenter.AKSArgs{
			ImageFamily: n.AKS.ImageFamily, OSDiskSizeGB: n.AKS.OSDiskSizeGB,
			VNETSubnetID: n.AKS.VNETSubnetID, Tags: n.AKS.Tags,
		}
	}
	return a, nil
}

// agentLabels are the labels of the agents' pods (default fusebox.dev/agent=true).
func agentLabels(c *Config) map[string]string {
	if len(c.Egress.AgentLabels) > 0 {
		return c.Egress.AgentLabels
	}
	return map[string]string{manager.DefaultAgentLabelKey: manager.DefaultAgentLabelValue}
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// accessRules are the stack's access rules as the manager component takes them.
func accessRules(rules []AccessRule) []manager.AccessRule {
	out := make([]manager.AccessRule, 0, len(rules))
	for _, r := range rules {
		out = append(out, manager.AccessRule{Namespaces: r.Namespaces, ServiceAccounts: r.ServiceAccounts,
			Templates: r.Templates, Egress: r.Egress})
	}
	return out
}
