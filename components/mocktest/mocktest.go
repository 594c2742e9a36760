// Package mocktest runs Pulumi programs against recording mocks for unit tests of the
// components and of infra.Program: every registered resource is kept with its type token, name,
// parent URN and inputs.
package mocktest

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/internals"
)

// Resource is one registered resource as the mock monitor saw it.
type Resource struct {
	Type   string
	Name   string
	Parent string // parent URN; empty for resources parented to the stack
	Custom bool
	Deps   []string // URNs of the resources it depends on
	Inputs resource.PropertyMap
	// Timeouts are its customTimeouts (nil: the provider's defaults).
	Timeouts *Timeouts
}

// Timeouts are a resource's customTimeouts, as Pulumi durations ("20m").
type Timeouts struct {
	Create string `json:"create,omitempty"`
	Update string `json:"update,omitempty"`
	Delete string `json:"delete,omitempty"`
}

// Mocks records every resource registration. Safe for concurrent use.
type Mocks struct {
	mu        sync.Mutex // guards resources
	resources []Resource
}

var _ pulumi.MockResourceMonitor = (*Mocks)(nil)

// NewResource records args and returns its inputs as the resource's state.
func (m *Mocks) NewResource(args pulumi.MockResourceArgs) (string, resource.PropertyMap, error) {
	r := Resource{Type: args.TypeToken, Name: args.Name, Custom: args.Custom, Inputs: args.Inputs}
	if args.RegisterRPC != nil {
		r.Parent = args.RegisterRPC.GetParent()
		r.Deps = args.RegisterRPC.GetDependencies()
		if ct := args.RegisterRPC.GetCustomTimeouts(); ct != nil && ct.GetCreate()+ct.GetUpdate()+ct.GetDelete() != "" {
			r.Timeouts = &Timeouts{Create: ct.GetCreate(), Update: ct.GetUpdate(), Delete: ct.GetDelete()}
		}
	}
	m.mu.Lock()
	m.resources = append(m.resources, r)
	m.mu.Unlock()
	return args.Name + "-id", args.Inputs, nil
}

// Call returns its arguments: no component calls provider functions.
func (m *Mocks) Call(args pulumi.MockCallArgs) (resource.PropertyMap, error) {
	return args.Args, nil
}

// All returns every recorded resource.
func (m *Mocks) All() []Resource {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Resource(nil), m.resources...)
}

// ByType returns the recorded resources with type token typ.
func (m *Mocks) ByType(typ string) []Resource {
	var out []Resource
	for _, r := range m.All() {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

// One returns the only resource of type typ, failing the test if there is not exactly one.
func (m *Mocks) One(t testing.TB, typ string) Resource {
	t.Helper()
	rs := m.ByType(typ)
	if len(rs) != 1 {
		t.Fatalf("want exactly one %s, got %d", typ, len(rs))
	}
	return rs[0]
}

// Run runs fn with mocks under project "fusebox", stack "test", plus opts, and returns the
// recorder and fn's error.
func Run(fn pulumi.RunFunc, opts ...pulumi.RunOption) (*Mocks, error) {
	m := &Mocks{}
	all := append([]pulumi.RunOption{pulumi.WithMocks("fusebox", "test", m)}, opts...)
	err := pulumi.RunErr(fn, all...)
	return m, err
}

// MustRun is Run that fails the test on error.
func MustRun(t testing.TB, fn pulumi.RunFunc, opts ...pulumi.RunOption) *Mocks {
	t.Helper()
	m, err := Run(fn, opts...)
	if err != nil {
		t.Fatalf("pulumi program failed: %v", err)
	}
	return m
}

// WithConfig sets the program's configuration (keys like "fusebox:cloud"; objects as JSON).
func WithConfig(cfg map[string]string) pulumi.RunOption {
	return func(info *pulumi.RunInfo) { info.Config = cfg }
}

// AssertParented fails the test unless every recorded resource other than the component of
// type componentType itself has a parent URN that names componentType.
func (m *Mocks) AssertParented(t testing.TB, componentType string) {
	t.Helper()
	for _, r := range m.All() {
		if r.Type == componentType {
			continue
		}
		if !strings.Contains(r.Parent, componentType) {
			t.Errorf("%s %q: parent %q is not a %s", r.Type, r.Name, r.Parent, componentType)
		}
	}
}

// Props returns the resource's inputs as plain Go values (maps, slices, strings, float64, bool).
func (r Resource) Props() map[string]any {
	return r.Inputs.Mappable()
}

// Dig walks v by map keys (string) and slice indexes (int) and returns what it finds, or nil.
func Dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k < 0 || k >= len(s) {
				return nil
			}
			v = s[k]
		default:
			return nil
		}
	}
	return v
}

// Str is Dig for a string value ("" if absent).
func Str(v any, path ...any) string {
	s, _ := Dig(v, path...).(string)
	return s
}

// Await resolves o inside a running program (for checking a component's outputs).
func Await[T any](ctx *pulumi.Context, o pulumi.Output) (T, error) {
	var zero T
	r, err := internals.UnsafeAwaitOutput(ctx.Context(), o)
	if err != nil {
		return zero, err
	}
	v, ok := r.Value.(T)
	if !ok {
		return zero, fmt.Errorf("output is %T, not %T", r.Value, zero)
	}
	return v, nil
}
