// Package preflight checks a cluster before `fusebox up` (and the Pulumi program run by
// `pulumi up`) changes anything in it: that it can run what the stack asks for (gVisor, the
// network policy flavour and its FQDN support, a Cilium recent enough for the policies,
// Cilium's socket load balancing kept out of gVisor pods, the DNS setup the policies allow,
// nodes for the sandboxes and for the manager's rollouts) and that what the stack expects to
// exist does (image pull secrets, namespaces made beforehand). Every refusal names the setting
// and what to do. The cluster is read through Cluster, a set of func fields, so the checks are
// unit-tested without one; FromClients builds it from client-go clients.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
)

// ErrNotFound is returned by Cluster's funcs for an object that does not exist.
var ErrNotFound = errors.New("not found")

// ErrRefused is wrapped by Check's error when the cluster cannot take the stack.
var ErrRefused = errors.New("preflight refused the stack")

// Cluster reads the cluster. Each func returns ErrNotFound (wrapped or not) for a missing
// object and another error when the read itself failed.
type Cluster struct {
	// ConfigMap returns the data of ConfigMap namespace/name.
	ConfigMap func(ctx context.Context, namespace, name string) (map[string]string, error)
	// RuntimeClass returns the handler of RuntimeClass name.
	RuntimeClass func(ctx context.Context, name string) (string, error)
	// Served reports whether the API server serves resource in group/version.
	Served func(ctx context.Context, group, version, resource string) (bool, error)
	// Namespace reports whether namespace name exists.
	Namespace func(ctx context.Context, name string) (bool, error)
	// SecretType returns the type of Secret namespace/name.
	SecretType func(ctx context.Context, namespace, name string) (string, error)
	// Nodes returns the nodes matching labelSelector (empty: every node).
	Nodes func(ctx context.Context, labelSelector string) ([]Node, error)
	// DaemonSet returns DaemonSet namespace/name.
	DaemonSet func(ctx context.Context, namespace, name string) (DaemonSet, error)
	// ServerVersion returns the API server's Kubernetes version (its git version,
	// "v1.34.2-eks-..."), which the AMI check (CheckAMI) resolves the node image alias for.
	// Nil skips that check.
	ServerVersion func(ctx context.Context) (string, error)
}

// Stack is what the checks need to know of a stack.
type Stack struct {
	Name    string // for messages: stacks/Pulumi.<Name>.yaml
	Cloud   components.Cloud
	Flavour sandboxnet.Flavour
	// CiliumInstall: the stack installs Cilium itself (with socketLB.hostNamespaceOnly).
	CiliumInstall bool
	// ManagerNamespace and SandboxNamespace, and whether the stack creates them.
	ManagerNamespace, SandboxNamespace string
	CreateNamespaces                   bool
	// ImagePullSecrets must exist in the manager and sandbox namespaces, and in
	// InstallerNamespace when it is set (the gVisor node installer's).
	ImagePullSecrets   []string
	InstallerNamespace string
	// Manager is the manager Deployment's shape, for the rollout check (zero Replicas: not
	// checked).
	Manager Rollout
	// ClusterDNS is the DNS setup the sandboxes' DNS rules are rendered for (empty:
	// kube-dns).
	ClusterDNS sandboxnet.ClusterDNS
}

// Cilium's agent configuration (the cilium-config ConfigMap the chart writes).
const (
	CiliumConfigNamespace = "kube-system"
	CiliumConfigName      = "cilium-config"
)

// Check runs every check and returns all refusals at once, joined and wrapping ErrRefused; a
// failed read is returned as it is.
func Check(ctx context.Context, s Stack, c Cluster) error {
	var problems []string
	for _, check := range []func(context.Context, Stack, Cluster) ([]string, error){
		gvisorProblems, flavourProblems, namespaceProblems,
		sandboxNodeProblems, rolloutProblems, ciliumVersionProblems, dnsProblems,
	} {
		p, err := check(ctx, s, c)
		if err != nil {
			return err
		}
		problems = append(problems, p...)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w (nothing was changed):\n  - %s", ErrRefused, strings.Join(problems, "\n  - "))
	}
	return nil
}

// file names the stack's file in messages.
func (s Stack) file() string { return "stacks/Pulumi." + s.Name + ".yaml" }

// gvisorProblems: GKE brings gVisor with GKE Sandbox, whose RuntimeClass must be there;
// elsewhere the stack creates the RuntimeClass.
func gvisorProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	if s.Cloud != components.GKE {
		return nil, nil
	}
	h, err := c.RuntimeClass(ctx, components.RuntimeClassName)
	switch {
	case errors.Is(err, ErrNotFound):
		return []string{fmt.Sprintf("the cluster lacks gVisor: RuntimeClass %q not found. Enable GKE Sandbox: add a node pool with `gcloud container node-pools create fusebox-sandbox --cluster CLUSTER --sandbox type=gvisor` (fusebox:cloud gke in %s)", components.RuntimeClassName, s.file())}, nil
	case err != nil:
		return nil, fmt.Errorf("reading RuntimeClass %s: %w", components.RuntimeClassName, err)
	case h != "gvisor":
		return []string{fmt.Sprintf("RuntimeClass %q has handler %q, not GKE Sandbox's \"gvisor\": it is not GKE Sandbox's; remove it and enable GKE Sandbox", components.RuntimeClassName, h)}, nil
	}
	return nil, nil
}

// flavourProblems: the network policy flavour's kinds are served and, on a Cilium the
// stack does not install, its configuration suits FQDN policies and gVisor.
func flavourProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	switch s.Flavour {
	case sandboxnet.GKE:
		ok, err := c.Served(ctx, "networking.gke.io", "v1alpha1", "fqdnnetworkpolicies")
		if err != nil {
			return nil, fmt.Errorf("discovering FQDNNetworkPolicy: %w", err)
		}
		if !ok {
			return []string{fmt.Sprintf("the cluster lacks FQDN support: FQDNNetworkPolicy (networking.gke.io/v1alpha1) is not served. Enable it with `gcloud container clusters update CLUSTER --enable-fqdn-network-policy` (GKE Dataplane V2) (fusebox:networkPolicy gke in %s)", s.file())}, nil
		}
	case sandboxnet.Cilium:
		if s.CiliumInstall {
			return nil, nil // the stack installs Cilium with the values gVisor needs
		}
		return existingCiliumProblems(ctx, s, c)
	}
	return nil, nil
}

// existingCiliumProblems: the cluster's own Cilium serves CiliumNetworkPolicy and its
// configuration is readable and fit (ciliumProblems).
func existingCiliumProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	ok, err := c.Served(ctx, "cilium.io", "v2", "ciliumnetworkpolicies")
	if err != nil {
		return nil, fmt.Errorf("discovering CiliumNetworkPolicy: %w", err)
	}
	if !ok {
		return []string{fmt.Sprintf("the cluster runs no Cilium: CiliumNetworkPolicy (cilium.io/v2) is not served. Set fusebox:cilium.install: true, or fusebox:networkPolicy: kubernetes (egress allowlists of IP addresses only) in %s", s.file())}, nil
	}
	cfg, err := c.ConfigMap(ctx, CiliumConfigNamespace, CiliumConfigName)
	if errors.Is(err, ErrNotFound) {
		return []string{fmt.Sprintf("Cilium's configuration %s/%s not found: cannot check its FQDN support and socketLB.hostNamespaceOnly", CiliumConfigNamespace, CiliumConfigName)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s/%s: %w", CiliumConfigNamespace, CiliumConfigName, err)
	}
	return ciliumProblems(s, cfg), nil
}

// namespaceProblems: namespaces made beforehand exist, and the image pull secrets are in
// every namespace that pulls with them.
func namespaceProblems(ctx context.Context, s Stack, c Cluster) ([]string, error) {
	var problems []string
	namespaces := []string{s.ManagerNamespace, s.SandboxNamespace}
	if s.InstallerNamespace != "" && len(s.ImagePullSecrets) > 0 {
		namespaces = append(namespaces, s.InstallerNamespace)
	}
	for i, ns := range namespaces {
		ours := i < 2 && s.CreateNamespaces
		if ours && len(s.ImagePullSecrets) == 0 {
			continue
		}
		exists, err := c.Namespace(ctx, ns)
		if err != nil {
			return nil, fmt.Errorf("reading namespace %s: %w", ns, err)
		}
		switch {
		case !exists && ours:
			problems = append(problems, fmt.Sprintf("fusebox:imagePullSecrets %v must exist in namespace %s, which does not exist yet: create the namespaces %s and %s and the Secrets in both, then set fusebox:namespaces.create: false in %s", s.ImagePullSecrets, ns, s.ManagerNamespace, s.SandboxNamespace, s.file()))
			continue
		case !exists:
			problems = append(problems, fmt.Sprintf("namespace %s does not exist (fusebox:namespaces.create is false in %s: create it first)", ns, s.file()))
			continue
		}
		p, err := pullSecretProblems(ctx, s, c, ns)
		if err != nil {
			return nil, err
		}
		problems = append(problems, p...)
	}
	return problems, nil
}

// pullSecretProblems: each image pull secret exists in ns and is a registry credential.
func pullSecretProblems(ctx context.Context, s Stack, c Cluster, ns string) ([]string, error) {
	var problems []string
	for _, name := range s.ImagePullSecrets {
		typ, err := c.SecretType(ctx, ns, name)
		switch {
		case errors.Is(err, ErrNotFound):
			problems = append(problems, fmt.Sprintf("fusebox:imagePullSecrets: Secret %s/%s does not exist: create it with `kubectl -n %s create secret docker-registry %s --docker-server=REGISTRY --docker-username=USER --docker-password=...`", ns, name, ns, name))
		case err != nil:
			return nil, fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
		case typ != "kubernetes.io/dockerconfigjson" && typ != "kubernetes.io/dockercfg":
			problems = append(problems, fmt.Sprintf("fusebox:imagePullSecrets: Secret %s/%s has type %s, want kubernetes.io/dockerconfigjson (kubectl create secret docker-registry)", ns, name, typ))
		}
	}
	return problems, nil
}

// ciliumProblems checks an existing Cilium's configuration: FQDN policies (toFQDNs) need its
// DNS proxy, which AWS-CNI chaining mode does not support and which AKS runs only with
// Advanced Container Networking Services; gVisor pods need socket load balancing kept in the
// host namespace (socketLB.hostNamespaceOnly, cilium-config bpf-lb-sock-hostns-only).
func ciliumProblems(s Stack, cfg map[string]string) []string {
	var out []string
	if mode := cfg["cni-chaining-mode"]; mode == "aws-cni" {
		out = append(out, "Cilium runs in AWS-CNI chaining mode (cilium-config cni-chaining-mode=aws-cni), where toFQDNs is unsupported: run Cilium in ENI mode (eni.enabled=true), or set fusebox:networkPolicy: kubernetes (egress allowlists of IP addresses only)")
	}
	if cfg["enable-l7-proxy"] == "false" {
		hint := "enable it (helm upgrade cilium --reuse-values --set l7Proxy=true)"
		if s.Cloud == components.AKS {
			hint = "on AKS, enable Advanced Container Networking Services (`az aks update --resource-group RG --name CLUSTER --enable-acns`), which brings FQDN filtering"
		}
		out = append(out, "Cilium's DNS proxy is off (cilium-config enable-l7-proxy=false), so toFQDNs allows nothing: "+hint)
	}
	socketLB := cfg["bpf-lb-sock"] == "true" || cfg["kube-proxy-replacement"] == "true" || cfg["kube-proxy-replacement"] == "strict"
	if socketLB && cfg["bpf-lb-sock-hostns-only"] != "true" {
		out = append(out, "Cilium's socket load balancing reaches into pods (socketLB.hostNamespaceOnly is not true: cilium-config bpf-lb-sock-hostns-only="+fmt.Sprintf("%q", cfg["bpf-lb-sock-hostns-only"])+"): gVisor pods have their own network stack, so their service traffic would bypass it. Set it: helm upgrade cilium --reuse-values --set socketLB.hostNamespaceOnly=true")
	}
	return out
}
