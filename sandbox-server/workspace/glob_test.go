package workspace

import (
	"errors"
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern  string
		match    []string
		noMatch  []string
		below    []string // directories a walk must descend into
		notBelow []string
	}{
		{pattern: "*.go", match: []string{"a.go", ".x.go"}, noMatch: []string{"a/b.go", "a.txt"}, notBelow: []string{"a"}},
		{pattern: "**", match: []string{"a", "a/b/c"}, below: []string{".", "a", "a/b"}},
		{pattern: "**/*.go", match: []string{"a.go", "x/a.go", "x/y/z/a.go"}, noMatch: []string{"a.txt", "x/a.txt"}, below: []string{".", "x", "x/y"}},
		{pattern: "src/**/test/*.go", match: []string{"src/test/a.go", "src/x/y/test/a.go"}, noMatch: []string{"src/a.go", "test/a.go", "src/test/x/a.go"}, below: []string{"src", "src/x"}, notBelow: []string{"lib"}},
		{pattern: "a/**/**/b", match: []string{"a/b", "a/x/b", "a/x/y/b"}, noMatch: []string{"b", "a"}},
		{pattern: "a/**", match: []string{"a/x", "a/x/y"}, noMatch: []string{"b/x"}, below: []string{"a", "a/x"}, notBelow: []string{"b"}},
		{pattern: "?/[bc]d/\\*", match: []string{"a/bd/*", "z/cd/*"}, noMatch: []string{"ab/bd/*", "a/bd/x"}},
		{pattern: "x*y/*", match: []string{"xy/a", "x123y/b"}, noMatch: []string{"xy", "x/y/a"}, below: []string{"xzy"}, notBelow: []string{"xz"}},
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			g, err := compileGlob(tt.pattern)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tt.match {
				if !g.match(p) {
					t.Errorf("%q does not match %q", tt.pattern, p)
				}
			}
			for _, p := range tt.noMatch {
				if g.match(p) {
					t.Errorf("%q matches %q", tt.pattern, p)
				}
			}
			for _, p := range tt.below {
				if !g.mayMatchBelow(p) {
					t.Errorf("%q: would not descend into %q", tt.pattern, p)
				}
			}
			for _, p := range tt.notBelow {
				if g.mayMatchBelow(p) {
					t.Errorf("%q: would descend into %q", tt.pattern, p)
				}
			}
		})
	}
	for _, bad := range []string{"[", "a/[b", "a/b\\"} {
		if _, err := compileGlob(bad); !errors.Is(err, ErrInvalidPath) {
			t.Errorf("compileGlob(%q) = %v", bad, err)
		}
	}
	// Many "**" against a deep path stays linear.
	g, _ := compileGlob(strings.Repeat("**/", 50) + "z")
	if g.match(strings.Repeat("a/", 200) + "b") {
		t.Error("matched")
	}
}
