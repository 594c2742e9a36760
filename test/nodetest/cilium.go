package nodetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// DefaultCiliumBinDir is where make cilium puts Cilium's agent, CNI plugin, datapath sources
// and CRDs (hack/cilium/build.sh).
const DefaultCiliumBinDir = "/var/cache/fusebox/cilium-v1.20.2"

// PodCIDR is the Node's podCIDR under Options.Cilium: pods get their addresses from it, on
// veths of their own; the host routes it to them.
const PodCIDR = "10.214.0.0/24"

// ciliumHealth is the agent's health endpoint (--agent-health-port in node.sh).
const ciliumHealth = "http://127.0.0.1:20879/healthz"

// CiliumBinDir returns $FUSEBOX_CILIUM_BIN or DefaultCiliumBinDir.
func CiliumBinDir() string {
	if d := os.Getenv("FUSEBOX_CILIUM_BIN"); d != "" {
		return d
	}
	return DefaultCiliumBinDir
}

// ErrNoCilium means what the cilium flavour needs is missing.
var ErrNoCilium = errors.New("cilium missing: run make cilium (and apt-get install clang-19 llvm-19 iptables)")

// checkCilium checks what node.sh's start-cilium runs.
func checkCilium(dir string) error {
	for _, f := range []string{"cilium-agent", "cilium-cni", "lib/bpf/bpf_lxc.c", "crds/ciliumnetworkpolicies.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("%w (%v)", ErrNoCilium, err)
		}
	}
	for _, t := range []string{"clang-19", "llc-19", "iptables"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%w (%v)", ErrNoCilium, err)
		}
	}
	return nil
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// startCilium registers Cilium's CRDs (what cilium-operator does when it starts: the
// operator is not built, see hack/cilium/build.sh), starts the agent and waits until it
// reports healthy.
func (n *Node) startCilium(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(n.cilium, "crds", "*.yaml"))
	if err != nil {
		return err
	}
	// Cilium's CRDs use the "idn-hostname" format, which the API server warns about.
	cfg := rest.CopyConfig(n.Env.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := dyn.Resource(crdGVR)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return fmt.Errorf("parsing %s: %w", f, err)
		}
		_, err = crds.Create(ctx, u, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // the control plane's own copy (test/kubetest/crds)
			var old *unstructured.Unstructured
			if old, err = crds.Get(ctx, u.GetName(), metav1.GetOptions{}); err == nil {
				u.SetResourceVersion(old.GetResourceVersion())
				_, err = crds.Update(ctx, u, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("registering Cilium's CRD from %s: %w", f, err)
		}
		name := u.GetName()
		if err := n.waitFor(ctx, "CRD "+name+" to be Established", 30*time.Second, func() bool {
			u, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return true
				}
			}
			return false
		}); err != nil {
			return err
		}
	}
	if err := n.run(ctx, "start-cilium"); err != nil {
		return err
	}
	// The first start compiles the datapath (clang, a few CPU-minutes on a small machine).
	return n.waitFor(ctx, "cilium-agent to report healthy", 10*time.Minute, func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ciliumHealth, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
