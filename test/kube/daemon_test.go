package kube

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/test/kubetest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// waitPoolReady waits up to 90 s for n ready, running sandbox pods in ns, failing t if the
// manager running beside (its result on done) exits first.
func waitPoolReady(t *testing.T, ctx context.Context, ns string, n int, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ready := 0
		for _, p := range sandboxPods(t, ctx, ns) {
			if p.Annotations[kubealloc.AnnotationState] == kubealloc.StateReady && p.Status.Phase == corev1.PodRunning {
				ready++
			}
		}
		if ready >= n {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("manager exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not filled: %d ready pods, want %d", ready, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func daemonConfig(t *testing.T, ns string) daemon.Config {
	return daemon.Config{
		Listen: "unix://" + filepath.Join(t.TempDir(), "manager.sock"), Allocator: "kube", StateDir: t.TempDir(),
		Estimator: "fixed", PoolSize: 3, PoolMax: 3,
		Kube: daemon.KubeConfig{Kubeconfig: filepath.Join(env.Dir, "kubeconfig"), SandboxNamespace: ns, ManagerNamespace: env.Namespace(t),
			Identity: "manager-0", SandboxImage: image, AgentSelector: selectors.Agents, ManagerSelector: selectors.Manager,
			AgentNamespaces: selectors.AgentNamespaces,
			LeaderElect:     true, NodeName: kubetest.NodeName},
	}
}

// TestManagerRefusesNamespaceWithoutDefaultDeny: `fusebox manager --allocator kube` does not
// start (and creates nothing) when the sandbox namespace lacks the default-deny policy.
func TestManagerRefusesNamespaceWithoutDefaultDeny(t *testing.T) {
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := daemon.Run(ctx, daemonConfig(t, ns), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, kubealloc.ErrNoDefaultDeny) || !strings.Contains(err.Error(), "refusing to start") {
		t.Fatalf("daemon.Run = %v, want a refusal wrapping ErrNoDefaultDeny", err)
	}
	pods, _ := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods created by a manager that refused to start", len(pods.Items))
	}
}

// TestManagerFillsSharedPool: with the default-deny policy in place the kube manager starts,
// wins the election and fills the pool to its target; on exit it leaves the shared pool.
func TestManagerFillsSharedPool(t *testing.T) {
	ns := env.Namespace(t)
	ctx := testenv.Context(t, 2*time.Minute)
	createDefaultDeny(t, ctx, ns)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(runCtx, daemonConfig(t, ns), slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	waitPoolReady(t, ctx, ns, 3, done)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("manager exit: %v", err)
	}
	// The pool is shared by every replica: a stopping replica does not destroy it.
	pods, _ := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if len(pods.Items) < 3 {
		t.Fatalf("a stopping replica deleted the shared pool (%d pods left)", len(pods.Items))
	}
}

// sandboxTemplate is a --sandbox-template file: the kwok node's pool label and taint, its own
// resources and a label of its own.
const sandboxTemplate = `apiVersion: v1
kind: Pod
metadata:
  labels:
    app.kubernetes.io/name: fusebox-sandbox
    team: ml
spec:
  runtimeClassName: gvisor
  nodeSelector:
    fusebox.dev/pool: sandbox
  tolerations:
  - {key: fusebox.dev/sandbox, operator: Exists, effect: NoSchedule}
  - {key: example.com/dedicated, operator: Exists}
  containers:
  - name: sandbox
    image: ` + image + `
    ports:
    - {name: init, containerPort: 7070}
    - {name: data, containerPort: 7071}
    resources:
      requests: {cpu: 300m, memory: 300Mi}
      limits: {cpu: 700m, memory: 900Mi}
    securityContext:
      privileged: false
`

// TestManagerUsesSandboxTemplate: `fusebox manager --sandbox-template` builds the pool's pods
// from the file, with the enforced security settings.
func TestManagerUsesSandboxTemplate(t *testing.T) {
	ns := env.Namespace(t)
	ctx := testenv.Context(t, 2*time.Minute)
	createDefaultDeny(t, ctx, ns)
	cfg := daemonConfig(t, ns)
	cfg.PoolSize, cfg.PoolMax = 1, 1
	cfg.Kube.SandboxTemplate = filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(cfg.Kube.SandboxTemplate, []byte(sandboxTemplate), 0o600); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- daemon.Run(runCtx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager exit: %v", err)
		}
	}()
	var p corev1.Pod
	waitFor(t, func() bool {
		pods, _ := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if pods == nil || len(pods.Items) == 0 {
			return false
		}
		p = pods.Items[0]
		return true
	})
	c := p.Spec.Containers[0]
	// (The API server's DefaultTolerationSeconds plugin adds tolerations of its own.)
	if p.Labels["team"] != "ml" || len(p.Spec.Tolerations) < 2 || p.Spec.Tolerations[1].Key != "example.com/dedicated" ||
		c.Resources.Requests.Cpu().String() != "300m" || c.Resources.Limits.Memory().String() != "900Mi" {
		t.Errorf("pod does not follow the template: labels %v tolerations %v resources %v", p.Labels, p.Spec.Tolerations, c.Resources)
	}
	sc := c.SecurityContext
	if *p.Spec.RuntimeClassName != "gvisor" || *p.Spec.AutomountServiceAccountToken || *sc.RunAsUser != 0 || !slices.Contains(c.Args, "-command-user=65532:65532") || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities.Drop[0] != "ALL" || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("enforced security settings missing: %+v %+v", p.Spec, sc)
	}
}

// TestManagerRefusesPrivilegedTemplate: a template that contradicts the enforced security
// settings stops the manager before it creates anything, naming the field.
func TestManagerRefusesPrivilegedTemplate(t *testing.T) {
	ns := env.Namespace(t)
	cfg := daemonConfig(t, ns)
	cfg.Kube.SandboxTemplate = filepath.Join(t.TempDir(), "pod.yaml")
	bad := strings.Replace(sandboxTemplate, "privileged: false", "privileged: true", 1)
	if err := os.WriteFile(cfg.Kube.SandboxTemplate, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, kubealloc.ErrTemplate) || !strings.Contains(err.Error(), "spec.containers[0].securityContext.privileged") {
		t.Fatalf("daemon.Run = %v, want a refusal naming securityContext.privileged", err)
	}
	pods, _ := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods created by a manager that refused its template", len(pods.Items))
	}
}
