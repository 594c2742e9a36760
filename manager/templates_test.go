package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// brokenTemplate is a memory allocator whose creations of one template fail, as an image
// that cannot run the sandbox server does.
type brokenTemplate struct {
	*memalloc.Allocator
	broken string
}

func (b brokenTemplate) Create(ctx context.Context, id, template string) (manager.UnitInfo, error) {
	if template == b.broken {
		return manager.UnitInfo{}, errors.New("runsc create: the image has no /usr/local/bin/fusebox-sandbox")
	}
	return b.Allocator.Create(ctx, id, template)
}

// TestPoolsPerTemplate: each template's pool is sized by its own estimator and refilled on
// its own; an allocation of a template takes only that template's units; a template whose
// creations fail holds back its own pool alone, with its reason in the status.
func TestPoolsPerTemplate(t *testing.T) {
	a := memalloc.New()
	a.Templates = []string{"default", "python", "broken"}
	c := newFakeClock(time.Unix(1_000_000, 0))
	met := manager.NewMetrics(prometheus.NewRegistry())
	m, err := manager.New(manager.Options{Allocator: brokenTemplate{a, "broken"}, Clock: c,
		Initializer: memalloc.Initializer, Metrics: met, ReconcileInterval: 10 * time.Millisecond,
		AllocateWait: 5 * time.Second, Templates: a.Templates,
		Pools: []manager.TemplatePool{
			{Template: "default", Estimator: estimator.Fixed{N: 1}},
			{Template: "python", Estimator: estimator.Fixed{N: 2}},
			{Template: "broken", Estimator: estimator.Fixed{N: 1}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	ready := func(tmpl string) int { return m.States().Counts(tmpl)[manager.Ready] }
	creates := func(tmpl string) int {
		n := 0
		for _, call := range a.Calls() {
			if call.Method == "Create" && call.Arg == tmpl {
				n++
			}
		}
		return n
	}
	// The broken template's creations back off (0.5 s, 1 s, ...) on the fake clock; the
	// other pools fill regardless.
	stepping(t, "the default and python pools filled", c, 100*time.Millisecond, func() bool {
		return ready("default") == 1 && ready("python") == 2
	})
	byTemplate := map[string]manager.TemplateStatus{}
	for _, p := range m.Status().Pools {
		byTemplate[p.Template] = p
	}
	if p := byTemplate["broken"]; !strings.Contains(p.LastError, "has no /usr/local/bin/fusebox-sandbox") || p.Units["ready"] != 0 || p.LastErrorAt.IsZero() {
		t.Errorf("the broken template's pool: %+v, want its creation error and no ready unit", p)
	}
	if p := byTemplate["python"]; p.Target != 2 || p.Units["ready"] != 2 || p.LastError != "" || p.Estimator != "fixed" {
		t.Errorf("the python pool: %+v", p)
	}
	if got := testutil.ToFloat64(met.Target.WithLabelValues("python")); got != 2 {
		t.Errorf("python's target metric %v, want 2", got)
	}
	if got := testutil.ToFloat64(met.CreateFailures.WithLabelValues("broken")); got < 1 {
		t.Errorf("the broken template's creation failures metric %v, want at least 1", got)
	}
	if got := testutil.ToFloat64(met.CreateFailures.WithLabelValues("python")); got != 0 {
		t.Errorf("python's creation failures metric %v, want 0", got)
	}

	key, _ := client.NewKey()
	defaults := creates("default")
	al, err := m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Template: "python"})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range m.List() {
		if u.Info.ID == al.ID && u.Info.Template != "python" {
			t.Fatalf("a python allocation took a unit of %q", u.Info.Template)
		}
	}
	eventually(t, "the python pool refilled", func() bool { return ready("python") == 2 })
	if ready("default") != 1 || creates("default") != defaults {
		t.Errorf("the default pool changed with a python allocation: %d ready, %d creations (was %d)", ready("default"), creates("default"), defaults)
	}
	ps, err := rootService(m).PoolStatus(context.Background(), &managerv1.PoolStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps.Pools) != 3 || ps.Pools[1].Template != "python" || ps.Pools[1].Units["bound"] != 1 ||
		ps.Pools[2].LastError == "" || ps.Pools[2].LastErrorAt == nil || ps.Target != 4 {
		t.Errorf("PoolStatus pools %v, target %d", ps.Pools, ps.Target)
	}
	// An allocation of the broken template fails when its wait ends; the others are served.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Template: "broken"}); err == nil {
		t.Fatal("an allocation of the broken template succeeded")
	}
	if _, err := m.Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey()}); err != nil {
		t.Fatalf("the default template beside a broken one: %v", err)
	}
}

// TestPoolsChecked: a pool of an unknown template, two pools of one template, or one without
// an estimator are refused.
func TestPoolsChecked(t *testing.T) {
	for name, pools := range map[string][]manager.TemplatePool{
		"unknown":      {{Template: "ruby", Estimator: estimator.Fixed{}}},
		"twice":        {{Template: "default", Estimator: estimator.Fixed{}}, {Template: "default", Estimator: estimator.Fixed{}}},
		"no estimator": {{Template: "default"}},
	} {
		_, err := manager.New(manager.Options{Allocator: memalloc.New(), Clock: newFakeClock(time.Unix(0, 0)),
			Initializer: memalloc.Initializer, Pools: pools})
		if err == nil {
			t.Errorf("%s: New accepted pools %+v", name, pools)
		}
	}
}

// TestSharedPoolsPerTemplate: a shared pool's leader fills each template's pool to its own
// target, and a follower's allocation of a template takes a unit of that template.
func TestSharedPoolsPerTemplate(t *testing.T) {
	a, c, ms := replicasWith(t, 0, func(o *manager.Options) {
		o.Templates = []string{"default", "python"}
		if s := o.Allocator.(*memalloc.Shared); s.Templates == nil {
			s.Templates = o.Templates // before the first replica starts
		}
		o.Pools = []manager.TemplatePool{
			{Template: "default", Estimator: estimator.Fixed{N: 1}},
			{Template: "python", Estimator: estimator.Fixed{N: 3}},
		}
	})
	eventually(t, "both pools filled by the leader", func() bool {
		d, _ := a.Counts("default")
		p, _ := a.Counts("python")
		return d == 1 && p == 3
	})
	key, _ := client.NewKey()
	al, err := ms[1].Allocate(context.Background(), manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Template: "python"})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range ms[1].List() {
		if u.Info.ID == al.ID && u.Info.Template != "python" {
			t.Fatalf("a python allocation took a unit of %q", u.Info.Template)
		}
	}
	// The follower's allocation does not nudge the leader: its reconcile ticker refills.
	stepping(t, "the python pool refilled", c, 5*time.Millisecond, func() bool { p, _ := a.Counts("python"); return p == 3 })
	if d, _ := a.Counts("default"); d != 1 {
		t.Errorf("%d ready default units, want 1", d)
	}
	st := ms[0].Status()
	if len(st.Pools) != 2 || st.Pools[1].Target != 3 || st.Pools[1].Units["bound"] != 1 {
		t.Errorf("the leader's status pools %+v", st.Pools)
	}
}
