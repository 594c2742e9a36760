package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/gvisor"
	"github.com/fusebox-dev/fusebox/components/karpenter"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/test/testenv"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// installerObjects are the node installer's access objects as the gvisor component renders
// them on AKS (ServiceAccount, ClusterRole and binding, ValidatingAdmissionPolicy and
// binding), with the GroupVersionResource each is created as.
func installerObjects(t *testing.T) map[schema.GroupVersionResource][]*unstructured.Unstructured {
	t.Helper()
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := gvisor.NewGVisor(ctx, "fb", &gvisor.GVisorArgs{Cloud: components.AKS, ScheduleOnSandboxNodes: true,
			NodeInstaller: &gvisor.NodeInstallerArgs{Image: "registry.example/installer@sha256:" + strings.Repeat("a", 64)}})
		return err
	})
	out := map[schema.GroupVersionResource][]*unstructured.Unstructured{}
	for _, k := range []struct {
		typ, apiVersion, kind string
		gvr                   schema.GroupVersionResource
	}{
		{"kubernetes:core/v1:ServiceAccount", "v1", "ServiceAccount", schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}},
		{"kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "rbac.authorization.k8s.io/v1", "ClusterRole",
			schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}},
		{"kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "rbac.authorization.k8s.io/v1", "ClusterRoleBinding",
			schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}},
		{"kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy", "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy",
			schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}},
		{"kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding", "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding",
			schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}},
	} {
		for _, r := range m.ByType(k.typ) {
			obj := r.Props()
			obj["apiVersion"], obj["kind"] = k.apiVersion, k.kind
			out[k.gvr] = append(out[k.gvr], &unstructured.Unstructured{Object: obj})
		}
	}
	return out
}

// TestNodeInstallerAccess applies the node installer's RBAC and admission policy as the gvisor
// component renders them to a real API server, and acts as the installer with a real token of
// its service account bound to its pod on node A (the DaemonSet pod's projected token, whose
// user info the API server gives the pod's node name): the installer script's own requests
// remove node A's startup taint and label it, and the same requests for node B are refused, as
// is any other change of node A (another taint, another label, an annotation, cordoning),
// listing, and deleting.
func TestNodeInstallerAccess(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	const ns, sa = "kube-system", gvisor.InstallerName
	for gvr, objs := range installerObjects(t) {
		for _, o := range objs {
			ri := env.Dynamic.Resource(gvr)
			var err error
			if o.GetNamespace() != "" {
				_, err = ri.Namespace(o.GetNamespace()).Create(ctx, o, metav1.CreateOptions{})
			} else {
				_, err = ri.Create(ctx, o, metav1.CreateOptions{})
			}
			if err != nil {
				t.Fatalf("creating %s %s: %v", gvr.Resource, o.GetName(), err)
			}
		}
	}
	startup := corev1.Taint{Key: karpenter.StartupTaintKey, Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: "node.kubernetes.io/other", Effect: corev1.TaintEffectNoSchedule}
	for _, n := range []string{"installer-node-a", "installer-node-b"} {
		_, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{components.SandboxPoolLabelKey: components.SandboxPoolLabelValue}},
			Spec:       corev1.NodeSpec{Taints: []corev1.Taint{other, startup}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "installer-on-a"},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: "installer-node-a",
			Containers: []corev1.Container{{Name: "install", Image: "registry.example/installer:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Client.CoreV1().Pods(ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}) })
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	installer, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The script itself, with the token and the API server's CA as the pod's service account
	// volume has them.
	saDir := t.TempDir()
	ca := env.Config.TLSClientConfig.CAData
	if len(ca) == 0 {
		if ca, err = os.ReadFile(env.Config.TLSClientConfig.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": ca} {
		if err := os.WriteFile(filepath.Join(saDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(t.TempDir(), "node-installer.sh")
	if err := os.WriteFile(script, []byte(gvisor.InstallerScript), 0o755); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(env.Config.Host, "https://"), ":")
	runScript := func(node string) (string, error) {
		cmd := exec.CommandContext(ctx, "bash", "-c", `source "$1" && remove_startup_taint && label_node`, "bash", script)
		cmd.Env = append(os.Environ(), "FUSEBOX_INSTALLER_LIB=1", "NODE_NAME="+node, "SA_DIR="+saDir,
			"STARTUP_TAINT="+karpenter.StartupTaintKey, "READY_LABEL="+gvisor.ReadyLabelKey,
			"KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port, "NO_PROXY=*", "no_proxy=*")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	node := func(name string) *corev1.Node {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The API server applies a new policy once it has loaded it: wait until it refuses a
	// dry-run label of node B.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := installer.CoreV1().Nodes().Patch(ctx, "installer-node-b", types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"fusebox.dev/gvisor":"ready"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission policy is not in effect after 30s: dry-run label of node B: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Node B, which the pod does not run on: refused, the node as it was.
	if out, err := runScript("installer-node-b"); err == nil {
		t.Errorf("the installer on node A changed node B:\n%s", out)
	} else if !strings.Contains(out, "403") {
		t.Errorf("node B: want 403 from the admission policy:\n%s", out)
	}
	if b := node("installer-node-b"); len(b.Spec.Taints) != 2 || b.Labels[gvisor.ReadyLabelKey] != "" {
		t.Errorf("node B after the refused install: taints %v, labels %v", b.Spec.Taints, b.Labels)
	}
	// Its own node: the startup taint removed, the other kept, the label set.
	if out, err := runScript("installer-node-a"); err != nil {
		t.Fatalf("the installer on its own node: %v\n%s", err, out)
	}
	a := node("installer-node-a")
	if len(a.Spec.Taints) != 1 || a.Spec.Taints[0].Key != other.Key || a.Labels[gvisor.ReadyLabelKey] != gvisor.ReadyLabelValue {
		t.Errorf("node A after the install: taints %v, labels %v", a.Spec.Taints, a.Labels)
	}

	// Anything else on its own node, and any other verb, is refused.
	patch := func(name string, pt types.PatchType, body any) error {
		b, _ := json.Marshal(body)
		_, err := installer.CoreV1().Nodes().Patch(ctx, name, pt, b, metav1.PatchOptions{})
		return err
	}
	meta := func(k string, v any) map[string]any { return map[string]any{"metadata": map[string]any{k: v}} }
	for name, err := range map[string]error{
		"remove another taint": patch("installer-node-a", types.JSONPatchType, []map[string]any{{"op": "remove", "path": "/spec/taints/0"}}),
		"add a taint": patch("installer-node-a", types.JSONPatchType, []map[string]any{{"op": "add", "path": "/spec/taints/-",
			"value": map[string]any{"key": "x", "effect": "NoSchedule"}}}),
		"add another label":       patch("installer-node-a", types.MergePatchType, meta("labels", map[string]any{"fusebox.dev/other": "x"})),
		"remove a label":          patch("installer-node-a", types.MergePatchType, meta("labels", map[string]any{components.SandboxPoolLabelKey: nil})),
		"set the ready label off": patch("installer-node-a", types.MergePatchType, meta("labels", map[string]any{gvisor.ReadyLabelKey: "no"})),
		"add an annotation":       patch("installer-node-a", types.MergePatchType, meta("annotations", map[string]any{"x": "y"})),
		"cordon":                  patch("installer-node-a", types.MergePatchType, map[string]any{"spec": map[string]any{"unschedulable": true}}),
		"label node B":            patch("installer-node-b", types.MergePatchType, meta("labels", map[string]any{gvisor.ReadyLabelKey: gvisor.ReadyLabelValue})),
		"list":                    func() error { _, err := installer.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }(),
		"delete":                  installer.CoreV1().Nodes().Delete(ctx, "installer-node-b", metav1.DeleteOptions{}),
	} {
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("%s: want refused, got %v", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// The policy binds the installer only: an administrator's change passes.
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, "installer-node-b", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"ready"}}}`, gvisor.ReadyLabelKey)), metav1.PatchOptions{}); err != nil {
		t.Errorf("administrator's label: %v", err)
	}
}
