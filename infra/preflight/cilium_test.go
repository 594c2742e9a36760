package preflight

import (
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// daemonSet is DaemonSet namespace/name running images (one container each; the first gets
// args).
func daemonSet(namespace, name string, hostNetwork bool, args []string, images ...string) *appsv1.DaemonSet {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	ds.Spec.Template.Spec.HostNetwork = hostNetwork
	for i, img := range images {
		c := corev1.Container{Name: "c" + string(rune('0'+i)), Image: img}
		if i == 0 {
			c.Args = args
		}
		ds.Spec.Template.Spec.Containers = append(ds.Spec.Template.Spec.Containers, c)
	}
	return ds
}

// ciliumAgent is the chart's cilium-agent DaemonSet running the release tagged tag.
func ciliumAgent(tag string) *appsv1.DaemonSet {
	return daemonSet(CiliumAgentNamespace, CiliumAgentName, true, nil, "quay.io/cilium/cilium:"+tag+"@sha256:"+strings.Repeat("a", 64))
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{
		"1.16.5": {1, 16, 5}, "v1.16.5": {1, 16, 5}, "v1.15.19-250129": {1, 15, 19}, "1.17": {1, 17, 0}, "v1.18.0-rc.1": {1, 18, 0},
	} {
		if got, err := ParseVersion(in); err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "latest", "stable", "sha256"} {
		if _, err := ParseVersion(in); err == nil {
			t.Errorf("ParseVersion(%q) accepted", in)
		}
	}
	if !(Version{1, 15, 99}).Less(MinCiliumVersion) || MinCiliumVersion.Less(Version{1, 16, 0}) || (Version{2, 0, 0}).Less(MinCiliumVersion) {
		t.Error("Less orders releases wrongly")
	}
}

// TestCiliumVersion: the cluster's own Cilium must be 1.16 or later (enableDefaultDeny), read
// from the agent DaemonSet's image tag (quay.io/cilium/cilium:vX.Y.Z for the chart;
// mcr.microsoft.com/oss/cilium/cilium:X.Y.Z-BUILD on AKS); an unreadable version is refused
// too. A Cilium the stack installs is the chart's (checked with the configuration).
func TestCiliumVersion(t *testing.T) {
	eks := stack(components.EKS, sandboxnet.Cilium)
	for name, tc := range map[string]struct {
		agent any
		want  []string
	}{
		"1.15":         {ciliumAgent("v1.15.19"), []string{"Cilium 1.15.19 is too old", "1.16.0 or later", "enableDefaultDeny", "fusebox:networkPolicy: kubernetes"}},
		"1.16":         {ciliumAgent("v1.16.0"), nil},
		"aks 1.17":     {daemonSet(CiliumAgentNamespace, CiliumAgentName, true, nil, "mcr.microsoft.com/oss/cilium/cilium:1.17.7-250903"), nil},
		"aks 1.14":     {daemonSet(CiliumAgentNamespace, CiliumAgentName, true, nil, "mcr.microsoft.com/oss/cilium/cilium:1.14.19-241022"), []string{"Cilium 1.14.19 is too old"}},
		"by digest":    {daemonSet(CiliumAgentNamespace, CiliumAgentName, true, nil, "quay.io/cilium/cilium@sha256:"+strings.Repeat("b", 64)), []string{"Cilium's version is unknown", "no version tag"}},
		"other images": {daemonSet(CiliumAgentNamespace, CiliumAgentName, true, nil, "registry.example/agent:1.0"), []string{"runs no cilium image"}},
		"no agent":     {nil, []string{"DaemonSet kube-system/cilium not found"}},
	} {
		t.Run(name, func(t *testing.T) {
			objs := []runtime.Object{ciliumConfig(goodCilium)}
			if tc.agent != nil {
				objs = append(objs, tc.agent.(runtime.Object))
			}
			got := refusal(t, eks, cluster(ciliumAPI, objs...))
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("refused: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("refusal lacks %q:\n%s", w, got)
				}
			}
		})
	}
	installs := eks
	installs.CiliumInstall = true
	if got := refusal(t, installs, cluster(nil)); got != "" {
		t.Errorf("a stack installing Cilium refused: %s", got)
	}
}
