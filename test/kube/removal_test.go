package kube

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// createManagerDeployment creates the manager's Deployment in ns as components/manager makes
// it, reduced to what the removal depends on: its name and RemovalFinalizer. This control
// plane runs no deployment controller, so it gets no pods: the manager runs in the test. The
// finalizer is released when the test ends: no Deployment is left stuck on it.
func createManagerDeployment(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	labels := map[string]string{"app.kubernetes.io/name": "fusebox-manager"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "fusebox-manager", Namespace: ns, Finalizers: []string{kubealloc.RemovalFinalizer}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: image}}},
			},
		},
	}
	if _, err := env.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kubealloc.ReleaseRemoval(context.Background(), env.Client, ns, "fusebox-manager") })
}

// sandboxPods lists the sandbox pods of ns from the API server.
func sandboxPods(t *testing.T, ctx context.Context, ns string) []corev1.Pod {
	t.Helper()
	l, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubealloc.LabelApp + "=" + kubealloc.AppName})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestDeletingTheManagerRemovesEverySandboxFirst: with the sandbox namespace's policies in
// place (and not Pulumi's namespaces to delete), deleting the manager's Deployment as Pulumi
// does (in the background: the component's pulumi.com/deletionPropagationPolicy) leaves it
// in place until the running manager has stopped its pool and deleted every sandbox pod, the
// warm ones and one bound by another replica; the Deployment is gone only once no sandbox pod
// is left, and none is made after. A manager started after that refuses to start.
func TestDeletingTheManagerRemovesEverySandboxFirst(t *testing.T) {
	ns, managerNS := env.Namespace(t), env.Namespace(t)
	ctx := testenv.Context(t, 3*time.Minute)
	createDefaultDeny(t, ctx, ns)
	deps := env.Client.AppsV1().Deployments(managerNS)
	createManagerDeployment(t, ctx, managerNS)

	// A sandbox bound by another replica, with its egress policy.
	other := newAllocator(t, ns, "replica-b", nil)
	bound := createPool(t, other, "bound", 1)[0]
	u, err := other.Pick(manager.DefaultTemplate, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if err := other.ClaimBound(ctx, u, map[string]string{"fusebox.dev/owner": "agent"}); err != nil {
		t.Fatal(err)
	}
	if err := other.BindEgress(ctx, bound, []string{"example.com:443"}); err != nil {
		t.Fatal(err)
	}

	cfg := daemonConfig(t, ns)
	cfg.Kube.ManagerNamespace, cfg.Kube.Deployment = managerNS, "fusebox-manager"
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- daemon.Run(runCtx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	waitPoolReady(t, ctx, ns, 3, done)

	w, err := deps.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=fusebox-manager"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := deps.Delete(ctx, "fusebox-manager", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	// The Deployment stays while any sandbox pod exists.
	for gone := false; !gone; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch of the manager's Deployment ended")
			}
			gone = ev.Type == watch.Deleted
		case err := <-done:
			t.Fatalf("manager exited while removing: %v", err)
		case <-ctx.Done():
			t.Fatalf("the manager's Deployment was never released; sandbox pods left: %d", len(sandboxPods(t, context.Background(), ns)))
		}
	}
	if left := sandboxPods(t, ctx, ns); len(left) != 0 {
		t.Fatalf("the manager's Deployment is gone with %d sandbox pods left (first %s)", len(left), left[0].Name)
	}
	// The manager stopped its pool: nothing is made after, while it waits to be stopped.
	time.Sleep(3 * time.Second)
	if left := sandboxPods(t, ctx, ns); len(left) != 0 {
		t.Fatalf("%d sandbox pods made after the removal", len(left))
	}
	select {
	case err := <-done:
		t.Fatalf("manager exited before it was stopped: %v", err)
	default:
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("manager exit after the removal: %v", err)
	}

	// A manager of a removed installation (a restarted container) starts no pool.
	cfg.StateDir = t.TempDir()
	err = daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, kubealloc.ErrManagerRemoved) {
		t.Fatalf("manager started without its Deployment: %v, want ErrManagerRemoved", err)
	}
	if left := sandboxPods(t, ctx, ns); len(left) != 0 {
		t.Fatalf("%d sandbox pods made by a manager without its Deployment", len(left))
	}
}

// TestManagerStartingDuringRemovalMakesNoPool: a manager that starts while its Deployment is
// being deleted (a replica restarted mid-removal) makes no sandbox, removes those left and
// releases the Deployment.
func TestManagerStartingDuringRemovalMakesNoPool(t *testing.T) {
	ns, managerNS := env.Namespace(t), env.Namespace(t)
	ctx := testenv.Context(t, 2*time.Minute)
	createDefaultDeny(t, ctx, ns)
	deps := env.Client.AppsV1().Deployments(managerNS)
	createManagerDeployment(t, ctx, managerNS)
	left := createPool(t, newAllocator(t, ns, "replica-b", nil), "left", 2)
	if err := deps.Delete(ctx, "fusebox-manager", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	if d, err := deps.Get(ctx, "fusebox-manager", metav1.GetOptions{}); err != nil || d.DeletionTimestamp == nil {
		t.Fatalf("the Deployment with its finalizer, being deleted: %v %v", d, err)
	}

	cfg := daemonConfig(t, ns)
	cfg.Kube.ManagerNamespace, cfg.Kube.Deployment = managerNS, "fusebox-manager"
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- daemon.Run(runCtx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	waitFor(t, func() bool {
		_, err := deps.Get(ctx, "fusebox-manager", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	for _, p := range sandboxPods(t, ctx, ns) {
		t.Errorf("sandbox pod %s left (of %v) once the Deployment is gone", p.Name, left)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("manager exit: %v", err)
	}
}
