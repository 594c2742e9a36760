package kube

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/test/kubetest"
)

func daemonConfig(t *testing.T, ns string) daemon.Config {
	return daemon.Config{
		Listen: "unix://" + filepath.Join(t.TempDir(), "manager.sock"), Allocator: "kube", StateDir: t.TempDir(),
		Estimator: "fixed", PoolSize: 3, PoolMax: 3,
		Kube: daemon.KubeConfig{Kubeconfig: filepath.Join(env.Dir, "kubeconfig"), SandboxNamespace: ns, ManagerNamespace: ns,
			Identity: "manager-0", SandboxImage: image, AgentSelector: selectors.Agents, ManagerSelector: selectors.Manager,
			LeaderElect: true, NodeName: kubetest.NodeName},
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
	ctx := ctxT(t)
	dd, err := kubealloc.DefaultDenyPolicy(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Create(ctx, dd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(runCtx, daemonConfig(t, ns), slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	deadline := time.Now().Add(90 * time.Second)
	for {
		pods, _ := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubealloc.LabelState + "=" + kubealloc.StateReady})
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == "Running" {
				running++
			}
		}
		if running >= 3 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("manager exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not filled: %d running ready pods", running)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
