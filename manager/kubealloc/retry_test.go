package kubealloc

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const testNS = "sandboxes"

var (
	podsGR  = schema.GroupResource{Resource: "pods"}
	podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

func unavailable() error { return apierrors.NewServiceUnavailable("etcd is restarting") }

func connRefused() error {
	return &url.Error{Op: "Put", URL: "https://127.0.0.1:6443/api/v1/pods", Err: &net.OpError{
		Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
}

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		name      string
		err       error
		transient bool
		delay     time.Duration
	}{
		{"503", unavailable(), true, 0},
		{"500", apierrors.NewInternalError(errors.New("boom")), true, 0},
		{"504 server timeout", apierrors.NewServerTimeout(podsGR, "create", 2), true, 2 * time.Second},
		{"timeout", apierrors.NewTimeoutError("request timed out", 0), true, 0},
		{"429 with Retry-After", apierrors.NewTooManyRequests("slow down", 3), true, 3 * time.Second},
		{"connection refused", connRefused(), true, 0},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true, 0},
		{"403", apierrors.NewForbidden(podsGR, "p", errors.New("rbac")), false, 0},
		{"404", apierrors.NewNotFound(podsGR, "p"), false, 0},
		{"409", apierrors.NewConflict(podsGR, "p", errors.New("changed")), false, 0},
		{"409 already exists", apierrors.NewAlreadyExists(podsGR, "p"), false, 0},
		{"422", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", nil), false, 0},
		{"400", apierrors.NewBadRequest("no"), false, 0},
		{"context canceled", context.Canceled, false, 0},
		{"nil", nil, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, ok := transient(c.err)
			if ok != c.transient || d != c.delay {
				t.Errorf("transient = %v, %v; want %v, %v", d, ok, c.transient, c.delay)
			}
		})
	}
}

// fixture is an allocator on client-go's fake clientsets, with its informer synced and its
// retry waits recorded instead of slept.
type fixture struct {
	a   *Allocator
	cs  *fake.Clientset
	dyn *dynamicfake.FakeDynamicClient

	mu     sync.Mutex // guards sleeps
	sleeps []time.Duration
}

func newFixture(t *testing.T, mut func(*Options), pods ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{
		cs:  fake.NewClientset(pods...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), policyListKinds),
	}
	o := Options{
		Client: f.cs, Dynamic: f.dyn, Namespace: testNS, Identity: "replica-a",
		Templates: map[string]Template{manager.DefaultTemplate: DefaultTemplate("img")},
		Selectors: testSelectors, NodeName: "node-0",
		Endpoints: func(*corev1.Pod) (string, string, error) { return "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", nil },
	}
	if mut != nil {
		mut(&o)
	}
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	a.retry.sleep = func(ctx context.Context, d time.Duration) error {
		f.mu.Lock()
		f.sleeps = append(f.sleeps, d)
		f.mu.Unlock()
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); a.Shutdown() })
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.a = a
	return f
}

func (f *fixture) waits() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}

// failFirst makes the first n calls of verb on resource fail with err(); later calls reach the
// fake's object tracker. It returns the number of calls seen.
func failFirst(c *k8stesting.Fake, verb, resource string, n int, err func() error) *atomic.Int32 {
	var calls atomic.Int32
	c.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) <= int32(n) {
			return true, nil, err()
		}
		return false, nil, nil
	})
	return &calls
}

func readyPod(name string) *corev1.Pod {
	p := BuildPod(PodSpec{ID: name, Namespace: testNS, TemplateName: manager.DefaultTemplate,
		Template: DefaultTemplate("img"), RuntimeClassName: "gvisor", Pool: DefaultNodePool(), NodeName: "node-0"})
	markReady(p)
	return p
}

func markReady(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = "10.0.0.7"
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

func getPod(t *testing.T, f *fixture, name string) (*corev1.Pod, error) {
	t.Helper()
	return f.cs.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
}

func TestClaimRetriesTransientErrors(t *testing.T) {
	for name, errf := range map[string]func() error{
		"503":                unavailable,
		"connection refused": connRefused,
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, nil, readyPod("warm-1"))
			calls := failFirst(&f.cs.Fake, "update", "pods", 2, errf)
			info, err := f.a.Claim(context.Background(), manager.DefaultTemplate)
			if err != nil {
				t.Fatalf("Claim after two transient errors: %v", err)
			}
			if info.ID != "warm-1" || calls.Load() != 3 || len(f.waits()) != 2 {
				t.Fatalf("claimed %q with %d updates and waits %v; want warm-1, 3 updates, 2 waits", info.ID, calls.Load(), f.waits())
			}
			p, _ := getPod(t, f, "warm-1")
			if podState(p) != StateClaimed || p.Annotations[AnnotationClaimedBy] != "replica-a" {
				t.Fatalf("pod not claimed: %v %v", p.Labels, p.Annotations)
			}
		})
	}
}

func TestClaimForbiddenIsNotRetried(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	calls := failFirst(&f.cs.Fake, "update", "pods", 100, func() error {
		return apierrors.NewForbidden(podsGR, "warm-1", errors.New(`User "fusebox-manager" cannot update resource "pods"`))
	})
	_, err := f.a.Claim(context.Background(), manager.DefaultTemplate)
	if !errors.Is(err, manager.ErrAllocator) || !apierrors.IsForbidden(err) {
		t.Fatalf("Claim = %v, want ErrAllocator wrapping Forbidden", err)
	}
	if !strings.Contains(err.Error(), "claiming pod sandboxes/warm-1") {
		t.Errorf("error %q does not say what was done to which pod", err)
	}
	if calls.Load() != 1 || len(f.waits()) != 0 {
		t.Errorf("%d updates, waits %v: a 403 was retried", calls.Load(), f.waits())
	}
}

func TestRetryGivesUp(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	calls := failFirst(&f.cs.Fake, "update", "pods", 100, unavailable)
	_, err := f.a.Claim(context.Background(), manager.DefaultTemplate)
	steps := DefaultBackoff().Steps
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "giving up after 6 attempts") {
		t.Fatalf("Claim = %v, want the 503 after %d attempts", err, steps)
	}
	if int(calls.Load()) != steps {
		t.Errorf("%d attempts, want %d", calls.Load(), steps)
	}
	w := f.waits()
	for i := 1; i < len(w); i++ {
		if w[i] > DefaultBackoff().Max {
			t.Errorf("wait %v over the maximum", w[i])
		}
	}
	if w[len(w)-1] < w[0] {
		t.Errorf("waits %v do not grow", w)
	}
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	calls := failFirst(&f.cs.Fake, "delete", "pods", 1, func() error { return apierrors.NewTooManyRequests("slow down", 3) })
	if err := f.a.Destroy(context.Background(), "warm-1"); err != nil {
		t.Fatal(err)
	}
	if w := f.waits(); calls.Load() != 2 || len(w) != 1 || w[0] < 3*time.Second {
		t.Fatalf("%d deletes, waits %v; want 2 deletes and one wait of at least the server's 3 s", calls.Load(), w)
	}
	if _, err := getPod(t, f, "warm-1"); !apierrors.IsNotFound(err) {
		t.Fatalf("pod still there: %v", err)
	}
}

func TestRetryStopsAtDeadline(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	failFirst(&f.cs.Fake, "delete", "pods", 100, func() error { return apierrors.NewTooManyRequests("slow down", 60) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.a.Destroy(ctx, "warm-1")
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "deadline") || !strings.Contains(err.Error(), "deleting pod sandboxes/warm-1") {
		t.Fatalf("Destroy = %v, want the 429, given up before a wait past the deadline", err)
	}
	if len(f.waits()) != 0 {
		t.Errorf("waited %v", f.waits())
	}
}

// A claim whose response was lost (the update was applied, the client saw a timeout) meets
// a Conflict on its next attempt: reading the pod back shows this replica's claim, which is
// taken, not abandoned.
func TestClaimRecognisesItsOwnLostWrite(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	var calls atomic.Int32
	f.cs.PrependReactor("update", "pods", func(act k8stesting.Action) (bool, runtime.Object, error) {
		switch calls.Add(1) {
		case 1:
			if _, _, err := k8stesting.ObjectReaction(f.cs.Tracker())(act); err != nil {
				t.Error(err)
			}
			return true, nil, apierrors.NewServerTimeout(podsGR, "update", 0)
		default: // the resourceVersion has moved on: the real API server's answer
			return true, nil, apierrors.NewConflict(podsGR, "warm-1", errors.New("the object has been modified"))
		}
	})
	info, err := f.a.Claim(context.Background(), manager.DefaultTemplate)
	if err != nil || info.ID != "warm-1" {
		t.Fatalf("Claim = %+v, %v; want warm-1", info, err)
	}
	if f.a.ClaimConflicts() != 0 {
		t.Errorf("own write counted as %d lost races", f.a.ClaimConflicts())
	}
}

// The same sequence, but the conflicting write is another replica's claim: the pod is left
// to it.
func TestClaimConflictAfterRetryMovesOn(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	var calls atomic.Int32
	f.cs.PrependReactor("update", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) == 1 {
			// The tracker directly: the fake clientset holds its lock while reactors run.
			o, err := f.cs.Tracker().Get(podsGVR, testNS, "warm-1")
			if err != nil {
				t.Error(err)
				return true, nil, unavailable()
			}
			p := o.(*corev1.Pod).DeepCopy()
			p.Annotations = map[string]string{AnnotationState: StateClaimed, AnnotationClaimedBy: "replica-b"}
			if err := f.cs.Tracker().Update(podsGVR, p, testNS); err != nil {
				t.Error(err)
			}
			return true, nil, unavailable()
		}
		return true, nil, apierrors.NewConflict(podsGR, "warm-1", errors.New("the object has been modified"))
	})
	_, err := f.a.Claim(context.Background(), manager.DefaultTemplate)
	if !errors.Is(err, manager.ErrNoReadyUnit) {
		t.Fatalf("Claim = %v, want ErrNoReadyUnit (the only pod went to replica-b)", err)
	}
	if f.a.ClaimConflicts() != 1 {
		t.Errorf("ClaimConflicts = %d, want 1", f.a.ClaimConflicts())
	}
}

// makeReadyWhenCreated plays the kubelet: the pod it waits for is marked Running and Ready.
func makeReadyWhenCreated(t *testing.T, f *fixture, name string) {
	go func() {
		for range 500 {
			p, err := getPod(t, f, name)
			if err == nil {
				markReady(p)
				if _, err := f.cs.CoreV1().Pods(testNS).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
					t.Error(err)
				}
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

func TestCreateAdoptsPodFromLostAttempt(t *testing.T) {
	f := newFixture(t, nil)
	var calls atomic.Int32
	f.cs.PrependReactor("create", "pods", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) == 1 {
			if _, _, err := k8stesting.ObjectReaction(f.cs.Tracker())(act); err != nil {
				t.Error(err)
			}
			return true, nil, apierrors.NewTimeoutError("request timed out", 0)
		}
		return false, nil, nil // the tracker answers AlreadyExists
	})
	makeReadyWhenCreated(t, f, "sb-1")
	info, err := f.a.Create(context.Background(), "sb-1", manager.DefaultTemplate)
	if err != nil || info.ID != "sb-1" {
		t.Fatalf("Create = %+v, %v", info, err)
	}
	if calls.Load() != 2 {
		t.Errorf("%d creates, want 2", calls.Load())
	}
}

func TestCreateLeavesSomeoneElsesPodAlone(t *testing.T) {
	other := readyPod("sb-1")
	other.Annotations = map[string]string{AnnotationCreateNonce: "someone-else"}
	f := newFixture(t, nil, other)
	failFirst(&f.cs.Fake, "create", "pods", 1, unavailable)
	_, err := f.a.Create(context.Background(), "sb-1", manager.DefaultTemplate)
	if !apierrors.IsAlreadyExists(err) || !errors.Is(err, manager.ErrAllocator) || !strings.Contains(err.Error(), "creating pod sandboxes/sb-1") {
		t.Fatalf("Create = %v, want AlreadyExists wrapped with the pod's name", err)
	}
	if _, err := getPod(t, f, "sb-1"); err != nil {
		t.Fatalf("someone else's pod was deleted: %v", err)
	}
}

// A pod that never becomes Ready is deleted (the delete retried through transient errors)
// and Create fails.
func TestCreateNeverReadyDeletesPod(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.ReadyTimeout = 200 * time.Millisecond })
	deletes := failFirst(&f.cs.Fake, "delete", "pods", 2, unavailable)
	_, err := f.a.Create(context.Background(), "sb-1", manager.DefaultTemplate)
	if !errors.Is(err, manager.ErrAllocator) || !strings.Contains(err.Error(), "not ready within") || !strings.Contains(err.Error(), "sb-1") {
		t.Fatalf("Create = %v, want a readiness timeout naming the pod", err)
	}
	if _, err := getPod(t, f, "sb-1"); !apierrors.IsNotFound(err) {
		t.Fatalf("pod that never became ready still exists: %v", err)
	}
	if deletes.Load() != 3 {
		t.Errorf("%d deletes, want 3 (two 503s, then success)", deletes.Load())
	}
}

func TestBindEgress(t *testing.T) {
	t.Run("503 twice then applied", func(t *testing.T) {
		f := newFixture(t, nil, readyPod("sb-1"))
		var calls atomic.Int32
		f.dyn.PrependReactor("patch", "ciliumnetworkpolicies", func(act k8stesting.Action) (bool, runtime.Object, error) {
			if calls.Add(1) <= 2 {
				return true, nil, unavailable()
			}
			return true, nil, nil // applied; the fake cannot apply CRDs itself
		})
		if err := f.a.BindEgress(context.Background(), "sb-1", []string{"api.example.com:443"}); err != nil {
			t.Fatal(err)
		}
		if calls.Load() != 3 {
			t.Errorf("%d applies, want 3", calls.Load())
		}
	})
	t.Run("403 is not retried", func(t *testing.T) {
		f := newFixture(t, nil, readyPod("sb-1"))
		var calls atomic.Int32
		f.dyn.PrependReactor("patch", "ciliumnetworkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
			calls.Add(1)
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "cilium.io", Resource: "ciliumnetworkpolicies"}, "fusebox-sandbox-sb-1", errors.New("rbac"))
		})
		err := f.a.BindEgress(context.Background(), "sb-1", []string{"api.example.com:443"})
		if !errors.Is(err, manager.ErrAllocator) || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "for pod sb-1") {
			t.Fatalf("BindEgress = %v, want a Forbidden naming the pod", err)
		}
		if calls.Load() != 1 {
			t.Errorf("%d applies, want 1", calls.Load())
		}
	})
}

func TestAnnotateRecognisesItsOwnLostWrite(t *testing.T) {
	// A pod in state ready that this replica did not Claim: Annotate takes it with a
	// resourceVersion-guarded patch, whose response is lost.
	f := newFixture(t, nil, readyPod("sb-1"))
	var calls atomic.Int32
	f.cs.PrependReactor("patch", "pods", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) == 1 {
			if _, _, err := k8stesting.ObjectReaction(f.cs.Tracker())(act); err != nil {
				t.Error(err)
			}
			return true, nil, unavailable()
		}
		return true, nil, apierrors.NewConflict(podsGR, "sb-1", errors.New("the object has been modified"))
	})
	ann := map[string]string{"fusebox.dev/lease": "x"}
	if err := f.a.Annotate(context.Background(), "sb-1", ann); err != nil {
		t.Fatalf("Annotate = %v", err)
	}
	// Someone else's write in between: the Conflict stands.
	f2 := newFixture(t, nil, readyPod("sb-2"))
	f2.cs.PrependReactor("patch", "pods", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) == 3 {
			return true, nil, unavailable()
		}
		return true, nil, apierrors.NewConflict(podsGR, "sb-2", errors.New("the object has been modified"))
	})
	if err := f2.a.Annotate(context.Background(), "sb-2", ann); !errors.Is(err, manager.ErrBadTransition) {
		t.Fatalf("Annotate = %v, want ErrBadTransition", err)
	}
}

func TestAnnotateRenewsPodBoundElsewhereBehindTheCache(t *testing.T) {
	// The cache still shows sb-1 ready; on the API server replica-b has bound it, and an
	// agent renews its lease through replica-a. The guarded patch conflicts; Annotate reads
	// the pod back and writes the lease unguarded, leaving replica-b's claim.
	f := newFixture(t, nil, readyPod("sb-1"))
	var calls atomic.Int32
	f.cs.PrependReactor("patch", "pods", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) > 1 {
			return false, nil, nil
		}
		o, err := f.cs.Tracker().Get(podsGVR, testNS, "sb-1")
		if err != nil {
			t.Error(err)
			return true, nil, err
		}
		p := o.(*corev1.Pod)
		p.Annotations[AnnotationState] = StateBound
		p.Annotations[AnnotationClaimedBy] = "replica-b"
		p.Annotations["fusebox.dev/lease"] = "old"
		if err := f.cs.Tracker().Update(podsGVR, p, testNS); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(podsGR, "sb-1", errors.New("the object has been modified"))
	})
	if err := f.a.Annotate(context.Background(), "sb-1", map[string]string{"fusebox.dev/lease": "new"}); err != nil {
		t.Fatalf("Annotate = %v", err)
	}
	p, err := getPod(t, f, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Annotations["fusebox.dev/lease"]; got != "new" {
		t.Errorf("lease annotation %q, want new", got)
	}
	if got := p.Annotations[AnnotationClaimedBy]; got != "replica-b" {
		t.Errorf("claimed by %q, want replica-b (the binder's claim stays)", got)
	}
	if calls.Load() != 2 {
		t.Errorf("%d patches, want 2", calls.Load())
	}
	// A pod another replica claimed and has not bound stays refused after the read-back.
	f2 := newFixture(t, nil, readyPod("sb-2"))
	f2.cs.PrependReactor("patch", "pods", func(act k8stesting.Action) (bool, runtime.Object, error) {
		o, err := f2.cs.Tracker().Get(podsGVR, testNS, "sb-2")
		if err != nil {
			t.Error(err)
			return true, nil, err
		}
		p := o.(*corev1.Pod)
		p.Annotations[AnnotationState] = StateClaimed
		p.Annotations[AnnotationClaimedBy] = "replica-b"
		if err := f2.cs.Tracker().Update(podsGVR, p, testNS); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(podsGR, "sb-2", errors.New("the object has been modified"))
	})
	err = f2.a.Annotate(context.Background(), "sb-2", map[string]string{"fusebox.dev/lease": "new"})
	if !errors.Is(err, manager.ErrBadTransition) || !strings.Contains(err.Error(), "replica-b") {
		t.Fatalf("Annotate = %v, want ErrBadTransition naming replica-b", err)
	}
}

func TestCheckDefaultDenyRetries(t *testing.T) {
	dd, err := DefaultDenyPolicy(sandboxnet.Cilium, testNS)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{CiliumNetworkPolicyGVR: "CiliumNetworkPolicyList"}, dd)
	calls := failFirst(&dyn.Fake, "get", "ciliumnetworkpolicies", 2, unavailable)
	r := newRetrier(Backoff{Initial: time.Millisecond, Steps: 3})
	if err := checkDefaultDeny(context.Background(), r, dyn, testNS, sandboxnet.Cilium); err != nil {
		t.Fatalf("after two 503s: %v", err)
	}
	if calls.Load() != 3 {
		t.Errorf("%d gets, want 3", calls.Load())
	}
	failFirst(&dyn.Fake, "get", "ciliumnetworkpolicies", 1, func() error {
		return apierrors.NewForbidden(schema.GroupResource{Group: "cilium.io", Resource: "ciliumnetworkpolicies"}, DefaultDenyName, errors.New("rbac"))
	})
	if err := checkDefaultDeny(context.Background(), r, dyn, testNS, sandboxnet.Cilium); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "reading CiliumNetworkPolicy sandboxes/"+DefaultDenyName) {
		t.Fatalf("403: %v", err)
	}
}

// An allocation (Claim, then Annotate) changes no label of the pod: network policy selects
// pods by their labels, and a change makes the network plugin recompute its rules.
func TestAllocationLeavesLabelsAlone(t *testing.T) {
	f := newFixture(t, nil, readyPod("warm-1"))
	before, err := getPod(t, f, "warm-1")
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.a.Claim(context.Background(), manager.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.a.Annotate(context.Background(), info.ID, map[string]string{"fusebox.dev/lease": "x"}); err != nil {
		t.Fatal(err)
	}
	p, err := getPod(t, f, "warm-1")
	if err != nil {
		t.Fatal(err)
	}
	if podState(p) != StateBound || p.Annotations["fusebox.dev/lease"] != "x" {
		t.Fatalf("pod after Claim and Annotate: state %q, annotations %v", podState(p), p.Annotations)
	}
	if !maps.Equal(p.Labels, before.Labels) {
		t.Fatalf("labels changed from %v to %v", before.Labels, p.Labels)
	}
}

// A pod made before the state became an annotation carries it as a label: it is read there.
func TestLegacyStateLabelIsRead(t *testing.T) {
	p := readyPod("old-1")
	delete(p.Annotations, AnnotationState)
	p.Labels[legacyLabelState] = StateClaimed
	if got := podState(p); got != StateClaimed {
		t.Fatalf("podState = %q, want %q", got, StateClaimed)
	}
	f := newFixture(t, nil, p)
	if _, err := f.a.Claim(context.Background(), manager.DefaultTemplate); !errors.Is(err, ErrNoReady) {
		t.Fatalf("Claim of a pod claimed by its legacy label = %v, want ErrNoReady", err)
	}
}
