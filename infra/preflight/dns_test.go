package preflight

import (
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"k8s.io/apimachinery/pkg/runtime"
)

// nodeLocalDNS is NodeLocal DNSCache's DaemonSet as the upstream addon runs it
// (kubernetes cluster/addons/dns/nodelocaldns/nodelocaldns.yaml: host network, node-cache
// with -localip), listening on localip.
func nodeLocalDNS(hostNetwork bool, localip string) runtime.Object {
	return daemonSet(NodeLocalDNSNamespace, NodeLocalDNSName, hostNetwork,
		[]string{"-localip", localip, "-conf", "/etc/Corefile", "-upstreamsvc", "kube-dns-upstream"},
		"registry.k8s.io/dns/k8s-dns-node-cache:1.23.1")
}

// TestClusterDNS: the DNS setup the sandboxes' DNS rules are rendered for
// (fusebox:clusterDNS) matches what the cluster shows of its DNS, or the stack is refused
// naming the setting.
func TestClusterDNS(t *testing.T) {
	withDNS := func(s Stack, d sandboxnet.ClusterDNS) Stack { s.ClusterDNS = d; return s }
	gke := stack(components.GKE, sandboxnet.GKE)
	eks := stack(components.EKS, sandboxnet.Cilium)
	gkeCluster := func(objs ...runtime.Object) Cluster { return cluster(gkeAPI, append(objs, gkeRuntimeClass())...) }
	eksCluster := func(objs ...runtime.Object) Cluster {
		return cluster(ciliumAPI, append(objs, ciliumConfig(goodCilium), ciliumAgent("v1.16.5"))...)
	}
	for name, tc := range map[string]struct {
		stack   Stack
		cluster Cluster
		want    []string
	}{
		"kube-dns":                  {gke, gkeCluster(), nil},
		"gke cloud dns":             {withDNS(gke, sandboxnet.GKECloudDNS), gkeCluster(), nil},
		"nodelocaldns":              {withDNS(gke, sandboxnet.NodeLocalDNS), gkeCluster(nodeLocalDNS(true, "169.254.20.10")), nil},
		"node cache, kube-dns set":  {gke, gkeCluster(nodeLocalDNS(true, "169.254.20.10")), []string{"runs NodeLocal DNSCache (DaemonSet kube-system/node-local-dns)", "fusebox:clusterDNS: nodelocaldns", "stacks/Pulumi.gke-dev.yaml"}},
		"node cache, cloud dns set": {withDNS(gke, sandboxnet.GKECloudDNS), gkeCluster(nodeLocalDNS(true, "169.254.20.10")), []string{"not gke-clouddns", "fusebox:clusterDNS: nodelocaldns"}},
		"nodelocaldns set, absent":  {withDNS(gke, sandboxnet.NodeLocalDNS), gkeCluster(), []string{"fusebox:clusterDNS is nodelocaldns", "node-local-dns not found"}},
		"node cache on the service address too": {withDNS(gke, sandboxnet.NodeLocalDNS), gkeCluster(nodeLocalDNS(true, "169.254.20.10,10.96.0.10")),
			[]string{"listens on 169.254.20.10,10.96.0.10", "-localip 169.254.20.10 alone"}},
		"node cache elsewhere":             {withDNS(gke, sandboxnet.NodeLocalDNS), gkeCluster(nodeLocalDNS(true, "169.254.25.10")), []string{"listens on 169.254.25.10"}},
		"cilium, node cache via LRP":       {withDNS(eks, sandboxnet.NodeLocalDNS), eksCluster(nodeLocalDNS(false, "169.254.20.10")), nil},
		"cilium, node cache in host net":   {withDNS(eks, sandboxnet.NodeLocalDNS), eksCluster(nodeLocalDNS(true, "169.254.20.10")), []string{"runs in the host network", "toEntities host", "Local Redirect Policy"}},
		"plain NetworkPolicy has no names": {withDNS(stack(components.Local, sandboxnet.Kubernetes), sandboxnet.KubeDNS), cluster(nil, sandboxNode("n"), nodeLocalDNS(true, "169.254.20.10")), nil},
	} {
		t.Run(name, func(t *testing.T) {
			got := refusal(t, tc.stack, tc.cluster)
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
}

func TestLocalIPs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-localip", "169.254.20.10,10.0.0.10", "-conf", "x"}, "169.254.20.10,10.0.0.10"},
		{[]string{"--localip=169.254.20.10"}, "169.254.20.10"},
		{[]string{"-conf", "x"}, "none"},
	} {
		if got := strings.Join(localIPs(tc.args), ","); got != tc.want {
			t.Errorf("localIPs(%q) = %s, want %s", tc.args, got, tc.want)
		}
	}
}
