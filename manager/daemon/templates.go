package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/fusebox-dev/fusebox/internal/jsonfile"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/estimator"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// servedTemplatesFile, in the state directory, holds the templates a runsc manager serves
// (a templates file, as JSON): written at start and at each change, read at a start without
// --templates, so that templates added or removed while the manager ran outlive it.
const servedTemplatesFile = "templates.json"

// templatesAtStart returns the templates a runsc manager on c.StateDir started without
// --templates serves: those the last manager on the state directory served. (Given, the
// file's replace them.)
func templatesAtStart(c Config, log *slog.Logger) ([]templates.Spec, error) {
	path := filepath.Join(c.StateDir, servedTemplatesFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the templates served before: %w", err)
	}
	specs, err := templates.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (remove it, or start with --templates FILE)", path, err)
	}
	if len(specs) > 0 {
		log.Info("serving the templates served before (fusebox template add|remove; --templates FILE replaces them)", "file", path, "templates", len(specs))
	}
	return specs, nil
}

// saveTemplates records specs as the templates served (servedTemplatesFile).
func saveTemplates(stateDir string, specs []templates.Spec) error {
	if specs == nil {
		specs = []templates.Spec{}
	}
	return jsonfile.Write(filepath.Join(stateDir, servedTemplatesFile), templates.File{Templates: specs})
}

// templateEditor changes a running runsc manager's templates (manager.TemplateEditor): it
// makes each template of a file the allocator's and gives it a pool in the manager, and keeps
// the set served in the state directory. One change at a time.
type templateEditor struct {
	mu       sync.Mutex // guards specs; held through a change
	specs    []templates.Spec
	alloc    *runscalloc.Allocator
	m        *manager.Manager
	base     runscalloc.Limits // the default template's limits: what a spec leaves out
	stateDir string
}

var _ manager.TemplateEditor = (*templateEditor)(nil)

// prepared is a template of an AddTemplates call, ready to be served.
type prepared struct {
	spec templates.Spec
	t    runscalloc.Template // zero when its content is served already
	est  estimator.Estimator
	same bool // its content is served already
}

// AddTemplates serves the templates of file: each image is read and unpacked first, then the
// set is saved, and only then served, so that a bad template or a failed save changes nothing.
func (e *templateEditor) AddTemplates(ctx context.Context, file []byte) ([]manager.TemplateChange, error) {
	specs, err := templates.Parse(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", manager.ErrInvalid, err)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: the file lists no template", manager.ErrInvalid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	next := slices.Clone(e.specs)
	var ready []prepared
	for _, s := range specs {
		p := prepared{spec: s}
		name, lo, hi := s.Pool.Sizes()
		if p.est, err = estimator.New(name, lo, hi); err != nil {
			return nil, fmt.Errorf("%w: template %s: %v", manager.ErrInvalid, s.Name, err)
		}
		if i := slices.IndexFunc(next, func(c templates.Spec) bool { return c.Name == s.Name }); i >= 0 {
			p.same = next[i].Hash() == s.Hash()
			next[i] = s
		} else {
			next = append(next, s)
		}
		if !p.same {
			if p.t, err = e.prepare(ctx, s); err != nil {
				return nil, err
			}
		}
		ready = append(ready, p)
	}
	if err := templates.Validate(next, "templates"); err != nil {
		return nil, fmt.Errorf("%w: the templates served with these: %v", manager.ErrInvalid, err)
	}
	if err := saveTemplates(e.stateDir, next); err != nil {
		return nil, err
	}
	e.specs = next
	var changes []manager.TemplateChange
	for _, p := range ready {
		if !p.same {
			e.alloc.SetTemplate(p.spec.Name, p.t)
		}
		c, err := e.m.SetTemplate(ctx, manager.TemplatePool{Template: p.spec.Name, Estimator: p.est, Image: p.spec.Image, Hash: p.spec.Hash()})
		if err != nil { // the names were checked: not expected
			return changes, fmt.Errorf("serving template %s: %w", p.spec.Name, err)
		}
		changes = append(changes, c)
	}
	return changes, nil
}

// prepare makes s the allocator's template, its image read, checked and unpacked.
func (e *templateEditor) prepare(ctx context.Context, s templates.Spec) (runscalloc.Template, error) {
	t, err := runscalloc.FromSpec(s, e.base)
	if err == nil {
		t, err = e.alloc.PrepareTemplate(ctx, s.Name, t)
	}
	if err != nil {
		if ctx.Err() != nil {
			return runscalloc.Template{}, ctx.Err()
		}
		return runscalloc.Template{}, fmt.Errorf("%w: %v", manager.ErrInvalid, err)
	}
	return t, nil
}

// RemoveTemplate stops serving template name, saving the set without it first.
func (e *templateEditor) RemoveTemplate(ctx context.Context, name string) (manager.TemplateChange, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if name == manager.DefaultTemplate {
		return manager.TemplateChange{}, fmt.Errorf("%w: %q is the manager's own template (its sandbox image and flags), which is always served", manager.ErrInvalid, name)
	}
	i := slices.IndexFunc(e.specs, func(s templates.Spec) bool { return s.Name == name })
	if i < 0 {
		names := []string{manager.DefaultTemplate}
		for _, s := range e.specs {
			names = append(names, s.Name)
		}
		return manager.TemplateChange{}, fmt.Errorf("%w: %q (the manager serves %v)", manager.ErrUnknownTemplate, name, names)
	}
	next := slices.Delete(slices.Clone(e.specs), i, i+1)
	if err := saveTemplates(e.stateDir, next); err != nil {
		return manager.TemplateChange{}, err
	}
	e.specs = next
	c, err := e.m.RemoveTemplate(ctx, name)
	e.alloc.RemoveTemplate(name) // after the manager: no allocation of it is left to serve
	return c, err
}
