package preflight

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest/golden"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCheckGolden: Check's whole answer, with several refusals at once and in their order,
// is what testdata/check.json holds.
func TestCheckGolden(t *testing.T) {
	withSecrets := func(s Stack, create bool) Stack {
		s.ImagePullSecrets, s.CreateNamespaces, s.InstallerNamespace = []string{"regcred", "other"}, create, "kube-system"
		return s
	}
	runc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}
	cases := map[string]struct {
		stack   Stack
		cluster Cluster
	}{
		"gke, everything wrong": {withSecrets(stack(components.GKE, sandboxnet.GKE), false), cluster(nil, runc, ns("fusebox-system"), ns("kube-system"),
			secret("fusebox-system", "regcred", corev1.SecretTypeOpaque), secret("kube-system", "other", corev1.SecretTypeDockercfg))},
		"gke, no runtime class": {stack(components.GKE, sandboxnet.GKE), cluster(gkeAPI)},
		"aks, bad cilium, secrets": {withSecrets(stack(components.AKS, sandboxnet.Cilium), false), cluster(ciliumAPI,
			ciliumConfig(map[string]string{"cni-chaining-mode": "aws-cni", "enable-l7-proxy": "false", "bpf-lb-sock": "true"}),
			ns("fusebox-system"), ns("fusebox-sandboxes"))},
		"eks, strict kube-proxy replacement": {stack(components.EKS, sandboxnet.Cilium), cluster(ciliumAPI,
			ciliumConfig(map[string]string{"kube-proxy-replacement": "strict", "bpf-lb-sock-hostns-only": "false"}))},
		"eks, no cilium config":   {stack(components.EKS, sandboxnet.Cilium), cluster(ciliumAPI)},
		"eks, no cilium":          {withSecrets(stack(components.EKS, sandboxnet.Cilium), true), cluster(nil)},
		"local, created, secrets": {withSecrets(stack(components.Local, sandboxnet.Kubernetes), true), cluster(nil, ns("fusebox-system"))},
		"local, existing, none there": {func() Stack {
			s := stack(components.Local, sandboxnet.Kubernetes)
			s.CreateNamespaces = false
			return s
		}(), cluster(nil)},
		"eks, installed cilium, secrets": {func() Stack {
			s := withSecrets(stack(components.EKS, sandboxnet.Cilium), false)
			s.CiliumInstall = true
			return s
		}(), cluster(nil, ns("fusebox-system"), ns("fusebox-sandboxes"), ns("kube-system"))},
		"eks, good": {stack(components.EKS, sandboxnet.Cilium), cluster(ciliumAPI, ciliumConfig(goodCilium), ciliumAgent("v1.16.5"))},
	}
	out := map[string]string{}
	for name, tc := range cases {
		if err := Check(context.Background(), tc.stack, tc.cluster); err != nil {
			out[name] = err.Error()
		} else {
			out[name] = "<nil>"
		}
	}
	golden.JSON(t, filepath.Join("testdata", "check.json"), out)
}
