package dockerfile

import (
	"errors"
	"path"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ExpandOptions are the inputs of substitution other than the Dockerfile.
type ExpandOptions struct {
	// BuildArgs are the --build-arg values. Each overrides the default of the ARG
	// instructions that declare it; those that no ARG declares are listed in
	// Stage.UnusedBuildArgs (and are not used).
	BuildArgs map[string]string
	// BaseEnv is the base image's environment (its configuration's Env, KEY=VALUE), which
	// substitution after FROM sees, as in Docker. The base image is only known from
	// Stage.From, so a builder expands once without it to learn From, then again with it.
	BaseEnv []string
	// BaseWorkdir is the base image's working directory, to which a relative WORKDIR or
	// COPY destination is relative until a WORKDIR changes it; empty means /.
	BaseWorkdir string
}

// Stage is a Dockerfile after substitution: the base image and the steps to apply to it.
type Stage struct {
	// From is the base image reference, as written after substitution (the builder
	// resolves it; "scratch" is left for the builder to interpret).
	From string
	// FromLine is the line of the FROM instruction.
	FromLine int
	// Steps are the instructions after FROM, in order, except ARG.
	Steps []Step
	// UnusedBuildArgs are the names, sorted, of the build arguments that no ARG declares.
	UnusedBuildArgs []string
}

// Expand substitutes variables and returns the stage to build. Substitution applies to FROM
// (with the ARG values declared before it), to COPY and ADD (sources, destination, --chown,
// --chmod), ENV, LABEL, WORKDIR and USER, using the ARG values declared so far and the ENV
// values (the base image's, then the Dockerfile's) set so far, ENV winning over ARG of the
// same name. RUN is left alone: its shell expands variables itself. An ARG with neither a
// default nor a build argument is unset (it expands to the empty string).
//
// Errors are *Error values naming the line: a source that leaves the build context once
// substituted, an empty FROM or WORKDIR, a ${NAME:?message} of an unset NAME.
func (f *File) Expand(o ExpandOptions) (*Stage, error) {
	declared := map[string]bool{}
	var global vars
	for _, in := range f.globalArgs {
		for _, p := range in.pairs {
			declared[p.key] = true
			if v, ok := o.BuildArgs[p.key]; ok {
				global.set(p.key, v)
			} else if p.hasValue {
				v, err := f.expand(in.line, p.value, global.get)
				if err != nil {
					return nil, err
				}
				global.set(p.key, v)
			}
		}
	}
	from, err := f.expand(f.from.line, f.from.args[0], global.get)
	if err != nil {
		return nil, err
	}
	if from == "" {
		return nil, errorf(f.from.line, ErrSyntax, "FROM %s is empty once substituted", f.from.args[0])
	}
	st := &Stage{From: from, FromLine: f.from.line}

	var base, env, args vars
	for _, kv := range o.BaseEnv {
		k, v, _ := strings.Cut(kv, "=")
		base.set(k, v)
	}
	lookup := func(name string) (string, bool) {
		if v, ok := env.get(name); ok {
			return v, true
		}
		if v, ok := base.get(name); ok {
			return v, true
		}
		return args.get(name)
	}
	workdir := path.Join("/", o.BaseWorkdir)
	user := ""
	for _, in := range f.body {
		s := Step{Line: in.line, Kind: Kind(in.kind)}
		switch in.kind {
		case "ARG":
			for _, p := range in.pairs {
				declared[p.key] = true
				if v, ok := o.BuildArgs[p.key]; ok {
					args.set(p.key, v)
				} else if p.hasValue {
					v, err := f.expand(in.line, p.value, lookup)
					if err != nil {
						return nil, err
					}
					args.set(p.key, v)
				} else if v, ok := global.get(p.key); ok {
					args.set(p.key, v)
				}
			}
			continue
		case "RUN":
			if in.json {
				s.Argv = slices.Clone(in.args)
			} else {
				s.Shell = in.text
			}
		case "COPY", "ADD":
			if err := f.expandCopy(&s, in, workdir, lookup); err != nil {
				return nil, err
			}
		case "ENV", "LABEL":
			// Every value of one instruction sees the variables as they were before it.
			for _, p := range in.pairs {
				k, err := f.expand(in.line, p.key, lookup)
				if err != nil {
					return nil, err
				}
				v, err := f.expand(in.line, p.value, lookup)
				if err != nil {
					return nil, err
				}
				if k == "" {
					return nil, errorf(in.line, ErrSyntax, "%s: the name %s is empty once substituted", in.kind, p.key)
				}
				if in.kind == "ENV" && strings.Contains(k, "=") {
					return nil, errorf(in.line, ErrSyntax, "ENV: the name %q holds =", k)
				}
				s.Pairs = append(s.Pairs, KeyValue{Key: k, Value: v})
			}
			if in.kind == "ENV" {
				for _, kv := range s.Pairs {
					env.set(kv.Key, kv.Value)
				}
			}
		case "WORKDIR":
			d, err := f.expand(in.line, in.text, lookup)
			if err != nil {
				return nil, err
			}
			if d == "" {
				return nil, errorf(in.line, ErrSyntax, "WORKDIR %s is empty once substituted", in.text)
			}
			workdir = path.Join(workdir, d)
			if path.IsAbs(d) {
				workdir = path.Clean(d)
			}
		case "USER":
			u, err := f.expand(in.line, in.text, lookup)
			if err != nil {
				return nil, err
			}
			if u == "" {
				return nil, errorf(in.line, ErrSyntax, "USER %s is empty once substituted", in.text)
			}
			user = u
		}
		s.Workdir, s.User, s.Env, s.Args = workdir, user, env.list(), args.list()
		st.Steps = append(st.Steps, s)
	}
	for k := range o.BuildArgs {
		if !declared[k] {
			st.UnusedBuildArgs = append(st.UnusedBuildArgs, k)
		}
	}
	slices.Sort(st.UnusedBuildArgs)
	return st, nil
}

// expandCopy fills the COPY or ADD step s from in.
func (f *File) expandCopy(s *Step, in *instruction, workdir string, lookup func(string) (string, bool)) error {
	n := len(in.args) - 1
	for _, raw := range in.args[:n] {
		src, err := f.expand(in.line, raw, lookup)
		if err != nil {
			return err
		}
		if err := s.checkSource(src); err != nil {
			return err
		}
		s.Sources = append(s.Sources, path.Clean(src))
	}
	dest, err := f.expand(in.line, in.args[n], lookup)
	if err != nil {
		return err
	}
	if dest == "" {
		return errorf(in.line, ErrSyntax, "%s: the destination %s is empty once substituted", in.kind, in.args[n])
	}
	// As in Docker, a destination ending in / (or naming . or ..) is a directory to copy into.
	isDir := strings.HasSuffix(dest, "/") || dest == "." || dest == ".." ||
		strings.HasSuffix(dest, "/.") || strings.HasSuffix(dest, "/..")
	if len(s.Sources) > 1 && !isDir {
		return errorf(in.line, ErrSyntax, "%s with several sources needs a destination directory ending in /, not %s", in.kind, dest)
	}
	if path.IsAbs(dest) {
		s.Dest = path.Clean(dest)
	} else {
		s.Dest = path.Join(workdir, dest)
	}
	if isDir && s.Dest != "/" {
		s.Dest += "/"
	}
	if raw, ok := in.flags["chown"]; ok {
		c, err := f.expand(in.line, raw, lookup)
		if err != nil {
			return err
		}
		u, g, hasGroup := strings.Cut(c, ":")
		if u == "" || (hasGroup && g == "") {
			return errorf(in.line, ErrSyntax, "%s --chown=%s: want USER or USER:GROUP", in.kind, c)
		}
		s.Chown = c
	}
	if raw, ok := in.flags["chmod"]; ok {
		c, err := f.expand(in.line, raw, lookup)
		if err != nil {
			return err
		}
		m, err := s.parseChmod(c)
		if err != nil {
			return err
		}
		s.Chmod = &m
	}
	return nil
}

// expand substitutes variables in the word s of the instruction at line.
func (f *File) expand(line int, s string, lookup func(string) (string, bool)) (string, error) {
	v, _, err := expandWord(s, f.escape, lookup)
	if e := (*Error)(nil); errors.As(err, &e) {
		e.Line = line
	}
	if err != nil {
		return "", err
	}
	return v, nil
}

// vars is an ordered set of variables: a name keeps its first position when set again.
type vars struct {
	kv    []KeyValue
	index map[string]int
}

func (v *vars) set(k, val string) {
	if i, ok := v.index[k]; ok {
		v.kv[i].Value = val
		return
	}
	if v.index == nil {
		v.index = map[string]int{}
	}
	v.index[k] = len(v.kv)
	v.kv = append(v.kv, KeyValue{Key: k, Value: val})
}

func (v *vars) get(k string) (string, bool) {
	if i, ok := v.index[k]; ok {
		return v.kv[i].Value, true
	}
	return "", false
}

// list returns a copy of the variables, nil if there are none.
func (v *vars) list() []KeyValue { return slices.Clone(v.kv) }

// eof is what lexer.peek returns at the end of the text.
const eof = -1

// lexer substitutes variables in one word and removes its quotes and escape characters,
// following Docker's rules (a subset of the POSIX shell's): 'single quotes' keep everything,
// "double quotes" keep all but $ and escapes of " $ and the escape character, the escape
// character outside quotes keeps the next character, and $NAME, ${NAME}, ${NAME:-WORD},
// ${NAME-WORD}, ${NAME:+WORD}, ${NAME+WORD}, ${NAME:?MESSAGE} and ${NAME?MESSAGE} substitute.
type lexer struct {
	s      string
	pos    int
	esc    rune
	lookup func(string) (string, bool)
	used   bool // a variable was looked up
}

// expandWord substitutes the variables of s (lookup gives a variable's value and whether it
// is set) and removes its quotes and escapes. used reports whether s refers to a variable.
// Errors are *Error values with no line.
func expandWord(s string, esc rune, lookup func(string) (string, bool)) (v string, used bool, err error) {
	l := &lexer{s: s, esc: esc, lookup: lookup}
	v, err = l.word(eof)
	if err != nil {
		return "", l.used, err
	}
	return v, l.used, nil
}

func (l *lexer) peek() (rune, int) {
	if l.pos >= len(l.s) {
		return eof, 0
	}
	return utf8.DecodeRuneInString(l.s[l.pos:])
}

func (l *lexer) get(name string) (string, bool) {
	l.used = true
	return l.lookup(name)
}

// word processes the text up to stop (consumed), or to the end if stop is eof.
func (l *lexer) word(stop rune) (string, error) {
	var b strings.Builder
	for {
		r, n := l.peek()
		switch {
		case r == eof && stop != eof:
			return "", errorf(0, ErrSyntax, "missing '%c' in %s", stop, l.s)
		case r == eof:
			return b.String(), nil
		case r == stop:
			l.pos += n
			return b.String(), nil
		case r == '\'':
			v, err := l.single()
			if err != nil {
				return "", err
			}
			b.WriteString(v)
		case r == '"':
			v, err := l.double()
			if err != nil {
				return "", err
			}
			b.WriteString(v)
		case r == '$':
			v, err := l.dollar()
			if err != nil {
				return "", err
			}
			b.WriteString(v)
		case r == l.esc:
			l.pos += n
			if _, n := l.peek(); n > 0 { // an escape at the very end is dropped
				b.WriteString(l.s[l.pos : l.pos+n])
				l.pos += n
			}
		default:
			b.WriteString(l.s[l.pos : l.pos+n])
			l.pos += n
		}
	}
}

func (l *lexer) single() (string, error) {
	l.pos++
	i := strings.IndexByte(l.s[l.pos:], '\'')
	if i < 0 {
		return "", errorf(0, ErrSyntax, "missing closing single quote in %s", l.s)
	}
	v := l.s[l.pos : l.pos+i]
	l.pos += i + 1
	return v, nil
}

func (l *lexer) double() (string, error) {
	l.pos++
	var b strings.Builder
	for {
		r, n := l.peek()
		switch r {
		case eof:
			return "", errorf(0, ErrSyntax, "missing closing double quote in %s", l.s)
		case '"':
			l.pos += n
			return b.String(), nil
		case '$':
			v, err := l.dollar()
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			continue
		}
		l.pos += n
		if r == l.esc {
			// Only ", $ and the escape character itself can be escaped; elsewhere the
			// escape character is kept.
			if next, m := l.peek(); next == '"' || next == '$' || next == l.esc {
				b.WriteString(l.s[l.pos : l.pos+m])
				l.pos += m
				continue
			}
		}
		b.WriteString(l.s[l.pos-n : l.pos])
	}
}

// dollar substitutes the $... at the current position.
func (l *lexer) dollar() (string, error) {
	l.pos++
	r, n := l.peek()
	if r != '{' {
		name := l.name()
		if name == "" {
			return "$", nil
		}
		v, _ := l.get(name)
		return v, nil
	}
	l.pos += n
	switch r, _ := l.peek(); r {
	case eof:
		return "", errorf(0, ErrSyntax, "missing '}' in %s", l.s)
	case '{', '}', ':':
		return "", errorf(0, ErrSyntax, "bad substitution in %s", l.s)
	}
	name := l.name()
	if name == "" {
		return "", errorf(0, ErrSyntax, "bad substitution in %s", l.s)
	}
	r, n = l.peek()
	colon := false
	switch r {
	case eof:
		return "", errorf(0, ErrSyntax, "missing '}' in %s", l.s)
	case '}':
		l.pos += n
		v, _ := l.get(name)
		return v, nil
	case ':':
		colon = true
		l.pos += n
		r, n = l.peek()
	}
	if r != '-' && r != '+' && r != '?' {
		return "", errorf(0, ErrUnsupported, "unsupported substitution in %s: only ${NAME}, ${NAME:-WORD}, ${NAME-WORD}, ${NAME:+WORD}, ${NAME+WORD}, ${NAME:?MESSAGE} and ${NAME?MESSAGE} are supported", l.s)
	}
	l.pos += n
	word, err := l.word('}')
	if err != nil {
		return "", err
	}
	v, set := l.get(name)
	empty := !set || (colon && v == "")
	switch r {
	case '-':
		if empty {
			return word, nil
		}
		return v, nil
	case '+':
		if empty {
			return "", nil
		}
		return word, nil
	default: // '?'
		if empty {
			if word == "" {
				word = "not set"
			}
			return "", errorf(0, ErrVariable, "%s: %s", name, word)
		}
		return v, nil
	}
}

// name reads a variable name: letters, digits and _, or a run of digits (a positional
// parameter), or one of the shell's special parameters (which are never set here).
func (l *lexer) name() string {
	start := l.pos
	r, n := l.peek()
	switch {
	case r == eof:
		return ""
	case unicode.IsDigit(r):
		for unicode.IsDigit(r) {
			l.pos += n
			r, n = l.peek()
		}
		return l.s[start:l.pos]
	case strings.ContainsRune("@*#?-$!", r):
		l.pos += n
		return l.s[start:l.pos]
	}
	for r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) {
		l.pos += n
		r, n = l.peek()
	}
	return l.s[start:l.pos]
}
