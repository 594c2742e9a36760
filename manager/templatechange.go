package manager

import (
	"context"
	"fmt"
)

// Changes SetTemplate and RemoveTemplate report (TemplateChange.Change).
const (
	TemplateAdded     = "added"
	TemplateReplaced  = "replaced"
	TemplateUnchanged = "unchanged"
	TemplateRemoved   = "removed"
)

// TemplateChange is what SetTemplate or RemoveTemplate did to one template.
type TemplateChange struct {
	Template string
	// Change is TemplateAdded, TemplateReplaced, TemplateUnchanged or TemplateRemoved.
	Change string
	// Image and Hash are the template's (TemplatePool's) after the change: before it for a
	// removal.
	Image, Hash string
	// Drained is how many of the template's ready units were destroyed; Bound how many of its
	// units are held by agents and serve on, as they were made, until their lease ends.
	Drained, Bound int
}

// SetTemplate serves p's template, with its warm pool, from now on: a template the manager
// did not serve is added; one of the same name is replaced unless its Hash is p's (then its
// units stay, and only its pool's estimator becomes p's). A replaced template's ready units
// are destroyed, and so is any unit whose creation began before the change, when it ends; its
// pool refills with units the allocator makes as the template now is; its bound units keep
// serving their agents. The allocator must
// already create p.Template as p describes it. The template of a request that names none
// (Options.PoolTemplate) is the manager's own and cannot be set. Only a manager that owns its
// pool changes templates while it runs: a shared pool's (several replicas') answers
// ErrUnsupported.
func (m *Manager) SetTemplate(ctx context.Context, p TemplatePool) (TemplateChange, error) {
	own, err := m.changeable(p.Template)
	if err != nil {
		return TemplateChange{}, err
	}
	if p.Estimator == nil {
		return TemplateChange{}, fmt.Errorf("%w: the pool of template %q has no estimator", ErrInvalid, p.Template)
	}
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	c := TemplateChange{Template: p.Template, Change: TemplateAdded, Image: p.Image, Hash: p.Hash}
	if e := m.templates.entry(p.Template); e != nil && e.pool != nil && p.Hash != "" && e.pool.Hash == p.Hash {
		// The same content: the pool keeps its units, and is sized by p's estimator.
		m.templates.resize(p)
		c.Change, c.Bound = TemplateUnchanged, m.ops.Counts(p.Template)[Bound]
		m.nudge()
		return c, nil
	}
	if m.templates.put(p) {
		c.Change = TemplateReplaced
		m.creations.forgetFailures(p.Template)
		c.Drained = own.drainTemplate(ctx, p.Template)
	}
	c.Bound = m.ops.Counts(p.Template)[Bound]
	m.log.Info("template "+c.Change, "template", p.Template, "image", p.Image, "hash", p.Hash, "drained", c.Drained, "bound", c.Bound)
	m.tally.publishCounts()
	m.nudge()
	return c, nil
}

// RemoveTemplate stops serving template name: allocations of it are refused as of an unknown
// template, its ready units are destroyed (and any still being created, when it ends), and
// its bound units serve on until their lease ends. The conditions are SetTemplate's.
func (m *Manager) RemoveTemplate(ctx context.Context, name string) (TemplateChange, error) {
	own, err := m.changeable(name)
	if err != nil {
		return TemplateChange{}, err
	}
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	e := m.templates.entry(name)
	if e == nil || !m.templates.remove(name) {
		return TemplateChange{}, fmt.Errorf("%w: %q (known: %v)", ErrUnknownTemplate, name, m.templates.names())
	}
	c := TemplateChange{Template: name, Change: TemplateRemoved}
	if e.pool != nil {
		c.Image, c.Hash = e.pool.Image, e.pool.Hash
	}
	m.creations.forgetFailures(name)
	c.Drained = own.drainTemplate(ctx, name)
	c.Bound = m.ops.Counts(name)[Bound]
	if m.tally.m != nil {
		m.tally.m.Target.DeleteLabelValues(name)
	}
	m.log.Info("template removed", "template", name, "drained", c.Drained, "bound", c.Bound)
	m.tally.publishCounts()
	return c, nil
}

// changeable returns the manager's own pool if template name may change while it runs.
func (m *Manager) changeable(name string) (ownedPool, error) {
	own, ok := m.pool.(ownedPool)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: templates change while the manager runs only with a pool of its own (the %s allocator's is shared by its replicas: change the deployment's templates)", ErrUnsupported, m.alloc.Name())
	case name == "":
		return nil, fmt.Errorf("%w: a template needs a name", ErrInvalid)
	case name == m.o.PoolTemplate:
		return nil, fmt.Errorf("%w: template %q is the manager's own (its sandbox image and flags), not one to change while it runs", ErrInvalid, name)
	}
	return own, nil
}
