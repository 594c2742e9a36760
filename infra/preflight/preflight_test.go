package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
)

func ciliumConfig(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: CiliumConfigNamespace, Name: CiliumConfigName}, Data: data}
}

func ns(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func secret(namespace, name string, typ corev1.SecretType) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Type: typ}
}

// cluster is a fake API server holding objs and serving the listed group/version resources.
func cluster(served map[string][]string, objs ...runtime.Object) Cluster {
	cs := fake.NewClientset(objs...)
	d := cs.Discovery().(*fakediscovery.FakeDiscovery)
	for gv, res := range served {
		l := &metav1.APIResourceList{GroupVersion: gv}
		for _, r := range res {
			l.APIResources = append(l.APIResources, metav1.APIResource{Name: r})
		}
		d.Resources = append(d.Resources, l)
	}
	return FromClients(cs)
}

var (
	ciliumAPI  = map[string][]string{"cilium.io/v2": {"ciliumnetworkpolicies"}}
	gkeAPI     = map[string][]string{"networking.gke.io/v1alpha1": {"fqdnnetworkpolicies"}}
	goodCilium = map[string]string{"kube-proxy-replacement": "true", "bpf-lb-sock-hostns-only": "true", "enable-l7-proxy": "true"}
)

func stack(cloud components.Cloud, f sandboxnet.Flavour) Stack {
	return Stack{Name: string(cloud) + "-dev", Cloud: cloud, Flavour: f, ManagerNamespace: "fusebox-system", SandboxNamespace: "fusebox-sandboxes", CreateNamespaces: true}
}

func TestCheck(t *testing.T) {
	for name, tc := range map[string]struct {
		stack   Stack
		cluster Cluster
		want    []string // substrings of the refusal; none: accepted
	}{
		"eks with a good cilium": {stack(components.EKS, sandboxnet.Cilium), cluster(ciliumAPI, ciliumConfig(goodCilium), ciliumAgent("v1.16.5")), nil},
		"eks without cilium": {stack(components.EKS, sandboxnet.Cilium), cluster(nil),
			[]string{"runs no Cilium", "fusebox:cilium.install", "stacks/Pulumi.eks-dev.yaml"}},
		"eks with aws-cni chaining": {stack(components.EKS, sandboxnet.Cilium), cluster(ciliumAPI, ciliumConfig(map[string]string{"cni-chaining-mode": "aws-cni", "enable-l7-proxy": "true"})),
			[]string{"cni-chaining-mode=aws-cni", "toFQDNs is unsupported"}},
		"socket LB into pods": {stack(components.EKS, sandboxnet.Cilium), cluster(ciliumAPI, ciliumConfig(map[string]string{"kube-proxy-replacement": "true", "enable-l7-proxy": "true"})),
			[]string{"socketLB.hostNamespaceOnly", "bpf-lb-sock-hostns-only"}},
		"aks without acns": {stack(components.AKS, sandboxnet.Cilium), cluster(ciliumAPI, ciliumConfig(map[string]string{"enable-l7-proxy": "false"})),
			[]string{"enable-l7-proxy=false", "Advanced Container Networking Services", "--enable-acns"}},
		"cilium installed by the stack": {func() Stack { s := stack(components.EKS, sandboxnet.Cilium); s.CiliumInstall = true; return s }(), cluster(nil), nil},
		"gke ok":                        {stack(components.GKE, sandboxnet.GKE), cluster(gkeAPI, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "gvisor"}), nil},
		"gke without gke sandbox": {stack(components.GKE, sandboxnet.GKE), cluster(gkeAPI),
			[]string{"lacks gVisor", "--sandbox type=gvisor"}},
		"gke without fqdn policies": {stack(components.GKE, sandboxnet.GKE), cluster(nil, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "gvisor"}),
			[]string{"lacks FQDN support", "--enable-fqdn-network-policy"}},
		"local": {stack(components.Local, sandboxnet.Kubernetes), cluster(nil, sandboxNode("node-1")), nil},
		"pull secret missing": {func() Stack {
			s := stack(components.Local, sandboxnet.Kubernetes)
			s.ImagePullSecrets, s.CreateNamespaces = []string{"regcred"}, false
			return s
		}(), cluster(nil, ns("fusebox-system"), ns("fusebox-sandboxes"), secret("fusebox-system", "regcred", corev1.SecretTypeDockerConfigJson)),
			[]string{"Secret fusebox-sandboxes/regcred does not exist", "create secret docker-registry regcred"}},
		"pull secret of the wrong type": {func() Stack {
			s := stack(components.Local, sandboxnet.Kubernetes)
			s.ImagePullSecrets, s.CreateNamespaces = []string{"regcred"}, false
			return s
		}(), cluster(nil, ns("fusebox-system"), ns("fusebox-sandboxes"), secret("fusebox-system", "regcred", corev1.SecretTypeDockerConfigJson), secret("fusebox-sandboxes", "regcred", corev1.SecretTypeOpaque)),
			[]string{"fusebox-sandboxes/regcred has type Opaque"}},
		"pull secrets present": {func() Stack {
			s := stack(components.Local, sandboxnet.Kubernetes)
			s.ImagePullSecrets, s.CreateNamespaces = []string{"regcred"}, false
			return s
		}(), cluster(nil, ns("fusebox-system"), ns("fusebox-sandboxes"), secret("fusebox-system", "regcred", corev1.SecretTypeDockerConfigJson), secret("fusebox-sandboxes", "regcred", corev1.SecretTypeDockerConfigJson), sandboxNode("node-1")), nil},
		"pull secrets, namespaces not there yet": {func() Stack {
			s := stack(components.Local, sandboxnet.Kubernetes)
			s.ImagePullSecrets = []string{"regcred"}
			return s
		}(), cluster(nil), []string{"does not exist yet", "fusebox:namespaces.create: false"}},
		"existing namespace missing": {func() Stack {
			s := stack(components.Local, sandboxnet.Kubernetes)
			s.CreateNamespaces = false
			return s
		}(), cluster(nil, ns("fusebox-system")),
			[]string{"namespace fusebox-sandboxes does not exist"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := Check(context.Background(), tc.stack, tc.cluster)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("want a refusal, got %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestReadErrorsAreNotRefusals(t *testing.T) {
	c := cluster(ciliumAPI)
	c.ConfigMap = func(context.Context, string, string) (map[string]string, error) {
		return nil, errors.New("connection refused")
	}
	err := Check(context.Background(), stack(components.EKS, sandboxnet.Cilium), c)
	if err == nil || errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("got %v", err)
	}
}
