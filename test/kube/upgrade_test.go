package kube

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	"github.com/fusebox-dev/fusebox/test/testenv"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The sandbox image before and after an upgrade (a CVE fix).
const (
	oldImage = "registry.example/fusebox-sandbox:old"
	newImage = "registry.example/fusebox-sandbox:fixed"
)

// withImage makes an allocator's default template run image.
func withImage(image string) func(*kubealloc.Options) {
	return func(o *kubealloc.Options) {
		o.Templates = map[string]kubealloc.Template{manager.DefaultTemplate: kubealloc.DefaultTemplate(image)}
	}
}

// gone reports whether pod id is deleted or being deleted.
func gone(ctx context.Context, ns, id string) bool {
	p, err := env.Client.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
	return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
}

// TestDrainOutdatedAllocator: a replica started with a changed template (another image)
// neither counts nor hands out the old template's warm pods; its DrainOutdated deletes them
// (those made before a legacy hash label existed too) when they are older than the cut-off,
// and never a bound or claimed pod of the old template, whose leases run on. A bound pod
// carries Karpenter's do-not-disrupt; warm and claimed pods do not.
func TestDrainOutdatedAllocator(t *testing.T) {
	ns := env.Namespace(t)
	old := newAllocatorWith(t, ns, "replica-old", nil, withImage(oldImage))
	ctx := testenv.Context(t, 2*time.Minute)
	ids := createPool(t, old, "up", 4)
	// A pod made before template hashes: no hash label.
	legacy := ids[3]
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctx, legacy, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+kubealloc.LabelTemplateHash+`":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { r, _ := old.Counts(manager.DefaultTemplate); return r == 3 })
	// One pod bound with a lease, one claimed and not yet bound, one warm.
	u, err := old.Pick(manager.DefaultTemplate, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if err := old.ClaimBound(ctx, u, map[string]string{"fusebox.dev/owner": "agent"}); err != nil {
		t.Fatal(err)
	}
	bound := u.ID
	waitFor(t, func() bool { r, _ := old.Counts(manager.DefaultTemplate); return r == 2 })
	c, err := old.Claim(ctx, manager.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	claimed := c.ID
	var warm string
	for _, id := range ids[:3] {
		if id != bound && id != claimed {
			warm = id
		}
	}
	for id, want := range map[string]string{bound: "true", claimed: "", warm: "", legacy: ""} {
		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Annotations[kubealloc.AnnotationDoNotDisrupt]; got != want {
			t.Errorf("pod %s (state %s): %s = %q, want %q", id, p.Annotations[kubealloc.AnnotationState], kubealloc.AnnotationDoNotDisrupt, got, want)
		}
	}

	upgraded := newAllocatorWith(t, ns, "replica-new", nil, withImage(newImage))
	waitFor(t, func() bool { l, _ := upgraded.List(ctx); return len(l) == 4 })
	if r, c := upgraded.Counts(manager.DefaultTemplate); r != 0 || c != 0 {
		t.Errorf("the upgraded replica counts %d ready, %d creating of the old template", r, c)
	}
	if _, err := upgraded.Pick(manager.DefaultTemplate, func(string) bool { return false }); !errors.Is(err, kubealloc.ErrNoReady) {
		t.Errorf("the upgraded replica picked an old pod: %v", err)
	}
	if _, err := upgraded.Claim(ctx, manager.DefaultTemplate); !errors.Is(err, kubealloc.ErrNoReady) {
		t.Errorf("the upgraded replica claimed an old pod: %v", err)
	}
	// Pods made after the cut-off are left alone.
	first, _ := env.Client.CoreV1().Pods(ns).Get(ctx, ids[0], metav1.GetOptions{})
	if got, err := upgraded.DrainOutdated(ctx, first.CreationTimestamp.Add(-time.Minute)); err != nil || len(got) != 0 {
		t.Errorf("DrainOutdated before the pods were made = %v, %v; want nothing drained", got, err)
	}
	got, err := upgraded.DrainOutdated(ctx, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{warm, legacy}; !slices.Equal(got, want) {
		t.Errorf("drained %v, want the warm pods %v", got, want)
	}
	for _, id := range []string{warm, legacy} {
		if !gone(ctx, ns, id) {
			t.Errorf("warm pod %s of the old template not deleted", id)
		}
	}
	for _, id := range []string{bound, claimed} {
		if gone(ctx, ns, id) {
			t.Errorf("pod %s (bound or claimed) deleted", id)
		}
	}
	// The old replica still runs the old template and counts its own pods only; the new one
	// makes pods of its template and counts those.
	if _, err := upgraded.Create(ctx, "up-new", manager.DefaultTemplate); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { r, _ := upgraded.Counts(manager.DefaultTemplate); return r == 1 })
	waitFor(t, func() bool { r, _ := old.Counts(manager.DefaultTemplate); return r == 0 })
	p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "up-new", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Containers[0].Image != newImage {
		t.Errorf("new pod's image %s", p.Spec.Containers[0].Image)
	}
	// The old replica's DrainOutdated leaves the new template's pod made after its cut-off,
	// and never the bound and claimed pods.
	if got, err := old.DrainOutdated(ctx, p.CreationTimestamp.Time); err != nil || len(got) != 0 {
		t.Errorf("the old replica drained %v (%v)", got, err)
	}
}

// TestUpgradeReplacesWarmPodsKeepsBound: the upgrade of a manager to a new sandbox image (a
// CVE fix), over the real API server. The old leader filled the pool with old-image pods and
// an agent holds one; the old replica steps down and a new one, started with the new image,
// leads: it drains every warm old-image pod and refills the pool with new-image pods, hands out
// only those, while the bound old-image pod keeps its lease, renewable through the new
// replica, and its do-not-disrupt.
func TestUpgradeReplacesWarmPodsKeepsBound(t *testing.T) {
	ns := env.Namespace(t)
	ctx := testenv.Context(t, 4*time.Minute)
	// ClaimGrace also bounds how long a warm pod of another template made after the leader
	// took over waits before it is drained.
	start := func(a *kubealloc.Allocator, leading *atomic.Bool) *manager.Manager {
		m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: 3}, Clock: manager.RealClock{},
			Initializer: memalloc.Initializer, IsLeader: leading.Load, CreateConcurrency: 4, ClaimGrace: 5 * time.Second,
			ReconcileInterval: 20 * time.Millisecond, AllocateWait: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close(context.Background()) })
		return m
	}
	var oldLeads, newLeads atomic.Bool
	oldLeads.Store(true)
	oldAlloc := newAllocatorWith(t, ns, "replica-old", nil, withImage(oldImage))
	oldM := start(oldAlloc, &oldLeads)
	waitFor(t, func() bool { r, _ := oldAlloc.Counts(manager.DefaultTemplate); return r == 3 })
	key, _ := client.NewKey()
	held, err := oldM.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	imageOf := func(p *corev1.Pod) string { return p.Spec.Containers[0].Image }
	heldPod, err := env.Client.CoreV1().Pods(ns).Get(ctx, held.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if imageOf(heldPod) != oldImage || heldPod.Annotations[kubealloc.AnnotationDoNotDisrupt] != "true" {
		t.Fatalf("held pod: image %s, annotations %v", imageOf(heldPod), heldPod.Annotations)
	}
	waitFor(t, func() bool { r, _ := oldAlloc.Counts(manager.DefaultTemplate); return r == 3 })

	// The rollout: a replica with the new image starts and takes over the leadership.
	newAlloc := newAllocatorWith(t, ns, "replica-new", nil, withImage(newImage))
	newM := start(newAlloc, &newLeads)
	oldLeads.Store(false)
	newLeads.Store(true)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		warmNew, warmOld := 0, 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Annotations[kubealloc.AnnotationState] != kubealloc.StateReady {
				continue
			}
			if imageOf(&p) == newImage {
				warmNew++
			} else {
				warmOld++
			}
			if _, ok := p.Annotations[kubealloc.AnnotationDoNotDisrupt]; ok {
				t.Fatalf("warm pod %s carries %s", p.Name, kubealloc.AnnotationDoNotDisrupt)
			}
		}
		if warmOld == 0 && warmNew == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the upgrade: %d warm pods of the old image, %d of the new; want 0 and 3", warmOld, warmNew)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The bound pod of the old image lives on, with its lease, renewable through the new
	// replica, and still not to be disrupted.
	heldPod, err = env.Client.CoreV1().Pods(ns).Get(ctx, held.ID, metav1.GetOptions{})
	if err != nil || heldPod.DeletionTimestamp != nil {
		t.Fatalf("the held pod after the upgrade: %v (deleting: %v)", err, err == nil && heldPod.DeletionTimestamp != nil)
	}
	if heldPod.Annotations[kubealloc.AnnotationState] != kubealloc.StateBound || heldPod.Annotations[kubealloc.AnnotationDoNotDisrupt] != "true" {
		t.Errorf("the held pod's annotations %v", heldPod.Annotations)
	}
	if _, err := newM.Renew(ctx, held.ID, held.LeaseToken, 0); err != nil {
		t.Errorf("renewing the old-image sandbox through the upgraded replica: %v", err)
	}
	// The upgraded replica hands out new-image pods only.
	a, err := newM.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p, err := env.Client.CoreV1().Pods(ns).Get(ctx, a.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if imageOf(p) != newImage {
		t.Errorf("the upgraded replica handed out a pod of image %s", imageOf(p))
	}
	if err := newM.Release(ctx, held.ID, held.LeaseToken); err != nil {
		t.Errorf("releasing the old-image sandbox through the upgraded replica: %v", err)
	}
}

// claimBeforeDelete is a transport that, before it sends the first DELETE of pod name, claims
// that pod out of band (as a replica still running the old template would), so that the
// allocator's cached view of it is stale when its delete reaches the API server.
type claimBeforeDelete struct {
	rt   http.RoundTripper
	ns   string
	name string
	once sync.Once
	err  error
}

func (c *claimBeforeDelete) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/namespaces/"+c.ns+"/pods/"+c.name) {
		c.once.Do(func() {
			_, c.err = env.Client.CoreV1().Pods(c.ns).Patch(r.Context(), c.name, types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"`+kubealloc.AnnotationState+`":"`+kubealloc.StateClaimed+`","`+
					kubealloc.AnnotationClaimedBy+`":"replica-old"}}}`), metav1.PatchOptions{})
		})
	}
	return c.rt.RoundTrip(r)
}

// TestDrainOutdatedSparesAPodClaimedMeanwhile: a warm pod of the old template that an old
// replica claims after the upgraded replica's cache saw it warm is not deleted: the delete
// carries the cached resourceVersion as a precondition, and the API server refuses it.
func TestDrainOutdatedSparesAPodClaimedMeanwhile(t *testing.T) {
	ns := env.Namespace(t)
	old := newAllocatorWith(t, ns, "replica-old", nil, withImage(oldImage))
	ctx := testenv.Context(t, 2*time.Minute)
	ids := createPool(t, old, "race", 1)
	hook := &claimBeforeDelete{ns: ns, name: ids[0]}
	upgraded := newAllocatorWith(t, ns, "replica-new", nil, func(o *kubealloc.Options) {
		withImage(newImage)(o)
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { hook.rt = rt; return hook })
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		o.Client = cs
	})
	waitFor(t, func() bool { l, _ := upgraded.List(ctx); return len(l) == 1 })
	got, err := upgraded.DrainOutdated(ctx, time.Now().Add(time.Minute))
	if hook.err != nil {
		t.Fatalf("claiming the pod out of band: %v", hook.err)
	}
	if err != nil || len(got) != 0 {
		t.Errorf("DrainOutdated = %v, %v; want nothing drained and no error (a Conflict is passed over)", got, err)
	}
	p, err := env.Client.CoreV1().Pods(ns).Get(ctx, ids[0], metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the pod claimed meanwhile was deleted: %v", err)
	}
	if p.Annotations[kubealloc.AnnotationState] != kubealloc.StateClaimed {
		t.Errorf("pod state %q, want claimed", p.Annotations[kubealloc.AnnotationState])
	}
	// Once its cache shows the claim, the upgraded replica leaves the pod alone.
	waitFor(t, func() bool {
		l, _ := upgraded.List(ctx)
		return len(l) == 1 && l[0].Annotations[manager.AnnotationState] == "claimed"
	})
	if got, err := upgraded.DrainOutdated(ctx, time.Now().Add(time.Minute)); err != nil || len(got) != 0 {
		t.Errorf("DrainOutdated of a claimed pod = %v, %v", got, err)
	}
}
