// Package deployup runs `fusebox up` (infra.Program through the Automation API) for the local
// stack against a real kube-apiserver, checks what the API server holds and that it enforces
// the sandbox admission policy itself, then runs `fusebox destroy` and checks that nothing is
// left behind. It also creates every stack's objects, as the Pulumi mocks record them, in the
// API server with server-side dry run, so that the server validates each against its schema.
package deployup

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/infra/deploy"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/kubetest"
	"github.com/fusebox-dev/fusebox/test/stacktest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env)) }

func TestUpLocalStack(t *testing.T) {
	tools := os.Getenv("FUSEBOX_PULUMI_TOOLS")
	if tools == "" {
		tools = "/var/cache/fusebox/pulumi-v3.274.1-k8s-4.25.0"
	}
	if _, err := os.Stat(filepath.Join(tools, "bin", "pulumi")); err != nil {
		t.Fatalf("Pulumi tools missing in %s: run make tools", tools)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The harness made a gvisor RuntimeClass for the allocator tests; the program makes its own.
	env.Client.NodeV1().RuntimeClasses().Delete(ctx, "gvisor", metav1.DeleteOptions{})

	// The local stack, with skipAwait: this control plane runs no deployment controller or
	// scheduler, so the manager's Deployment never gets pods.
	repo := mocktest.ScratchRepo(t, stacktest.Repo(t, testenv.ModuleRoot()), "local", func(local string) string {
		stack := strings.Replace(local, "  fusebox:manager:\n", "  fusebox:manager:\n    skipAwait: true\n", 1)
		if stack == local {
			t.Fatal("stacks/Pulumi.local.yaml has no fusebox:manager block to extend")
		}
		return stack
	})

	// Everything the API server holds before up, to compare with what is left after destroy.
	before := snapshot(ctx, t)

	var progress strings.Builder
	opts := deploy.Options{Stack: "local", RepoDir: repo, Tools: tools,
		Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": filepath.Join(env.Dir, "kubeconfig")},
		Progress: &progress}
	res, err := deploy.Run(ctx, deploy.Up, opts)
	if err != nil {
		t.Fatalf("up: %v\n%s", err, progress.String())
	}
	if res.Changes["create"] < 20 {
		t.Fatalf("up created %v", res.Changes)
	}
	sandboxNS, _ := res.Outputs["namespaces"].(map[string]any)["sandbox"].(string)
	managerNS, _ := res.Outputs["namespaces"].(map[string]any)["manager"].(string)
	if sandboxNS == "" || managerNS == "" {
		t.Fatalf("outputs %v", res.Outputs)
	}

	// What the API server holds.
	dep, err := env.Client.AppsV1().Deployments(managerNS).Get(ctx, "fusebox-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("manager Deployment: %v", err)
	}
	if *dep.Spec.Replicas < 2 || !strings.Contains(strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "), "--allocator=kube") {
		t.Fatalf("manager Deployment spec %+v", dep.Spec.Template.Spec.Containers[0].Args)
	}
	if _, err := env.Client.NodeV1().RuntimeClasses().Get(ctx, "gvisor", metav1.GetOptions{}); err != nil {
		t.Fatalf("RuntimeClass gvisor: %v", err)
	}
	cnp := schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	// The local stack renders plain NetworkPolicy (kube-router enforces it on a real node);
	// the manager's start check finds its default deny as the program made it.
	nps, err := env.Client.NetworkingV1().NetworkPolicies(sandboxNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(nps.Items) < 2 {
		t.Fatalf("sandbox network policies: %v (%d)", err, len(nps.Items))
	}
	if err := kubealloc.CheckDefaultDeny(ctx, env.Dynamic, sandboxNS, sandboxnet.Kubernetes); err != nil {
		t.Fatalf("the manager would refuse the namespace up made: %v", err)
	}
	if _, err := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}

	// The API server itself refuses a sandbox-namespace pod without gVisor (CEL admission)
	// and admits a compliant one.
	pod := func(rc *string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}, Spec: corev1.PodSpec{
			RuntimeClassName:             rc,
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/x@sha256:" + strings.Repeat("a", 64),
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}}}
	}
	deadline := time.Now().Add(30 * time.Second) // the policy takes effect within seconds
	for {
		_, err := env.Client.CoreV1().Pods(sandboxNS).Create(ctx, pod(nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pod without runtimeClassName gvisor was not refused by admission: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := env.Client.CoreV1().Pods(sandboxNS).Create(ctx, pod(ptr.To("gvisor")), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("a compliant gVisor pod was refused: %v", err)
	}
	// So is the sandbox pod template the manager reads from its ConfigMap.
	cm, err := env.Client.CoreV1().ConfigMaps(managerNS).Get(ctx, manager.TemplateCMName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("sandbox template ConfigMap: %v", err)
	}
	tmpl := &corev1.Pod{}
	if err := yaml.UnmarshalStrict([]byte(cm.Data[manager.SandboxTemplateKey]), tmpl); err != nil {
		t.Fatalf("sandbox template: %v", err)
	}
	tmpl.GenerateName = "template-"
	if _, err := env.Client.CoreV1().Pods(sandboxNS).Create(ctx, tmpl, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
		t.Fatalf("the manager's sandbox pod template was refused in %s: %v", sandboxNS, err)
	}
	// It adds SETUID and SETGID (the server runs its commands as another user); one more
	// capability, even one Pod Security baseline allows, is refused by the admission policy.
	more := tmpl.DeepCopy()
	sc := more.Spec.Containers[0].SecurityContext
	sc.Capabilities.Add = append(sc.Capabilities.Add, "DAC_OVERRIDE")
	if _, err := env.Client.CoreV1().Pods(sandboxNS).Create(ctx, more, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "SETUID and SETGID") {
		t.Fatalf("a sandbox pod adding DAC_OVERRIDE: %v, want the admission policy's refusal", err)
	}

	created := diff(snapshot(ctx, t), before)
	for _, want := range []string{"namespaces//" + sandboxNS, "namespaces//" + managerNS, "runtimeclasses.node.k8s.io//gvisor",
		"deployments.apps/" + managerNS + "/fusebox-manager"} {
		if !slices.Contains(created, want) {
			t.Fatalf("up created %v, not %s", created, want)
		}
	}

	// destroy removes everything up made: the namespaces finish terminating (the control
	// plane runs the namespace controller), and nothing else the program created is left.
	progress.Reset()
	res, err = deploy.Run(ctx, deploy.Destroy, opts)
	if err != nil {
		t.Fatalf("destroy: %v\n%s", err, progress.String())
	}
	if res.Changes["delete"] < len(created) {
		t.Errorf("destroy deleted %v; up created %d objects", res.Changes, len(created))
	}
	for _, ns := range []string{sandboxNS, managerNS} {
		// destroy waits for a Namespace to be gone, so this deadline is only a backstop.
		waitGone(t, 30*time.Second, "namespace "+ns, func() error {
			_, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err
		})
	}
	if _, err := env.Client.NodeV1().RuntimeClasses().Get(ctx, "gvisor", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("RuntimeClass gvisor after destroy: %v", err)
	}
	vaps, err := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil || len(vaps.Items) != 0 {
		t.Errorf("ValidatingAdmissionPolicies after destroy: %v %v", err, vaps.Items)
	}
	bindings, err := env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil || len(bindings.Items) != 0 {
		t.Errorf("ValidatingAdmissionPolicyBindings after destroy: %v %v", err, bindings.Items)
	}
	if pols, err := env.Dynamic.Resource(cnp).List(ctx, metav1.ListOptions{}); err != nil || len(pols.Items) != 0 {
		t.Errorf("CiliumNetworkPolicies after destroy: %v %v", err, pols)
	}
	if left := diff(snapshot(ctx, t), before); len(left) > 0 {
		t.Errorf("destroy left behind %d objects:\n%s", len(left), strings.Join(left, "\n"))
	}
}

// snapshot is env.Snapshot, failing the test on an error.
func snapshot(ctx context.Context, t *testing.T) map[string]bool {
	t.Helper()
	s, err := env.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var diff = kubetest.Diff

// waitGone polls get until it reports NotFound, failing the test after timeout.
func waitGone(t *testing.T, timeout time.Duration, what string, get func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := get()
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s still exists %s after destroy (last get: %v)", what, timeout, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
