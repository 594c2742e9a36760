package kube

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// countingClaims counts the manager's tries to take a pod (Claim, or Pick with the claim in
// ClaimBound); everything else is the allocator.
type countingClaims struct {
	*kubealloc.Allocator
	claims  atomic.Int32
	claimed atomic.Int64 // unix nanoseconds of the last successful claim
}

func (c *countingClaims) Pick(template string, skip func(string) bool) (manager.UnitInfo, error) {
	c.claims.Add(1)
	return c.Allocator.Pick(template, skip)
}

func (c *countingClaims) ClaimBound(ctx context.Context, u manager.UnitInfo, annotations map[string]string) error {
	err := c.Allocator.ClaimBound(ctx, u, annotations)
	if err == nil {
		c.claimed.Store(time.Now().UnixNano())
	}
	return err
}

func (c *countingClaims) Claim(ctx context.Context, template string) (manager.UnitInfo, error) {
	c.claims.Add(1)
	info, err := c.Allocator.Claim(ctx, template)
	if err == nil {
		c.claimed.Store(time.Now().UnixNano())
	}
	return info, err
}

// TestAllocateOnEmptyPoolWaitsForTheInformer: an Allocate on an empty pool asks for a pod
// and returns as soon as the informer sees it Ready. While it waits it makes no API request
// (no get or list, no writes beyond the allocation's own) and tries to take a pod only before waiting
// and after the notification: it does not poll.
func TestAllocateOnEmptyPoolWaitsForTheInformer(t *testing.T) {
	ns := env.Namespace(t)
	var counts kubealloc.RequestCounts
	a := &countingClaims{Allocator: newAllocator(t, ns, "replica-a", &counts)}
	ctx := testenv.Context(t, 2*time.Minute)

	// The test's own watch notes when the pod turns Ready.
	w, err := env.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	readyAt := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Modified && p.Status.Phase == corev1.PodRunning {
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						readyAt <- time.Now()
						return
					}
				}
			}
		}
	}()

	// A follower with an empty target: the only pod is the one the Allocate asks for. The
	// guard against a lost notification is longer than the test may run, so only the
	// informer's notification can wake the waiting Allocate.
	mgr := startManager(t, a, 0, manager.Options{IsLeader: func() bool { return false }, AllocateWait: 10 * time.Minute,
		MissedEventGuard: time.Hour})
	before := counts.Snapshot()
	key, _ := client.NewKey()
	start := time.Now()
	al, err := mgr.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: []string{"api.example.com:443"}})
	if err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	d := kubealloc.Diff(before, counts.Snapshot())
	var ready time.Time
	select {
	case ready = <-readyAt:
	case <-time.After(10 * time.Second):
		t.Fatal("the test's watch never saw the pod Ready")
	}
	claimed := time.Unix(0, a.claimed.Load())
	t.Logf("Allocate %s took %v; claimed %v after the pod turned Ready; requests %v; %d claims", al.ID, done.Sub(start), claimed.Sub(ready), d, a.claims.Load())
	if d["get"]+d["list"]+d["watch"] != 0 {
		t.Errorf("reads while waiting: %v", d)
	}
	// create (the pod it asked for), patch (claim and lease), patch (policy).
	if kubealloc.Writes(d) != 3 || d["create"] != 1 || d["patch"] != 2 {
		t.Errorf("writes %v, want create and two patches", d)
	}
	// One pick before waiting and one after the notification: the wait does not poll.
	if n := a.claims.Load(); n != 2 {
		t.Errorf("%d picks, want 2 (before waiting and after the notification)", n)
	}
}
