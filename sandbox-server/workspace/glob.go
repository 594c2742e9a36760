package workspace

import (
	"fmt"
	"path"
	"strings"
)

// glob is a path pattern: segments separated by "/", each a path.Match pattern ("*", "?",
// "[...]", "\" escapes) matched against one path element, or "**", which matches any number of
// elements including none. Matching runs as an NFA over segment positions, so it is linear in
// the pattern times the path, whatever the number of "**".
type glob struct {
	segs []string
}

// hasMeta reports whether p contains glob syntax.
func hasMeta(p string) bool {
	return strings.ContainsAny(p, `*?[\`)
}

// compileGlob validates a clean relative pattern.
func compileGlob(pattern string) (*glob, error) {
	segs := strings.Split(pattern, "/")
	for _, s := range segs {
		if s == "**" {
			continue
		}
		if _, err := path.Match(s, ""); err != nil {
			return nil, fmt.Errorf("%w: glob %q: %w", ErrInvalidPath, short(pattern), err)
		}
	}
	return &glob{segs: segs}, nil
}

// literalPrefix returns the leading segments without glob syntax, joined ("." if none): the
// directory where a walk for this pattern starts.
func (g *glob) literalPrefix() string {
	n := 0
	for n < len(g.segs)-1 && !hasMeta(g.segs[n]) {
		n++
	}
	if n == 0 {
		return "."
	}
	return strings.Join(g.segs[:n], "/")
}

// states returns the set of pattern positions reachable after consuming the elements of rel
// ("." is no elements). Position i means segs[:i] matched; len(segs) is a full match.
func (g *glob) states(rel string) []bool {
	cur := make([]bool, len(g.segs)+1)
	cur[0] = true
	g.closure(cur)
	if rel == "." {
		return cur
	}
	next := make([]bool, len(cur))
	for elem := range strings.SplitSeq(rel, "/") {
		clear(next)
		live := false
		for i, ok := range cur[:len(g.segs)] {
			if !ok {
				continue
			}
			if s := g.segs[i]; s == "**" {
				next[i] = true
				live = true
			} else if m, _ := path.Match(s, elem); m {
				next[i+1] = true
				live = true
			}
		}
		if !live {
			clear(cur)
			return cur
		}
		g.closure(next)
		cur, next = next, cur
	}
	return cur
}

// closure adds the positions reachable by letting "**" match no element.
func (g *glob) closure(st []bool) {
	for i, s := range g.segs {
		if st[i] && s == "**" {
			st[i+1] = true
		}
	}
}

// match reports whether the relative path rel matches the whole pattern.
func (g *glob) match(rel string) bool {
	return g.states(rel)[len(g.segs)]
}

// mayMatchBelow reports whether some path below directory rel could match.
func (g *glob) mayMatchBelow(rel string) bool {
	st := g.states(rel)
	for _, ok := range st[:len(g.segs)] {
		if ok {
			return true
		}
	}
	return false
}

// matchBaseOrPath reports whether pattern g matches rel, or its base name when the pattern is a
// single segment (as in Grep's include and exclude).
func (g *glob) matchBaseOrPath(rel, base string) bool {
	if len(g.segs) == 1 && g.segs[0] != "**" {
		if m, _ := path.Match(g.segs[0], base); m {
			return true
		}
	}
	return g.match(rel)
}
