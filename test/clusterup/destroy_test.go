package clusterup

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fusebox-dev/fusebox/infra/deploy"
)

// destroyConfined runs `fusebox destroy` while it watches the sandbox namespace, and fails
// the test unless every sandbox pod was gone before the first of the namespace's network
// policies was deleted, and nothing of either is left. The order is read from the deletions'
// resourceVersions: one etcd's revisions, which order every write of this control plane
// (the two watches' events may arrive in either order).
func destroyConfined(ctx context.Context, t *testing.T, d *deployment) {
	t.Helper()
	c := node.Env.Client
	pods, err := c.CoreV1().Pods(d.sandboxNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pols, err := c.NetworkingV1().NetworkPolicies(d.sandboxNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 || len(pols.Items) == 0 {
		t.Fatalf("before destroy: %d sandbox pods and %d network policies, want some of each", len(pods.Items), len(pols.Items))
	}
	podWatch, err := c.CoreV1().Pods(d.sandboxNS).Watch(ctx, metav1.ListOptions{ResourceVersion: pods.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer podWatch.Stop()
	polWatch, err := c.NetworkingV1().NetworkPolicies(d.sandboxNS).Watch(ctx, metav1.ListOptions{ResourceVersion: pols.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer polWatch.Stop()

	podGone := map[string]uint64{} // pod name → the revision of its deletion; 0: still there
	for _, p := range pods.Items {
		podGone[p.Name] = 0
	}
	polGone := map[string]uint64{}
	for _, p := range pols.Items {
		polGone[p.Name] = 0
	}
	revision := func(o metav1.Object) uint64 {
		rv, err := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
		if err != nil {
			t.Fatalf("resourceVersion %q of %s: %v", o.GetResourceVersion(), o.GetName(), err)
		}
		return rv
	}
	record := func(ev watch.Event) {
		switch o := ev.Object.(type) {
		case *corev1.Pod:
			if ev.Type == watch.Deleted {
				podGone[o.Name] = revision(o)
			} else if _, seen := podGone[o.Name]; !seen {
				podGone[o.Name] = 0
			}
		case *networkingv1.NetworkPolicy:
			if ev.Type == watch.Deleted {
				polGone[o.Name] = revision(o)
			} else if _, seen := polGone[o.Name]; !seen {
				polGone[o.Name] = 0
			}
		case *metav1.Status:
			t.Fatalf("watching the sandbox namespace during destroy: %s", o.Message)
		}
	}

	d.progress.Reset()
	done := make(chan error, 1)
	go func() { _, err := deploy.Run(ctx, deploy.Destroy, d.opts); done <- err }()
	var settle <-chan time.Time // once destroy returned: the events of its last writes to come
	for watching := true; watching; {
		select {
		case ev, ok := <-podWatch.ResultChan():
			if !ok {
				t.Fatal("the watch of the sandbox pods ended during destroy")
			}
			record(ev)
		case ev, ok := <-polWatch.ResultChan():
			if !ok {
				t.Fatal("the watch of the network policies ended during destroy")
			}
			record(ev)
		case err := <-done:
			if err != nil {
				t.Fatalf("destroy: %v\n%s\n%s", err, d.progress.String(), clusterState(ctx))
			}
			settle = time.After(3 * time.Second)
		case <-settle:
			watching = false
		}
	}

	var lastPod, firstPolicy uint64
	var left []string
	for name, rv := range podGone {
		if rv == 0 {
			left = append(left, "pod "+name)
		}
		lastPod = max(lastPod, rv)
	}
	for name, rv := range polGone {
		if rv == 0 {
			left = append(left, "network policy "+name)
		} else if firstPolicy == 0 || rv < firstPolicy {
			firstPolicy = rv
		}
	}
	slices.Sort(left)
	if len(left) > 0 {
		t.Fatalf("destroy left in the sandbox namespace %s: %v", d.sandboxNS, left)
	}
	if lastPod > firstPolicy {
		t.Fatalf("destroy deleted a network policy (revision %d) before the last sandbox pod was gone (revision %d): pods %v, policies %v",
			firstPolicy, lastPod, podGone, polGone)
	}
	t.Logf("destroy: %d sandbox pods gone by revision %d, then %d network policies from revision %d", len(podGone), lastPod, len(polGone), firstPolicy)

	// The leader election's Lease goes with the managers' Deployment (the garbage collector).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		_, err := c.CoordinationV1().Leases(d.managerNS).Get(ctx, "fusebox-manager", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease fusebox-manager stays in %s after destroy (%v)", d.managerNS, err)
		}
	}
}
