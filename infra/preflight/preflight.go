// Package preflight checks a cluster before `fusebox up` changes anything in it: that it can
// run what the stack asks for (gVisor, the network policy flavour and its FQDN support,
// Cilium's socket load balancing kept out of gVisor pods) and that what the stack expects to
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
	refuse := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	file := "stacks/Pulumi." + s.Name + ".yaml"

	// gVisor: GKE brings it with GKE Sandbox; elsewhere the stack creates the RuntimeClass.
	if s.Cloud == components.GKE {
		h, err := c.RuntimeClass(ctx, components.RuntimeClassName)
		switch {
		case errors.Is(err, ErrNotFound):
			refuse("the cluster lacks gVisor: RuntimeClass %q not found. Enable GKE Sandbox: add a node pool with `gcloud container node-pools create fusebox-sandbox --cluster CLUSTER --sandbox type=gvisor` (fusebox:cloud gke in %s)", components.RuntimeClassName, file)
		case err != nil:
			return fmt.Errorf("reading RuntimeClass %s: %w", components.RuntimeClassName, err)
		case h != "gvisor":
			refuse("RuntimeClass %q has handler %q, not GKE Sandbox's \"gvisor\": it is not GKE Sandbox's; remove it and enable GKE Sandbox", components.RuntimeClassName, h)
		}
	}

	switch s.Flavour {
	case sandboxnet.GKE:
		ok, err := c.Served(ctx, "networking.gke.io", "v1alpha1", "fqdnnetworkpolicies")
		if err != nil {
			return fmt.Errorf("discovering FQDNNetworkPolicy: %w", err)
		}
		if !ok {
			refuse("the cluster lacks FQDN support: FQDNNetworkPolicy (networking.gke.io/v1alpha1) is not served. Enable it with `gcloud container clusters update CLUSTER --enable-fqdn-network-policy` (GKE Dataplane V2) (fusebox:networkPolicy gke in %s)", file)
		}
	case sandboxnet.Cilium:
		if s.CiliumInstall {
			break // the stack installs Cilium with the values gVisor needs
		}
		ok, err := c.Served(ctx, "cilium.io", "v2", "ciliumnetworkpolicies")
		if err != nil {
			return fmt.Errorf("discovering CiliumNetworkPolicy: %w", err)
		}
		if !ok {
			refuse("the cluster runs no Cilium: CiliumNetworkPolicy (cilium.io/v2) is not served. Set fusebox:cilium.install: true, or fusebox:networkPolicy: kubernetes (egress allowlists of IP addresses only) in %s", file)
			break
		}
		cfg, err := c.ConfigMap(ctx, CiliumConfigNamespace, CiliumConfigName)
		if errors.Is(err, ErrNotFound) {
			refuse("Cilium's configuration %s/%s not found: cannot check its FQDN support and socketLB.hostNamespaceOnly", CiliumConfigNamespace, CiliumConfigName)
			break
		}
		if err != nil {
			return fmt.Errorf("reading %s/%s: %w", CiliumConfigNamespace, CiliumConfigName, err)
		}
		problems = append(problems, ciliumProblems(s, cfg)...)
	}

	// Namespaces made beforehand, and the image pull secrets in them.
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
			return fmt.Errorf("reading namespace %s: %w", ns, err)
		}
		switch {
		case !exists && ours:
			refuse("fusebox:imagePullSecrets %v must exist in namespace %s, which does not exist yet: create the namespaces %s and %s and the Secrets in both, then set fusebox:namespaces.create: false in %s", s.ImagePullSecrets, ns, s.ManagerNamespace, s.SandboxNamespace, file)
			continue
		case !exists:
			refuse("namespace %s does not exist (fusebox:namespaces.create is false in %s: create it first)", ns, file)
			continue
		}
		for _, name := range s.ImagePullSecrets {
			typ, err := c.SecretType(ctx, ns, name)
			switch {
			case errors.Is(err, ErrNotFound):
				refuse("fusebox:imagePullSecrets: Secret %s/%s does not exist: create it with `kubectl -n %s create secret docker-registry %s --docker-server=REGISTRY --docker-username=USER --docker-password=...`", ns, name, ns, name)
			case err != nil:
				return fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
			case typ != "kubernetes.io/dockerconfigjson" && typ != "kubernetes.io/dockercfg":
				refuse("fusebox:imagePullSecrets: Secret %s/%s has type %s, want kubernetes.io/dockerconfigjson (kubectl create secret docker-registry)", ns, name, typ)
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w (nothing was changed):\n  - %s", ErrRefused, strings.Join(problems, "\n  - "))
	}
	return nil
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
