// Package deployup runs `fusebox up` (infra.Program through the Automation API) for the local
// stack against a real kube-apiserver, then checks what the API server holds and that it
// enforces the sandbox admission policy itself.
package deployup

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/fusebox-dev/fusebox/infra/deploy"
	"github.com/fusebox-dev/fusebox/test/kubetest"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env)) }

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

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

	// The local stack, with skipAwait: this control plane runs no controllers, so the
	// manager's Deployment never gets pods.
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, "infra"), 0o755)
	os.MkdirAll(filepath.Join(repo, "stacks"), 0o755)
	b, _ := os.ReadFile(filepath.Join(repoRoot(), "infra", "Pulumi.yaml"))
	os.WriteFile(filepath.Join(repo, "infra", "Pulumi.yaml"), b, 0o644)
	local, err := os.ReadFile(filepath.Join(repoRoot(), "stacks", "Pulumi.local.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	stack := strings.Replace(string(local), "  fusebox:manager:\n", "  fusebox:manager:\n    skipAwait: true\n", 1)
	if stack == string(local) {
		t.Fatal("stacks/Pulumi.local.yaml has no fusebox:manager block to extend")
	}
	os.WriteFile(filepath.Join(repo, "stacks", "Pulumi.local.yaml"), []byte(stack), 0o644)

	var progress strings.Builder
	res, err := deploy.Run(ctx, deploy.Up, deploy.Options{Stack: "local", RepoDir: repo, Tools: tools,
		Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": filepath.Join(env.Dir, "kubeconfig")},
		Progress: &progress})
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
	pols, err := env.Dynamic.Resource(cnp).Namespace(sandboxNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(pols.Items) < 3 {
		t.Fatalf("sandbox network policies: %v (%d)", err, len(pols.Items))
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
}
