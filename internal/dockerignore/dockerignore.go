// Package dockerignore reads a build context's .dockerignore as Docker's builder does
// (moby/patternmatcher), so that COPY and ADD leave out the same files:
//
//   - a line is a pattern; blank lines and lines starting with # are ignored, and surrounding
//     space is trimmed;
//   - a pattern is cleaned (path.Clean) and taken relative to the context's root (a leading /
//     is dropped);
//   - * matches any run of characters but /, ? one such character, [...] a class, \ escapes
//     the next character, and ** any number of directories (none included);
//   - a pattern matches a path or any of the path's parent directories, so that excluding a
//     directory excludes what is under it;
//   - a pattern starting with ! re-includes what it matches; the last pattern that matches a
//     path decides.
package dockerignore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// File is the name of the file in the context's root.
const File = ".dockerignore"

// pattern is one line.
type pattern struct {
	text      string
	re        *regexp.Regexp
	exclusion bool // a ! pattern: re-includes what it matches
}

// Matcher decides which context paths are left out. The nil Matcher leaves out nothing.
type Matcher struct {
	patterns   []pattern
	exceptions bool
}

// Read reads dir/.dockerignore; without one it returns nil, which leaves out nothing.
func Read(dir string) (*Matcher, error) {
	data, err := os.ReadFile(filepath.Join(dir, File))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", File, err)
	}
	return Parse(data)
}

// Parse reads the patterns of a .dockerignore file. A pattern that cannot be compiled is an
// error naming its line.
func Parse(data []byte) (*Matcher, error) {
	m := &Matcher{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p := pattern{}
		if strings.HasPrefix(line, "!") {
			p.exclusion, m.exceptions = true, true
			line = strings.TrimSpace(line[1:])
			if line == "" {
				continue
			}
		}
		line = path.Clean(line)
		if len(line) > 1 && line[0] == '/' {
			line = line[1:]
		}
		p.text = line
		re, err := compile(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: pattern %q: %w", File, n, line, err)
		}
		p.re = re
		m.patterns = append(m.patterns, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", File, err)
	}
	return m, nil
}

// compile turns a pattern into the regular expression Docker's matcher makes of it.
func compile(p string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	rs := []rune(p)
	for i := 0; i < len(rs); i++ {
		switch c := rs[i]; {
		case c == '*' && i+1 < len(rs) && rs[i+1] == '*':
			i++
			if i+1 < len(rs) && rs[i+1] == '/' {
				i++ // **/ is **
			}
			if i+1 == len(rs) {
				b.WriteString(".*")
			} else {
				b.WriteString("(.*/)?")
			}
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '\\':
			if i+1 == len(rs) {
				return nil, errors.New("ends with an escape")
			}
			i++
			b.WriteString(regexp.QuoteMeta(string(rs[i])))
		case strings.ContainsRune(`.+()|{}$`, c):
			b.WriteString(`\` + string(c))
		default:
			b.WriteRune(c) // character classes ([...], [^...]) pass through, as in Docker's
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// Excluded reports whether the context path rel (slash-separated, relative to the root) is
// left out.
func (m *Matcher) Excluded(rel string) bool {
	if m == nil {
		return false
	}
	rel = path.Clean(strings.TrimPrefix(rel, "/"))
	var parents []string
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		parents = append([]string{d}, parents...)
	}
	excluded := false
	for _, p := range m.patterns {
		match := p.re.MatchString(rel)
		for _, d := range parents {
			if match {
				break
			}
			match = p.re.MatchString(d)
		}
		if match {
			excluded = !p.exclusion
		}
	}
	return excluded
}

// Exceptions reports whether any pattern re-includes (!): a directory left out may then
// still hold something that is not.
func (m *Matcher) Exceptions() bool { return m != nil && m.exceptions }
