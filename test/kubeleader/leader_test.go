// Package kubeleader tests manager leader election against a real API server.
package kubeleader

import (
	"context"
	"os"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fusebox-dev/fusebox/manager/leader"
	"github.com/fusebox-dev/fusebox/test/kubetest"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env)) }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExactlyOneLeaderAndHandover: two replicas elect exactly one leader; when it stops
// (releasing its lease), the other takes over.
func TestExactlyOneLeaderAndHandover(t *testing.T) {
	ns := env.Namespace(t)
	start := func(id string) (*leader.Elector, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		e, err := leader.Start(ctx, leader.Options{Client: env.Client, Namespace: ns, Name: "fusebox-manager",
			Identity: id, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); <-e.Done() })
		return e, cancel
	}
	a, cancelA := start("replica-a")
	b, cancelB := start("replica-b")
	eventually(t, "a leader", func() bool { return a.IsLeader() || b.IsLeader() })
	for range 20 {
		if a.IsLeader() && b.IsLeader() {
			t.Fatal("two leaders at once")
		}
		time.Sleep(50 * time.Millisecond)
	}
	first, second, stop := a, b, cancelA
	if b.IsLeader() {
		first, second, stop = b, a, cancelB
	}
	stop()
	<-first.Done()
	eventually(t, "the other replica to take over", second.IsLeader)
	if first.IsLeader() {
		t.Fatal("the stopped replica still claims leadership")
	}
}

// TestLeaseGoesWithItsOwner: with Owner (the manager's Deployment), the Lease is made owned,
// an existing one gets the owner added, the election keeps it through its renewals and makes
// it again owned, and the garbage collector deletes it with the Deployment, also when the
// replicas still run as it goes: nothing is left where a destroy keeps the namespace.
func TestLeaseGoesWithItsOwner(t *testing.T) {
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	labels := map[string]string{"app.kubernetes.io/name": "fusebox-manager"}
	d, err := env.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "fusebox-manager"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "manager"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID}
	leases := env.Client.CoordinationV1().Leases(ns)
	owned := func() bool {
		l, err := leases.Get(ctx, "fusebox-manager", metav1.GetOptions{})
		return err == nil && len(l.OwnerReferences) == 1 && l.OwnerReferences[0].UID == d.UID && l.Spec.HolderIdentity != nil
	}
	for _, id := range []string{"replica-a", "replica-b"} { // the second finds the Lease made
		e, err := leader.Start(ctx, leader.Options{Client: env.Client, Namespace: ns, Name: "fusebox-manager", Identity: id,
			Owner: owner, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { <-e.Done() }()
	}
	eventually(t, "the Lease held and owned by the Deployment", owned)
	time.Sleep(3 * time.Second) // renewals
	if !owned() {
		t.Fatal("the Lease lost its owner through the election's renewals")
	}
	// Deleted while the election runs (as the garbage collector does while the replicas
	// still stop), the Lease the election makes again is owned too.
	if err := leases.Delete(ctx, "fusebox-manager", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Lease made again, held and owned by the Deployment", owned)
	// The Deployment deleted while the replicas still run: the Lease they make again has an
	// owner that is gone, and the garbage collector deletes it once they stop.
	bg := metav1.DeletePropagationBackground
	if err := env.Client.AppsV1().Deployments(ns).Delete(context.Background(), d.Name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the replicas renew, or make the Lease again
	cancel()
	ctx = context.Background()
	eventually(t, "the garbage collector to delete the Lease", func() bool {
		_, err := leases.Get(ctx, "fusebox-manager", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func TestStartRefusesMissingOptions(t *testing.T) {
	if _, err := leader.Start(context.Background(), leader.Options{}); err == nil {
		t.Fatal("Start accepted empty options")
	}
}
