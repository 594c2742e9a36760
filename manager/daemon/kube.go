package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/manager/leader"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
)

// sandboxTemplate reads --sandbox-template, or makes the default template for
// --sandbox-image. Both given must name the same image.
func sandboxTemplate(k KubeConfig) (kubealloc.Template, error) {
	if k.SandboxTemplate == "" {
		return kubealloc.DefaultTemplate(k.SandboxImage), nil
	}
	data, err := os.ReadFile(k.SandboxTemplate)
	if err != nil {
		return kubealloc.Template{}, fmt.Errorf("reading the sandbox template: %w", err)
	}
	t, err := kubealloc.ParseTemplate(data)
	if err != nil {
		return kubealloc.Template{}, fmt.Errorf("%s: %w", k.SandboxTemplate, err)
	}
	if k.SandboxImage != "" && t.Image != k.SandboxImage {
		return kubealloc.Template{}, fmt.Errorf("%s: image %s differs from --sandbox-image %s", k.SandboxTemplate, t.Image, k.SandboxImage)
	}
	return t, nil
}

// startKube checks the cluster (the sandbox namespace must already deny by default), starts
// the informer-fed allocator, with Deployment watches for the installation's removal and,
// with LeaderElect, joins the election for the pool duties.
func startKube(ctx context.Context, k KubeConfig, specs []templates.Spec, log *slog.Logger) (allocator, error) {
	var out allocator
	var typed kubernetes.Interface
	if k.Deployment != "" {
		// First: a manager of a removed installation starts nothing.
		var err error
		if typed, err = kubeClient(k); err != nil {
			return allocator{}, err
		}
		if out.removing, err = kubealloc.WatchRemoval(ctx, typed, k.ManagerNamespace, k.Deployment); err != nil {
			return allocator{}, fmt.Errorf("refusing to start: %w", err)
		}
	}
	a, leader, err := startKubeAllocator(ctx, k, specs, log)
	if err != nil {
		return allocator{}, err
	}
	out.Allocator, out.isLeader, out.shutdown = a, leader, a.Shutdown
	out.remove = func(ctx context.Context, log *slog.Logger) error {
		log.Info("the manager's Deployment is being deleted: removing every sandbox", "deployment", k.ManagerNamespace+"/"+k.Deployment)
		if err := a.RemoveSandboxes(ctx); err != nil {
			return fmt.Errorf("removing the sandboxes: %w", err)
		}
		if err := kubealloc.ReleaseRemoval(ctx, typed, k.ManagerNamespace, k.Deployment); err != nil {
			return err
		}
		return errRemoved
	}
	return out, nil
}

// startKubeAllocator is startKube but the removal watch.
func startKubeAllocator(ctx context.Context, k KubeConfig, specs []templates.Spec, log *slog.Logger) (*kubealloc.Allocator, func() bool, error) {
	if k.SandboxNamespace == "" || k.Identity == "" || (k.SandboxImage == "" && k.SandboxTemplate == "") {
		return nil, nil, errors.New("--allocator kube needs --sandbox-namespace, --identity (or $POD_NAME) and --sandbox-image or --sandbox-template")
	}
	tmpl, err := sandboxTemplate(k)
	if err != nil {
		return nil, nil, err
	}
	// Each template's pods run its image with the server from the default's.
	tmpls := map[string]kubealloc.Template{manager.DefaultTemplate: tmpl}
	for _, spec := range specs {
		if tmpls[spec.Name], err = kubealloc.FromSpec(spec, tmpl); err != nil {
			return nil, nil, err
		}
	}
	if len(k.ManagerSelector) == 0 {
		return nil, nil, errors.New("--allocator kube needs --manager-selector (the manager's pods: the only ones that may reach the init port)")
	}
	if len(k.AgentNamespaces) == 0 && len(k.AgentCIDRs) == 0 {
		return nil, nil, errors.New("--allocator kube needs --agent-namespaces (or --agent-cidrs): where the agents that may reach a bound sandbox's data port run")
	}
	flavour := sandboxnet.Cilium
	if k.NetworkPolicy != "" {
		if flavour, err = sandboxnet.ParseFlavour(k.NetworkPolicy); err != nil {
			return nil, nil, fmt.Errorf("--network-policy: %w", err)
		}
	}
	dns, err := sandboxnet.ParseClusterDNS(k.ClusterDNS)
	if err == nil {
		err = sandboxnet.CheckClusterDNS(flavour, dns)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--cluster-dns: %w", err)
	}
	managerNS := k.ManagerNamespace
	if managerNS == "" {
		return nil, nil, errors.New("--allocator kube needs --manager-namespace (the manager's pods are admitted to the init port in it)")
	}
	var cfg *rest.Config
	if k.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	typedCfg, dynCfg := kubealloc.ClientConfigs(cfg, k.QPS, k.Burst)
	cs, err := kubernetes.NewForConfig(typedCfg)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(dynCfg)
	if err != nil {
		return nil, nil, err
	}
	if err := kubealloc.CheckDefaultDeny(ctx, dyn, k.SandboxNamespace, flavour); err != nil {
		return nil, nil, fmt.Errorf("refusing to start: %w", err)
	}
	a, err := kubealloc.New(kubealloc.Options{Client: cs, Dynamic: dyn, Namespace: k.SandboxNamespace, Identity: k.Identity,
		Templates: tmpls,
		Flavour:   flavour, ImagePullSecrets: k.ImagePullSecrets,
		Selectors: kubealloc.PolicySelectors{Agents: k.AgentSelector, AgentNamespaces: k.AgentNamespaces, AgentCIDRs: k.AgentCIDRs,
			Manager: k.ManagerSelector, ManagerNamespace: managerNS, ClusterDNS: dns}, NodeName: k.NodeName,
		Logger: log})
	if err != nil {
		return nil, nil, err
	}
	if err := a.Start(ctx); err != nil {
		return nil, nil, err
	}
	if !k.LeaderElect {
		return a, nil, nil
	}
	ns := k.ManagerNamespace
	if ns == "" {
		ns = k.SandboxNamespace
	}
	var owner *metav1.OwnerReference // the Lease goes with the Deployment, in its namespace
	if ns == k.ManagerNamespace {
		if owner, err = deploymentOwner(ctx, cs, k); err != nil {
			a.Shutdown()
			return nil, nil, err
		}
	}
	e, err := leader.Start(ctx, leader.Options{Client: cs, Namespace: ns, Name: "fusebox-manager", Identity: k.Identity,
		Owner: owner, Logger: log})
	if err != nil {
		a.Shutdown()
		return nil, nil, err
	}
	return a, e.IsLeader, nil
}
