package kubealloc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
)

func TestServerEnded(t *testing.T) {
	terminated := func(code int32, reason string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, c := range []struct {
		name   string
		status corev1.PodStatus
		want   string
	}{
		{"running", corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: running}}}, ""},
		{"pending", corev1.PodStatus{Phase: corev1.PodPending}, ""},
		{"killed", corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: terminated(137, "Error")}}},
			"sandbox server exited: exit code 137 (Error)"},
		{"out of memory", corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: terminated(137, "OOMKilled")}}},
			"sandbox server exited: exit code 137 (OOMKilled)"},
		{"restarted", corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: running, RestartCount: 1,
				LastTerminationState: terminated(2, "Error")}}},
			"sandbox server restarted 1 times (it had exited: exit code 2 (Error))"},
		{"evicted", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."},
			"sandbox pod failed: Evicted: The node was low on resource: memory."},
		{"another container's end", corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "other", State: terminated(1, "Error")}, {Name: ContainerName, State: running}}}, ""},
	} {
		if got := serverEnded(&corev1.Pod{Status: c.status}); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	long := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Message: strings.Repeat("x", 10000)}}
	if got := serverEnded(long); len(got) > maxReason+50 {
		t.Errorf("a long message is kept whole: %d bytes", len(got))
	}
}

// TestBoundPodWhoseServerEndedIsFailed: a manager on the kube allocator (client-go's fake
// clientset) binds a pod; once the informer sees the pod's sandbox container terminated,
// the manager lists the unit failed with the reason, still to its owner, and refuses its
// renewal naming it; its release still destroys the pod. A ready pod that ends is not a
// failed unit (nobody holds it).
func TestBoundPodWhoseServerEndedIsFailed(t *testing.T) {
	bound := readyPod("sb-1")
	bound.ResourceVersion = "1" // as an API server sets it: Pick hands it to ClaimBound
	f := newFixture(t, nil, bound)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := manager.New(manager.Options{Allocator: f.a, Estimator: estimator.Fixed{N: 1}, Clock: manager.RealClock{},
		Initializer: memalloc.Initializer, IsLeader: func() bool { return false }, // no pool sizing, no expiry
		ReconcileInterval: 10 * time.Millisecond, AllocateWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	key, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Renew(ctx, al.ID, al.LeaseToken, 0); err != nil {
		t.Fatalf("Renew of a serving unit: %v", err)
	}
	unit := func() manager.Unit {
		for _, u := range m.List() {
			if u.Info.ID == al.ID {
				return u
			}
		}
		return manager.Unit{}
	}
	if u := unit(); u.State != manager.Bound || u.Err != "" {
		t.Fatalf("before the server ended: %s %q", u.State, u.Err)
	}

	pods := f.cs.CoreV1().Pods(testNS)
	p, err := pods.Get(ctx, al.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}}}
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	const reason = "exited: sandbox server exited: exit code 137 (Error)"
	deadline := time.Now().Add(10 * time.Second)
	u := unit()
	for u.State != manager.Failed && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		u = unit()
	}
	if u.State != manager.Failed || u.Err != reason || u.Lease == nil || u.Lease.Owner != "alice" {
		t.Fatalf("after the server ended: state %s, error %q, lease %+v; want failed with %q, still alice's", u.State, u.Err, u.Lease, reason)
	}
	if st := m.Status(); st.Units["failed"] != 1 || st.Units["bound"] != 0 {
		t.Errorf("pool status units %v, want the unit failed", st.Units)
	}
	_, err = m.Renew(ctx, al.ID, al.LeaseToken, 0)
	if !errors.Is(err, manager.ErrLeaseEnded) || !strings.Contains(err.Error(), "exit code 137 (Error)") {
		t.Fatalf("Renew of the failed unit = %v, want ErrLeaseEnded naming the exit", err)
	}
	if _, err := m.Renew(ctx, al.ID, "wrong", 0); !errors.Is(err, manager.ErrBadLeaseToken) {
		t.Fatalf("Renew with another token = %v, want ErrBadLeaseToken before anything is told", err)
	}

	// A warm pod that ends is not a failed unit: it holds no lease.
	warm := readyPod("sb-2")
	warm.Status.Phase = corev1.PodFailed
	warm.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
	if _, err := pods.Create(ctx, warm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := f.a.pods.Pods(testNS).Get("sb-2"); return err == nil })
	infos, err := f.a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if info.ID == "sb-2" && info.Annotations[manager.AnnotationFailed] != "" {
			t.Errorf("a warm pod that ended is reported failed: %v", info.Annotations)
		}
	}

	if err := m.Release(ctx, al.ID, al.LeaseToken); err != nil {
		t.Fatalf("Release of the failed unit: %v", err)
	}
	waitFor(t, func() bool { _, err := pods.Get(ctx, al.ID, metav1.GetOptions{}); return err != nil })
}

// waitFor polls ok for up to 10 seconds (the informer delivers the fake's changes
// asynchronously).
func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("not within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
