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

// Program installs fusebox as the stack's configuration says, after preflight has checked
// the cluster of the Kubernetes provider's kubeconfig (NewProgram with KubeconfigCluster),
// and exports: managerEndpoint, cloud, namespaces, runtimeClass, runtimeClassSource,
// gvisorNodeInstaller, nodePool, nodeClassKind, gkeNodePool, ciliumInstalled, networkPolicy,
// networkPolicies, admissionPolicy.
func Program(ctx *pulumi.Context) error {
	return NewProgram(KubeconfigCluster)(ctx)
}

// Install composes the components for a loaded configuration: the namespaces, gVisor, the
// sandbox node pool, Cilium, the sandbox namespace's network and admission policies, and the
// manager, which waits for every policy that protects the sandboxes and for the runtime.
func Install(ctx *pulumi.Context, c *Config) error {
	ns, err := manager.NewNamespaces(ctx, "fusebox", &manager.NamespacesArgs{
		Manager: c.Namespaces.Manager, Sandbox: c.Namespaces.Sandbox, Existing: !c.Namespaces.CreateNamespaces(),
	})
	if err != nil {
		return err
	}
	gv, err := gvisor.NewGVisor(ctx, "fusebox", gvisorArgs(c))
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
	pols, err := netpolicy.NewSandboxPolicies(ctx, "fusebox", policiesArgs(c, ns, cil))
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
	mgr, err := manager.NewManager(ctx, "fusebox", managerArgs(c, ns, after))
	if err != nil {
		return err
	}
	export(ctx, c, installed{ns: ns, gv: gv, kp: kp, cil: cil, pols: pols, adm: adm, mgr: mgr})
	return nil
}

// gvisorArgs: the RuntimeClass schedules onto Karpenter's sandbox pool where there is one;
// the node installer installs runsc on AKS and, on EKS, where the userData installs it, only
// checks it and removes the startup taint.
func gvisorArgs(c *Config) *gvisor.GVisorArgs {
	a := &gvisor.GVisorArgs{Cloud: c.Cloud, ScheduleOnSandboxNodes: c.Cloud == components.EKS || c.Cloud == components.AKS}
	switch c.Cloud {
	case components.AKS:
		a.NodeInstaller = &gvisor.NodeInstallerArgs{Image: c.GVisor.InstallerImage, ImagePullSecrets: c.ImagePullSecrets}
	case components.EKS:
		a.NodeInstaller = &gvisor.NodeInstallerArgs{
			Image: c.GVisor.InstallerImage, VerifyOnly: true, ImagePullSecrets: c.ImagePullSecrets,
		}
	}
	return a
}

// policiesArgs are the sandbox namespace's policies in the stack's flavour, after Cilium
// when the stack installs it (its CRDs).
func policiesArgs(c *Config, ns *manager.Namespaces, cil *cilium.Cilium) *netpolicy.SandboxPoliciesArgs {
	var after []pulumi.Resource
	if cil.Release != nil {
		after = append(after, cil.Release)
	}
	return &netpolicy.SandboxPoliciesArgs{
		Flavour: c.NetworkPolicy, Namespace: ns.Sandbox, Network: sandboxNetwork(c), After: after,
	}
}

// sandboxNetwork is who reaches the sandboxes: the manager their init port, the agents
// their data port.
func sandboxNetwork(c *Config) sandboxnet.Network {
	return sandboxnet.Network{
		SandboxNamespace: c.Namespaces.Sandbox,
		ManagerNamespace: c.Namespaces.Manager,
		ManagerLabels:    map[string]string{"app.kubernetes.io/name": components.ManagerAppLabel},
		AgentNamespaces:  c.Egress.DataClientNamespaces,
		AgentLabels:      agentLabels(c),
		AgentCIDRs:       c.Egress.DataClientCIDRs,
		InitPort:         components.InitPort,
		DataPort:         components.DataPort,
		DNS:              c.ClusterDNS,
	}
}

// sandboxTemplate is the default template's pods: the sandbox image, the pool's per-sandbox
// resources, placement.
func (c *Config) sandboxTemplate(placement *manager.Placement) manager.SandboxTemplate {
	return manager.SandboxTemplate{
		Image:     c.Images.Sandbox,
		CPU:       c.Pool.SandboxCPU,
		CPULimit:  c.Pool.SandboxCPULimit,
		Memory:    c.Pool.SandboxMemory,
		Placement: placement,
	}
}

// managerArgs are the manager's, waiting for after; on GKE its sandboxes go to GKE
// Sandbox's nodes.
func managerArgs(c *Config, ns *manager.Namespaces, after []pulumi.Resource) *manager.ManagerArgs {
	var placement *manager.Placement
	if c.Cloud == components.GKE {
		p := manager.GKESandboxPlacement()
		placement = &p
	}
	return &manager.ManagerArgs{
		Namespace:            ns.Manager,
		SandboxNamespace:     ns.Sandbox,
		Image:                c.Images.Manager,
		Sandbox:              c.sandboxTemplate(placement),
		NetworkPolicy:        string(c.NetworkPolicy),
		ClusterDNS:           managerClusterDNS(c),
		AgentNamespaces:      c.Egress.DataClientNamespaces,
		AgentCIDRs:           c.Egress.DataClientCIDRs,
		AgentLabels:          agentLabels(c),
		Access:               accessRules(c.Access),
		Operators:            c.Operators,
		Templates:            c.Templates,
		ImagePullSecrets:     c.ImagePullSecrets,
		Replicas:             c.Manager.Replicas,
		SkipAwait:            c.Manager.SkipAwait,
		RequiredAntiAffinity: c.Manager.RequiredAntiAffinity,
		PoolSize:             c.Pool.Size,
		PoolMax:              c.Pool.Max,
		Estimator:            c.Pool.Estimator,
		ServiceType:          c.Manager.ServiceType,
		TLSSecret:            c.Manager.TLSSecret,
		TokenAudience:        c.Manager.TokenAudience,
		ExternalNames:        c.Manager.ExternalNames,
		CPU:                  c.Manager.CPU,
		Memory:               c.Manager.Memory,
		After:                after,
	}
}

// installed are the components Install composed.
type installed struct {
	ns   *manager.Namespaces
	gv   *gvisor.GVisor
	kp   *karpenter.Karpenter
	cil  *cilium.Cilium
	pols *netpolicy.SandboxPolicies
	adm  *admission.SandboxAdmission
	mgr  *manager.Manager
}

// export exports the stack's outputs (see Program).
func export(ctx *pulumi.Context, c *Config, i installed) {
	ctx.Export("managerEndpoint", i.mgr.Endpoint)
	ctx.Export("cloud", pulumi.String(string(c.Cloud)))
	ctx.Export("namespaces", pulumi.StringMap{"manager": i.ns.Manager, "sandbox": i.ns.Sandbox})
	ctx.Export("runtimeClass", i.gv.RuntimeClassName)
	ctx.Export("runtimeClassSource", i.gv.RuntimeClassSource)
	ctx.Export("gvisorNodeInstaller", i.gv.NodeInstaller)
	ctx.Export("nodePool", i.kp.NodePoolName)
	ctx.Export("nodeClassKind", i.kp.NodeClassKind)
	ctx.Export("gkeNodePool", i.kp.GKENodePool)
	ctx.Export("ciliumInstalled", i.cil.Installed)
	ctx.Export("networkPolicy", pulumi.String(string(c.NetworkPolicy)))
	ctx.Export("networkPolicies", i.pols.PolicyNames)
	ctx.Export("admissionPolicy", i.adm.PolicyName)
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
		DriftBudget:      n.DriftBudget,
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

// managerClusterDNS is the manager's --cluster-dns: empty for kube-dns, its default.
func managerClusterDNS(c *Config) string {
	if c.ClusterDNS == sandboxnet.KubeDNS {
		return ""
	}
	return string(c.ClusterDNS)
}
