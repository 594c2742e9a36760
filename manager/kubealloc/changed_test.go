package kubealloc

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/manager"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestChangedClosesWhenAPodTurnsClaimable(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	pods := f.cs.CoreV1().Pods(testNS)
	ch := f.a.Changed(manager.DefaultTemplate)
	other := f.a.Changed("other")
	if ch != f.a.Changed(manager.DefaultTemplate) {
		t.Fatal("two channels for one generation")
	}

	// Neither a pod still starting nor a Ready pod another replica has claimed is claimable.
	pending := readyPod("sb-1")
	pending.Status = corev1.PodStatus{Phase: corev1.PodPending}
	if _, err := pods.Create(ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	taken := readyPod("sb-2")
	taken.Annotations = map[string]string{AnnotationState: StateClaimed}
	if _, err := pods.Create(ctx, taken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if closedWithin(ch, 200*time.Millisecond) {
		t.Fatal("closed for a pod that cannot be claimed")
	}

	p, err := pods.Get(ctx, "sb-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	markReady(p)
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(ch, 10*time.Second) {
		t.Fatal("not closed after the pod became Ready")
	}
	// The woken claimer finds the pod in the cache.
	if info, err := f.a.Claim(ctx, manager.DefaultTemplate); err != nil || info.ID != "sb-1" {
		t.Fatalf("Claim after the notification = %+v, %v", info, err)
	}
	if isClosed(other) {
		t.Error("another template's channel was closed")
	}
	if isClosed(f.a.Changed(manager.DefaultTemplate)) {
		t.Error("the next generation's channel is already closed")
	}
}
