package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/auth"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/memalloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

// gatedCreate is a memory allocator whose creations wait while its gate is shut.
type gatedCreate struct {
	*memalloc.Allocator
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (g *gatedCreate) shut() { g.mu.Lock(); g.gate = make(chan struct{}); g.mu.Unlock() }

func (g *gatedCreate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
}

func (g *gatedCreate) Create(ctx context.Context, id, template string) (manager.UnitInfo, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return manager.UnitInfo{}, ctx.Err()
		}
	}
	return g.Allocator.Create(ctx, id, template)
}

// TestSetAndRemoveTemplate: a template added while the manager runs gets its own pool and is
// allocated; a replacement with new content drains its ready units, destroys the one whose
// creation began before it, and refills, while a bound unit serves on; the same content
// changes nothing; a removal refuses its allocations and drains its pool, leaving its bound
// unit; the default template is not changed at run time.
func TestSetAndRemoveTemplate(t *testing.T) {
	a := memalloc.New()
	a.Templates = []string{"default", "node"}
	g := &gatedCreate{Allocator: a}
	c := newFakeClock(time.Unix(1_000_000, 0))
	m, err := manager.New(manager.Options{Allocator: g, Clock: c, Initializer: memalloc.Initializer,
		ReconcileInterval: 10 * time.Millisecond, AllocateWait: 5 * time.Second,
		Pools: []manager.TemplatePool{{Template: "default", Estimator: estimator.Fixed{N: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.open(); m.Close(context.Background()) })
	ctx := context.Background()
	key, _ := client.NewKey()
	allocate := func(tmpl string) (manager.Allocation, error) {
		return m.Allocate(ctx, manager.AllocateRequest{AgentPublicKey: key.PublicKey(), Template: tmpl})
	}
	ready := func(tmpl string) int { return m.States().Counts(tmpl)[manager.Ready] }
	templateOf := func(id string) string {
		for _, u := range m.List() {
			if u.Info.ID == id {
				return u.Info.Template
			}
		}
		return ""
	}
	if _, err := allocate("node"); !errors.Is(err, manager.ErrUnknownTemplate) {
		t.Fatalf("allocating a template not yet added: %v, want ErrUnknownTemplate", err)
	}

	ch, err := m.SetTemplate(ctx, manager.TemplatePool{Template: "node", Estimator: estimator.Fixed{N: 2}, Image: "img@sha256:1", Hash: "h1"})
	if err != nil || ch.Change != manager.TemplateAdded || ch.Drained != 0 {
		t.Fatalf("adding node: %+v, %v", ch, err)
	}
	stepping(t, "node's pool filled", c, 5*time.Millisecond, func() bool { return ready("node") == 2 })
	bound, err := allocate("node")
	if err != nil || templateOf(bound.ID) != "node" {
		t.Fatalf("allocating node: %v (unit of %q)", err, templateOf(bound.ID))
	}
	stepping(t, "node's pool refilled", c, 5*time.Millisecond, func() bool { return ready("node") == 2 })
	ps := m.Status().Pools
	if len(ps) != 2 || ps[1].Template != "node" || ps[1].Hash != "h1" || ps[1].Target != 2 || ps[1].Units["bound"] != 1 {
		t.Fatalf("status after the addition: %+v", ps)
	}

	// The same content with another pool size: the pool grows, keeping its units.
	stale := m.List()
	if ch, err := m.SetTemplate(ctx, manager.TemplatePool{Template: "node", Estimator: estimator.Fixed{N: 3}, Hash: "h1"}); err != nil || ch.Change != manager.TemplateUnchanged || ch.Bound != 1 || ch.Drained != 0 {
		t.Fatalf("setting node's same content: %+v, %v", ch, err)
	}
	stepping(t, "node's pool grown", c, 5*time.Millisecond, func() bool { return ready("node") == 3 })
	for _, u := range stale {
		if v, ok := m.States().Get(u.Info.ID); u.State == manager.Ready && (!ok || v.State != manager.Ready) {
			t.Errorf("unit %s left the pool when only its size changed", u.Info.ID)
		}
	}
	stale = m.List()

	// A creation that began before the replacement ends after it: its unit is destroyed.
	g.shut()
	taken, err := allocate("node")
	if err != nil {
		t.Fatal(err)
	}
	stepping(t, "a creation of node in flight", c, 5*time.Millisecond, func() bool {
		return m.States().Counts("node")[manager.Creating] > 0
	})
	for _, u := range m.List() {
		if u.Info.Template == "node" && u.State == manager.Creating {
			stale = append(stale, u)
		}
	}
	ch, err = m.SetTemplate(ctx, manager.TemplatePool{Template: "node", Estimator: estimator.Fixed{N: 1}, Image: "img@sha256:2", Hash: "h2"})
	if err != nil || ch.Change != manager.TemplateReplaced || ch.Drained != 2 || ch.Bound != 2 {
		t.Fatalf("replacing node: %+v, %v (want 2 drained, 2 bound)", ch, err)
	}
	g.open()
	stepping(t, "node's pool refilled with the new content", c, 5*time.Millisecond, func() bool {
		return ready("node") == 1 && m.States().Counts("node")[manager.Creating] == 0
	})
	for _, u := range m.List() {
		for _, old := range stale {
			if old.Info.Template == "node" && u.Info.ID == old.Info.ID && u.State == manager.Ready {
				t.Errorf("unit %s of node's first content (%s then) is ready", u.Info.ID, old.State)
			}
		}
	}
	if n := m.States().Counts("node")[manager.Bound]; n != 2 || templateOf(bound.ID) != "node" || templateOf(taken.ID) != "node" {
		t.Errorf("%d bound units of node after its replacement, want both", n)
	}
	if ps := m.Status().Pools; ps[1].Hash != "h2" || ps[1].Target != 1 {
		t.Errorf("status after the replacement: %+v", ps[1])
	}

	ch, err = m.RemoveTemplate(ctx, "node")
	if err != nil || ch.Change != manager.TemplateRemoved || ch.Drained != 1 || ch.Bound != 2 || ch.Hash != "h2" {
		t.Fatalf("removing node: %+v, %v", ch, err)
	}
	if _, err := allocate("node"); !errors.Is(err, manager.ErrUnknownTemplate) {
		t.Errorf("allocating a removed template: %v, want ErrUnknownTemplate", err)
	}
	stepping(t, "node's ready unit destroyed", c, 5*time.Millisecond, func() bool { return ready("node") == 0 })
	if ps := m.Status().Pools; len(ps) != 1 {
		t.Errorf("status after the removal: %+v", ps)
	}
	if _, err := m.Renew(ctx, bound.ID, bound.LeaseToken, 0); err != nil {
		t.Errorf("renewing a bound unit of a removed template: %v", err)
	}
	if err := m.Release(ctx, bound.ID, bound.LeaseToken); err != nil {
		t.Errorf("releasing a bound unit of a removed template: %v", err)
	}
	if _, err := m.RemoveTemplate(ctx, "node"); !errors.Is(err, manager.ErrUnknownTemplate) {
		t.Errorf("removing node twice: %v", err)
	}
	for _, name := range []string{"default", ""} {
		if _, err := m.RemoveTemplate(ctx, name); !errors.Is(err, manager.ErrInvalid) {
			t.Errorf("removing %q: %v, want ErrInvalid", name, err)
		}
		if _, err := m.SetTemplate(ctx, manager.TemplatePool{Template: name, Estimator: estimator.Fixed{}}); !errors.Is(err, manager.ErrInvalid) {
			t.Errorf("setting %q: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := allocate(""); err != nil {
		t.Errorf("the default template after the changes: %v", err)
	}
}

// fakeEditor records the templates files it is given.
type fakeEditor struct{ files [][]byte }

func (f *fakeEditor) AddTemplates(_ context.Context, file []byte) ([]manager.TemplateChange, error) {
	f.files = append(f.files, file)
	return []manager.TemplateChange{{Template: "node", Change: manager.TemplateAdded, Hash: "h", Image: "i"}}, nil
}

func (f *fakeEditor) RemoveTemplate(_ context.Context, name string) (manager.TemplateChange, error) {
	if name != "node" {
		return manager.TemplateChange{}, fmt.Errorf("%w: %q", manager.ErrUnknownTemplate, name)
	}
	return manager.TemplateChange{Template: name, Change: manager.TemplateRemoved, Drained: 2, Bound: 1}, nil
}

// TestTemplateRPCs: only operators change templates; a manager without an editor answers
// FAILED_PRECONDITION; an editor's changes and errors reach the caller with their codes.
func TestTemplateRPCs(t *testing.T) {
	m, err := manager.New(manager.Options{Allocator: memalloc.New(), Clock: newFakeClock(time.Unix(1_000_000, 0)),
		Initializer: memalloc.Initializer, Estimator: estimator.Fixed{}})
	if err != nil {
		t.Fatal(err)
	}
	ed := &fakeEditor{}
	ctx := context.Background()
	call := func(id auth.Identity, s *manager.Service) []error {
		cctx := auth.NewContext(ctx, id)
		_, addErr := s.AddTemplates(cctx, &managerv1.AddTemplatesRequest{Templates: []byte("templates: []")})
		_, rmErr := s.RemoveTemplate(cctx, &managerv1.RemoveTemplateRequest{Template: "node"})
		return []error{addErr, rmErr}
	}
	tenant := auth.LocalIdentity(1000, false)
	root := auth.LocalIdentity(0, true)
	for _, err := range call(tenant, &manager.Service{M: m, Templates: ed}) {
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("a tenant changing templates: %v, want PERMISSION_DENIED", err)
		}
	}
	if len(ed.files) != 0 {
		t.Fatal("a tenant's call reached the editor")
	}
	for _, err := range call(root, &manager.Service{M: m}) {
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "fixed") {
			t.Errorf("changing fixed templates: %v, want FAILED_PRECONDITION", err)
		}
	}
	s := &manager.Service{M: m, Templates: ed}
	add, err := s.AddTemplates(auth.NewContext(ctx, root), &managerv1.AddTemplatesRequest{Templates: []byte("file")})
	if err != nil || len(add.Changes) != 1 || add.Changes[0].Change != "added" || add.Changes[0].Image != "i" || string(ed.files[0]) != "file" {
		t.Errorf("AddTemplates: %v, %v", add, err)
	}
	rm, err := s.RemoveTemplate(auth.NewContext(ctx, root), &managerv1.RemoveTemplateRequest{Template: "node"})
	if err != nil || rm.Change.Change != "removed" || rm.Change.Drained != 2 || rm.Change.Bound != 1 {
		t.Errorf("RemoveTemplate: %v, %v", rm, err)
	}
	if _, err := s.RemoveTemplate(auth.NewContext(ctx, root), &managerv1.RemoveTemplateRequest{Template: "ruby"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("removing an unknown template: %v, want INVALID_ARGUMENT", err)
	}
}
