package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// realNodeImage is the name the sandbox image is imported under on the benchmark's node.
const realNodeImage = "localhost/fusebox-bench/sandbox:v1"

// KubeRealNodeResult is the JSON `fusebox-bench allocate --allocator kube --real-node --json`
// prints.
type KubeRealNodeResult struct {
	Runs int `json:"runs"`
	// Allocation: the manager's Allocate (claim, policy, lease, real sFuse into the pod).
	AllocateP50Ms float64 `json:"allocate_p50_ms"`
	AllocateP99Ms float64 `json:"allocate_p99_ms"`
	// WithFirstCall adds a fresh pinned-TLS connection to the pod IP and a first Stat.
	WithFirstCallP50Ms     float64 `json:"allocate_with_first_call_p50_ms"`
	WithFirstCallP99Ms     float64 `json:"allocate_with_first_call_p99_ms"`
	APIWritesPerAllocation float64 `json:"api_writes_per_allocation"`
	Pool                   int     `json:"pool"`
	Note                   string  `json:"note"`
}

// KubeRealNodeAllocate starts a real single-node cluster (test/nodetest: kubelet, containerd
// and the gVisor shim, bridge CNI, kube-router) with the test sandbox image (sandboxBinary as
// its server), a manager on the kube allocator in this process with a warm pool of real gVisor
// pods, and measures warm allocations: Allocate (claim, per-sandbox policy, lease, and sFuse
// into the pod over its IP), then a fresh key-pinned TLS connection to the pod and a first
// call. Every allocation is released (its pod deleted) and the pool refilled before the next.
func KubeRealNodeAllocate(ctx context.Context, runs int, settle time.Duration, sandboxBinary string, log *slog.Logger) (*KubeRealNodeResult, error) {
	if runs <= 0 {
		runs = 30
	}
	if _, err := os.Stat(sandboxBinary); err != nil {
		return nil, fmt.Errorf("the sandbox image needs fusebox-sandbox: %w (make build, or --sandbox-binary)", err)
	}
	dir, err := os.MkdirTemp("", "fusebox-bench-node-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	log.Info("making the sandbox image (the userland is cached)")
	archive := filepath.Join(dir, "sandbox.tar")
	if err := nodetest.WriteSandboxImage(sandboxBinary, realNodeImage, archive); err != nil {
		return nil, err
	}
	log.Info("starting a real node (control plane, containerd + gVisor shim, kubelet, kube-router)")
	node, err := nodetest.Start(ctx, nodetest.Options{Images: []string{archive}})
	if err != nil {
		return nil, err
	}
	defer node.Stop()
	ns := fmt.Sprintf("bench-%d", time.Now().UnixNano()%1e6)
	if _, err := node.Env.Client.CoreV1().Namespaces().Create(ctx, nsObject(ns), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	counts, cs, dyn, err := countedClients(node.Env.Config)
	if err != nil {
		return nil, err
	}
	a, err := kubealloc.New(kubealloc.Options{Client: cs, Dynamic: dyn, Namespace: ns, Identity: "bench",
		Templates: map[string]kubealloc.Template{manager.DefaultTemplate: kubealloc.DefaultTemplate(realNodeImage)},
		Selectors: kubealloc.PolicySelectors{Agents: map[string]string{"app": "agent"}, AgentCIDRs: []string{nodetest.NodeIP + "/32"},
			Manager: map[string]string{"app": "fusebox-manager"}, ManagerNamespace: "fusebox"},
		Flavour:      sandboxnet.Kubernetes, // kube-router enforces plain NetworkPolicy
		NodeName:     nodetest.NodeName,
		ReadyTimeout: 3 * time.Minute})
	if err != nil {
		return nil, err
	}
	informers, stopInformers := context.WithCancel(ctx)
	defer func() { stopInformers(); a.Shutdown() }()
	if err := a.Start(informers); err != nil {
		return nil, err
	}
	// The node has two CPUs and each pod requests a quarter of one: a pool of four leaves room
	// for the replacement pods.
	const pool = 4
	m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: pool}, Clock: manager.RealClock{},
		Initializer: sfuse.Initialize, CreateConcurrency: 2, ReconcileInterval: 20 * time.Millisecond, AllocateWait: 3 * time.Minute})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	defer m.Close(context.WithoutCancel(ctx))
	settle = settleTime(settle)
	waitFull := func() error {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			if r, c := a.Counts(manager.DefaultTemplate); r >= pool && c == 0 {
				time.Sleep(settle)
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool of %d gVisor pods did not fill within 3 minutes\n%s", pool, node.Logs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	log.Info("warm allocations of real gVisor pods", "runs", runs, "pool", pool)
	var alloc, total []float64
	writes := 0
	for i := range runs {
		if err := waitFull(); err != nil {
			return nil, err
		}
		key, err := client.NewKey()
		if err != nil {
			return nil, err
		}
		before := counts.Snapshot()
		t0 := time.Now()
		al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey()})
		if err != nil {
			return nil, fmt.Errorf("allocation %d: %w", i, err)
		}
		t1 := time.Now()
		sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
		if err != nil {
			return nil, fmt.Errorf("allocation %d: dialing %s: %w", i, al.Endpoint, err)
		}
		if _, err := sb.Stat(ctx, ".", false); err != nil {
			sb.Close()
			return nil, fmt.Errorf("allocation %d: first call: %w", i, err)
		}
		t2 := time.Now()
		sb.Close()
		alloc = append(alloc, ms(t1.Sub(t0)))
		total = append(total, ms(t2.Sub(t0)))
		writes += kubealloc.Writes(kubealloc.Diff(before, counts.Snapshot()))
		if err := m.Release(ctx, al.ID, al.LeaseToken); err != nil {
			return nil, fmt.Errorf("releasing allocation %d: %w", i, err)
		}
	}
	return &KubeRealNodeResult{Runs: runs, Pool: pool,
		AllocateP50Ms: pct(alloc, 50), AllocateP99Ms: pct(alloc, 99),
		WithFirstCallP50Ms: pct(total, 50), WithFirstCallP99Ms: pct(total, 99),
		APIWritesPerAllocation: round(float64(writes) / float64(runs)),
		Note:                   fmt.Sprintf("real node: kubelet v1.37.2, containerd v2.4.2 + gVisor shim (systrap), bridge CNI, kube-router; control plane on loopback; the manager in the bench process (Allocate called directly, no manager gRPC); a fresh agent key and TLS connection per allocation; pool full and idle for %v before each", settle)}, nil
}
