package kube

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// forbidPolicies answers every write of a CiliumNetworkPolicy with 403, as an API server
// would for a manager whose RBAC lacks the cilium.io rules; the rest reaches the API server.
type forbidPolicies struct{ next http.RoundTripper }

func (f forbidPolicies) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet || !strings.Contains(r.URL.Path, "/ciliumnetworkpolicies") {
		return f.next.RoundTrip(r)
	}
	body := `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,` +
		`"message":"ciliumnetworkpolicies.cilium.io is forbidden: User \"fusebox-manager\" cannot patch resource \"ciliumnetworkpolicies\""}`
	return &http.Response{StatusCode: http.StatusForbidden, Status: "403 Forbidden", Request: r,
		Header: http.Header{"Content-Type": []string{"application/json"}}, Body: io.NopCloser(bytes.NewBufferString(body))}, nil
}

func startManager(t *testing.T, a manager.Allocator, pool int, o manager.Options) *manager.Manager {
	t.Helper()
	o.Allocator, o.Estimator, o.Clock, o.Initializer = a, estimator.Fixed{N: pool}, manager.RealClock{}, memalloc.Initializer
	o.Metrics = manager.NewMetrics(prometheus.NewRegistry())
	if o.ReconcileInterval == 0 {
		o.ReconcileInterval = 20 * time.Millisecond
	}
	m, err := manager.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return m
}

// TestPolicyFailureIsNotHandedOut: when the per-sandbox CiliumNetworkPolicy cannot be
// applied, Allocate fails and every pod it claimed is destroyed.
func TestPolicyFailureIsNotHandedOut(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocatorWith(t, ns, "replica-a", nil, func(o *kubealloc.Options) {
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return forbidPolicies{rt} })
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		o.Dynamic = dyn
	})
	m := startManager(t, a, 4, manager.Options{AllocateWait: time.Minute})
	waitFor(t, func() bool { r, _ := a.Counts(manager.DefaultTemplate); return r >= 4 })
	ctx := testenv.Context(t, 2*time.Minute)
	key, _ := client.NewKey()
	_, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: []string{"api.example.com:443"}})
	if !errors.Is(err, manager.ErrAllocator) || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "egress") {
		t.Fatalf("Allocate = %v, want a failure naming the egress stage and the 403", err)
	}
	if f := m.Status().Failures; f == 0 {
		t.Error("no failure counted")
	}
	// Every pod that was claimed for it is deleted (the lease may have been written
	// concurrently with the policy, but its token never left the manager).
	waitFor(t, func() bool {
		pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if p.Annotations[kubealloc.AnnotationState] != kubealloc.StateReady && p.DeletionTimestamp == nil {
				return false
			}
		}
		return true
	})
	pols, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pols.Items) != 0 {
		t.Fatalf("policies %v, %v", pols, err)
	}
}

// TestNeverReadyPodIsDestroyedAndCounted: pods that never become Ready (no node runs them:
// no NodeName and no scheduler) are deleted after ReadyTimeout and counted as failures; no
// creation is counted.
func TestNeverReadyPodIsDestroyedAndCounted(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocatorWith(t, ns, "replica-a", nil, func(o *kubealloc.Options) {
		o.NodeName = ""
		o.ReadyTimeout = 500 * time.Millisecond
	})
	m := startManager(t, a, 1, manager.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	var seen []string
	waitFor(t, func() bool {
		pods, _ := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			if len(seen) == 0 || seen[len(seen)-1] != p.Name {
				seen = append(seen, p.Name)
			}
		}
		return m.Status().Failures >= 1 && len(seen) > 0
	})
	if c := m.Status().Creations; c != 0 {
		t.Errorf("%d creations counted for pods that never became ready", c)
	}
	// The first pod seen has failed by now (failures are counted after its delete).
	waitFor(t, func() bool {
		_, err := env.Client.CoreV1().Pods(ns).Get(ctx, seen[0], metav1.GetOptions{})
		return err != nil
	})
}
