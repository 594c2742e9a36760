package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	"github.com/fusebox-dev/fusebox/test/kubetest"
)

// KubeAllocateResult is the JSON `fusebox-bench allocate --allocator kube --json` prints.
type KubeAllocateResult struct {
	Runs                     int            `json:"runs"`
	AllocateP50Ms            float64        `json:"allocate_p50_ms"`
	AllocateP99Ms            float64        `json:"allocate_p99_ms"`
	APIWritesPerAllocation   float64        `json:"api_writes_per_allocation"`
	APIRequestsPerAllocation map[string]int `json:"api_requests_per_allocation_by_verb"`
	Note                     string         `json:"note"`
}

// KubeAllocate starts a loopback control plane (etcd, kube-apiserver, kwok), a manager on the
// kube allocator with a warm pool of pods, and measures warm allocations: claim, egress
// policy and lease written to the real API server. sFuse is the in-memory one (kwok's pods
// run no sandbox server), so the figure is the control plane and API cost of an allocation.
// settle is how long the full pool idles before each allocation (0: 100 ms; negative: none).
func KubeAllocate(ctx context.Context, runs int, settle time.Duration, log *slog.Logger) (*KubeAllocateResult, error) {
	if runs <= 0 {
		runs = 100
	}
	log.Info("starting a loopback control plane")
	env, err := kubetest.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	ns := fmt.Sprintf("bench-%d", time.Now().UnixNano()%1e6)
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, nsObject(ns), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	counts, cs, dyn, err := countedClients(env.Config)
	if err != nil {
		return nil, err
	}
	a, err := kubealloc.New(kubealloc.Options{Client: cs, Dynamic: dyn, Namespace: ns, Identity: "bench",
		Templates: map[string]kubealloc.Template{manager.DefaultTemplate: kubealloc.DefaultTemplate("registry.example/fusebox-sandbox:bench")},
		Selectors: kubealloc.PolicySelectors{Agents: map[string]string{"app": "agent"}, AgentNamespaces: []string{"agents"},
			Manager: map[string]string{"app": "fusebox-manager"}, ManagerNamespace: "fusebox-system"},
		NodeName: kubetest.NodeName, Endpoints: func(p *corev1.Pod) (string, string, error) { return "unix:///nonexistent", "unix:///nonexistent", nil }})
	if err != nil {
		return nil, err
	}
	informers, stopInformers := context.WithCancel(ctx)
	defer func() { stopInformers(); a.Shutdown() }() // Shutdown waits for Start's ctx to end
	if err := a.Start(informers); err != nil {
		return nil, err
	}
	const pool = 16
	m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: pool}, Clock: manager.RealClock{},
		Initializer: memalloc.Initializer, CreateConcurrency: 8, ReconcileInterval: 20 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		// A creation still waiting for its pod must not hold up the report.
		closed := make(chan struct{})
		go func() { m.Close(context.WithoutCancel(ctx)); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
		}
	}()
	key, err := client.NewKey()
	if err != nil {
		return nil, err
	}
	settle = settleTime(settle)
	waitFull := func() error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if r, c := a.Counts(manager.DefaultTemplate); r >= pool && c == 0 {
				// Idle, not only full: kwok's status patches and the informers' handling of
				// the replacement pod are over before the next allocation starts.
				time.Sleep(settle)
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool of pods did not fill")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	log.Info("warm allocations against the API server", "runs", runs)
	var lat []float64
	writes := 0
	verbs := map[string]int{}
	for range runs {
		if err := waitFull(); err != nil {
			return nil, err
		}
		before := counts.Snapshot()
		t0 := time.Now()
		if _, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: []string{"pypi.org:443"}}); err != nil {
			return nil, err
		}
		lat = append(lat, ms(time.Since(t0)))
		d := kubealloc.Diff(before, counts.Snapshot())
		writes += kubealloc.Writes(d)
		for k, v := range d {
			verbs[k] += v
		}
	}
	per := map[string]int{}
	for k, v := range verbs {
		per[k] = (v + runs/2) / runs
	}
	return &KubeAllocateResult{Runs: runs, AllocateP50Ms: pct(lat, 50), AllocateP99Ms: pct(lat, 99),
		APIWritesPerAllocation: round(float64(writes) / float64(runs)), APIRequestsPerAllocation: per,
		Note: fmt.Sprintf("kube-apiserver v1.37.2 + etcd + kwok + kube-controller-manager on loopback, real Cilium CRDs; pool full and idle for %v before each allocation; in-memory sFuse", settle)}, nil
}

// countedClients returns clients of cfg configured as the manager daemon configures its own
// (protobuf for pods, its rate limits), counting every request they make.
func countedClients(cfg *rest.Config) (*kubealloc.RequestCounts, kubernetes.Interface, dynamic.Interface, error) {
	counts := &kubealloc.RequestCounts{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return kubealloc.NewCountingTransport(counts, rt) })
	typedCfg, dynCfg := kubealloc.ClientConfigs(cfg, 0, 0)
	cs, err := kubernetes.NewForConfig(typedCfg)
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(dynCfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return counts, cs, dyn, nil
}

func nsObject(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
