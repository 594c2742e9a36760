package kube

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// runscEndpoints maps each pod kwok runs to a real gVisor sandbox started on this machine, so
// that the whole Allocate -> sFuse -> exec path runs for real. The pod IPs kwok invents are
// never dialled.
type runscEndpoints struct {
	rt  *runsc.Runtime
	bin string
	dir string
	etc string

	mu    sync.Mutex // guards boxes, n
	boxes map[string]*localsandbox.Sandbox
	n     uint64
}

func (r *runscEndpoints) resolve(p *corev1.Pod) (string, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.boxes[p.Name]; ok {
		return sb.InitAddr, sb.DataAddr, nil
	}
	r.n++
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := localsandbox.Start(ctx, localsandbox.Options{Runtime: r.rt, ID: runsc.ID("kube", r.n),
		Dir: filepath.Join(r.dir, p.Name), SandboxBinary: r.bin,
		Bundle: runsc.BundleSpec{EtcDir: r.etc, MemoryLimitBytes: 1 << 30}})
	if err != nil {
		return "", "", err
	}
	r.boxes[p.Name] = sb
	return sb.InitAddr, sb.DataAddr, nil
}

// TestAllocateExecThroughKube: a manager on the kube allocator, each pod backed by a real
// runsc sandbox: Allocate (claim, egress policy, lease, sFuse) then a direct, pinned exec
// that shows gVisor's kernel, then Release deletes the pod.
func TestAllocateExecThroughKube(t *testing.T) {
	ns := env.Namespace(t)
	r := &runscEndpoints{rt: runsctest.Runtime(t), bin: sandboxtest.SandboxBinary(t), dir: t.TempDir(),
		etc: sandboxtest.EtcDir(t), boxes: map[string]*localsandbox.Sandbox{}}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, sb := range r.boxes {
			sb.Destroy(context.Background())
		}
	})
	a := newAllocatorWith(t, ns, "replica-a", nil, func(o *kubealloc.Options) { o.Endpoints = r.resolve })
	m, err := manager.New(manager.Options{Allocator: a, Estimator: estimator.Fixed{N: 1}, Clock: manager.RealClock{},
		Initializer: sfuse.Initialize, ReconcileInterval: 20 * time.Millisecond, AllocateWait: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 2*time.Minute)
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	key, _ := client.NewKey()
	al, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: []string{"pypi.org:443"}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := client.Dial(al.Endpoint, al.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Run(ctx, "uname", "-r")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "gvisor") {
		t.Fatalf("uname -r = %q, want gVisor's kernel", res.Stdout)
	}
	if err := m.Release(ctx, al.ID, al.LeaseToken); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := a.Lookup(ctx, al.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("released pod %s still there", al.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
