package mocktest

import (
	"slices"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest/golden"
)

// goldenResource is one recorded registration as the golden files hold it.
type goldenResource struct {
	Type     string         `json:"type"`
	Name     string         `json:"name"`
	Parent   string         `json:"parent,omitempty"`
	Custom   bool           `json:"custom"`
	Deps     []string       `json:"deps,omitempty"`
	Timeouts *Timeouts      `json:"timeouts,omitempty"`
	Inputs   map[string]any `json:"inputs"`
}

// Golden compares every resource m recorded (type token, name, parent URN, dependencies and
// inputs) with the JSON file at path, so that a change to what a program registers fails the
// test. Resources are sorted by type and name, and dependencies by URN: registration order is
// not part of the graph.
func (m *Mocks) Golden(t testing.TB, path string) {
	t.Helper()
	var out []goldenResource
	for _, r := range m.All() {
		deps := slices.Clone(r.Deps)
		slices.Sort(deps)
		out = append(out, goldenResource{Type: r.Type, Name: r.Name, Parent: r.Parent, Custom: r.Custom, Deps: deps, Timeouts: r.Timeouts, Inputs: r.Props()})
	}
	slices.SortFunc(out, func(a, b goldenResource) int {
		if c := strings.Compare(a.Type, b.Type); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	GoldenJSON(t, path, out)
}

// GoldenJSON is golden.JSON: v, as indented JSON, against the file at path.
func GoldenJSON(t testing.TB, path string, v any) {
	t.Helper()
	golden.JSON(t, path, v)
}
