package manager

import (
	"slices"
	"sync"
)

// templateSet is the templates a manager serves, with the warm pool of each that has one, in
// the order they came: Options.Templates and Options.Pools at New, then SetTemplate and
// RemoveTemplate while the manager runs. Each template has a generation, new with every
// SetTemplate that replaces it: a unit whose creation began under an older generation (or
// whose template was removed meanwhile) is destroyed rather than pooled. Safe for concurrent
// use.
type templateSet struct {
	mu     sync.RWMutex // guards the fields below
	order  []string
	byName map[string]*templateEntry
	gens   uint64 // the last generation given
}

// templateEntry is one template: its pool (nil without one), the estimator's books, its
// allocation times and its generation. The pointers are never replaced: a replaced template
// gets a new entry.
type templateEntry struct {
	pool   *TemplatePool
	sizer  *sizer
	demand *demandLog
	gen    uint64
}

// newTemplateSet holds names, and pools (each of a template of names; checked by
// withDefaults).
func newTemplateSet(names []string, pools []TemplatePool) *templateSet {
	s := &templateSet{byName: map[string]*templateEntry{}}
	for _, n := range names {
		s.gens++
		s.order = append(s.order, n)
		s.byName[n] = &templateEntry{demand: &demandLog{}, gen: s.gens}
	}
	for _, p := range pools {
		e := s.byName[p.Template]
		e.pool, e.sizer = &p, &sizer{est: p.Estimator}
	}
	return s
}

// entry returns template name's entry, or nil when the manager does not serve it.
func (s *templateSet) entry(name string) *templateEntry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byName[name]
}

// known reports whether the manager serves template name.
func (s *templateSet) known(name string) bool { return s.entry(name) != nil }

// names returns the templates in their order.
func (s *templateSet) names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.order)
}

// pools returns the templates that have a warm pool, in order.
func (s *templateSet) pools() []TemplatePool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var ps []TemplatePool
	for _, n := range s.order {
		if e := s.byName[n]; e.pool != nil {
			ps = append(ps, *e.pool)
		}
	}
	return ps
}

// generation returns template name's generation, and false when it is not served.
func (s *templateSet) generation(name string) (uint64, bool) {
	if e := s.entry(name); e != nil {
		return e.gen, true
	}
	return 0, false
}

// put serves p's template with its pool under a new generation, after those served already,
// or in the place of the one of its name, and reports whether it replaced one. The
// template's allocation times carry over: demand for a name outlives a change of its content.
func (s *templateSet) put(p TemplatePool) (replaced bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gens++
	e := &templateEntry{pool: &p, sizer: &sizer{est: p.Estimator}, demand: &demandLog{}, gen: s.gens}
	if prev, ok := s.byName[p.Template]; ok {
		e.demand = prev.demand
		s.byName[p.Template] = e
		return true
	}
	s.order = append(s.order, p.Template)
	s.byName[p.Template] = e
	return false
}

// resize gives template name's pool p (the same content: its Hash) and its estimator,
// under the generation it has: its units stay what the pool serves.
func (s *templateSet) resize(p TemplatePool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.byName[p.Template]; ok {
		s.byName[p.Template] = &templateEntry{pool: &p, sizer: &sizer{est: p.Estimator}, demand: prev.demand, gen: prev.gen}
	}
}

// remove stops serving template name, and reports whether it was served.
func (s *templateSet) remove(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byName[name]; !ok {
		return false
	}
	delete(s.byName, name)
	s.order = slices.DeleteFunc(s.order, func(n string) bool { return n == name })
	return true
}
