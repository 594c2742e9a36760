package localsandbox

import (
	"slices"
	"testing"
)

func TestWithGODEBUG(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want []string
	}{
		{"none", nil, []string{"GODEBUG=a=1"}},
		{"others", []string{"PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=a=1"}},
		{"appended", []string{"GODEBUG=b=2", "PATH=/bin"}, []string{"GODEBUG=b=2,a=1", "PATH=/bin"}},
		{"empty", []string{"GODEBUG="}, []string{"GODEBUG=a=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.env)
			got := withGODEBUG(in, "a=1")
			if !slices.Equal(got, tc.want) {
				t.Errorf("withGODEBUG(%q) = %q, want %q", tc.env, got, tc.want)
			}
			if !slices.Equal(in, tc.env) {
				t.Errorf("withGODEBUG changed its argument to %q", in)
			}
		})
	}
}
