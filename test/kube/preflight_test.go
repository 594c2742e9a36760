package kube

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/infra/preflight"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
)

// TestPreflightAgainstAPIServer runs fusebox up's preflight (preflight.FromClients) against a
// real API server: what it reads through discovery, RuntimeClasses, ConfigMaps, Namespaces and
// Secrets, and each refusal naming the setting. The control plane has the Cilium CRDs, a
// RuntimeClass gvisor with handler runsc (not GKE Sandbox's), and no FQDNNetworkPolicy.
func TestPreflightAgainstAPIServer(t *testing.T) {
	ctx := context.Background()
	cl := preflight.FromClients(env.Client)
	mgr, sbx := env.Namespace(t), env.Namespace(t)
	stack := func(cloud components.Cloud, f sandboxnet.Flavour, secrets ...string) preflight.Stack {
		return preflight.Stack{Name: "test", Cloud: cloud, Flavour: f, ManagerNamespace: mgr, SandboxNamespace: sbx,
			CreateNamespaces: false, ImagePullSecrets: secrets}
	}
	check := func(t *testing.T, s preflight.Stack, want ...string) {
		t.Helper()
		err := preflight.Check(ctx, s, cl)
		if len(want) == 0 {
			if err != nil {
				t.Fatalf("preflight refused a cluster that can take the stack: %v", err)
			}
			return
		}
		if !errors.Is(err, preflight.ErrRefused) {
			t.Fatalf("preflight = %v, want a refusal naming %q", err, want)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal does not name %q:\n%v", w, err)
			}
		}
	}

	// The kwok node carries fusebox.dev/pool=sandbox (kubetest.NodeName), as local needs.
	t.Run("plain NetworkPolicy, namespaces exist", func(t *testing.T) {
		check(t, stack(components.Local, sandboxnet.Kubernetes))
	})
	// The kwok node is tainted like the sandbox pool: the manager cannot run there.
	t.Run("manager rollout without a node", func(t *testing.T) {
		s := stack(components.Local, sandboxnet.Kubernetes)
		s.Manager = preflight.Rollout{Replicas: 2, MaxSurge: 1}
		check(t, s, "the manager needs a node it can run on", "the cluster has 0 (none)")
	})
	t.Run("gke: not GKE Sandbox's RuntimeClass, no FQDNNetworkPolicy", func(t *testing.T) {
		check(t, stack(components.GKE, sandboxnet.GKE), `handler "runsc"`, "FQDNNetworkPolicy (networking.gke.io/v1alpha1) is not served", "--enable-fqdn-network-policy")
	})
	t.Run("missing namespace", func(t *testing.T) {
		s := stack(components.Local, sandboxnet.Kubernetes)
		s.SandboxNamespace = "pf-never-created"
		check(t, s, "namespace pf-never-created does not exist", "fusebox:namespaces.create")
	})

	// Cilium: CiliumNetworkPolicy is served (the CRD); its configuration is read from
	// kube-system/cilium-config.
	t.Run("cilium without its configuration", func(t *testing.T) {
		check(t, stack(components.EKS, sandboxnet.Cilium), "kube-system/cilium-config not found")
	})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: preflight.CiliumConfigName, Namespace: preflight.CiliumConfigNamespace},
		Data: map[string]string{"cni-chaining-mode": "aws-cni", "kube-proxy-replacement": "true", "bpf-lb-sock-hostns-only": "false"}}
	if _, err := env.Client.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.Client.CoreV1().ConfigMaps(cm.Namespace).Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
	})
	t.Run("cilium in AWS-CNI chaining, socket LB into pods", func(t *testing.T) {
		check(t, stack(components.EKS, sandboxnet.Cilium), "cni-chaining-mode=aws-cni", "socketLB.hostNamespaceOnly")
	})
	cm.Data = map[string]string{"kube-proxy-replacement": "true", "bpf-lb-sock-hostns-only": "true"}
	if _, err := env.Client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Cilium's version is its agent DaemonSet's image tag.
	t.Run("cilium without its agent", func(t *testing.T) {
		check(t, stack(components.EKS, sandboxnet.Cilium), "DaemonSet kube-system/cilium not found")
	})
	agent := daemonSet(preflight.CiliumAgentNamespace, preflight.CiliumAgentName, true, nil, "quay.io/cilium/cilium:v1.15.19")
	agent, err := env.Client.AppsV1().DaemonSets(agent.Namespace).Create(ctx, agent, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.Client.AppsV1().DaemonSets(agent.Namespace).Delete(context.Background(), agent.Name, metav1.DeleteOptions{})
	})
	t.Run("cilium before enableDefaultDeny", func(t *testing.T) {
		check(t, stack(components.EKS, sandboxnet.Cilium), "Cilium 1.15.19 is too old", "1.16.0 or later")
	})
	agent.Spec.Template.Spec.Containers[0].Image = "quay.io/cilium/cilium:v1.16.5"
	if _, err := env.Client.AppsV1().DaemonSets(agent.Namespace).Update(ctx, agent, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("cilium in ENI mode, socket LB in the host namespace", func(t *testing.T) {
		check(t, stack(components.EKS, sandboxnet.Cilium))
	})

	// NodeLocal DNSCache is a DaemonSet: with it, the sandboxes' DNS rules must be rendered for
	// it (fusebox:clusterDNS: nodelocaldns).
	cache := daemonSet(preflight.NodeLocalDNSNamespace, preflight.NodeLocalDNSName, true, []string{"-localip", "169.254.20.10,10.96.0.10"}, "registry.k8s.io/dns/k8s-dns-node-cache:1.23.1")
	if _, err := env.Client.AppsV1().DaemonSets(cache.Namespace).Create(ctx, cache, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("node-local DNS cache, kube-dns set", func(t *testing.T) {
		check(t, stack(components.EKS, sandboxnet.Cilium), "runs NodeLocal DNSCache", "fusebox:clusterDNS: nodelocaldns")
	})
	t.Run("node-local DNS cache in the host network, under Cilium", func(t *testing.T) {
		s := stack(components.EKS, sandboxnet.Cilium)
		s.ClusterDNS = sandboxnet.NodeLocalDNS
		check(t, s, "runs in the host network", "Local Redirect Policy")
	})
	if err := env.Client.AppsV1().DaemonSets(cache.Namespace).Delete(ctx, cache.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Image pull secrets: each must exist, as a docker config, in both namespaces.
	t.Run("registry secret that does not exist", func(t *testing.T) {
		check(t, stack(components.Local, sandboxnet.Kubernetes, "regcred"), "Secret "+mgr+"/regcred does not exist", "Secret "+sbx+"/regcred does not exist", "fusebox:imagePullSecrets")
	})
	for _, ns := range []string{mgr, sbx} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}
		if ns == sbx {
			s.Type, s.Data = corev1.SecretTypeOpaque, map[string][]byte{"x": []byte("y")}
		}
		if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("registry secret of the wrong type", func(t *testing.T) {
		check(t, stack(components.Local, sandboxnet.Kubernetes, "regcred"), "Secret "+sbx+"/regcred has type Opaque")
	})
	if err := env.Client.CoreV1().Secrets(sbx).Delete(ctx, "regcred", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: sbx}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}
	if _, err := env.Client.CoreV1().Secrets(sbx).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("registry secrets in both namespaces", func(t *testing.T) {
		check(t, stack(components.Local, sandboxnet.Kubernetes, "regcred"))
	})
}

// daemonSet is DaemonSet namespace/name running image with args.
func daemonSet(namespace, name string, hostNetwork bool, args []string, image string) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{HostNetwork: hostNetwork, Containers: []corev1.Container{{Name: "c", Image: image, Args: args}}},
			},
		},
	}
}
