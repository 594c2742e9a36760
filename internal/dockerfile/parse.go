package dockerfile

import (
	"encoding/json"
	"errors"
	"path"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// logicalLine is an instruction's text with its continuation lines joined, and the line
// where it starts.
type logicalLine struct {
	line int
	text string
}

// directivePattern matches a parser directive line such as "# escape=`".
var directivePattern = regexp.MustCompile(`^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$`)

// directives tracks the parser directives, which only the lines before the first
// instruction, comment or blank line can give.
type directives struct {
	escape rune
	done   bool
	seen   map[string]bool
}

// check reads line (left-trimmed) as a possible parser directive.
func (d *directives) check(line string, n int) error {
	if d.done {
		return nil
	}
	m := directivePattern.FindStringSubmatch(line)
	if m == nil {
		d.done = true
		return nil
	}
	name := strings.ToLower(m[1])
	switch name {
	case "escape", "syntax", "check":
	default:
		// An unknown directive is a comment, and ends the directives.
		d.done = true
		return nil
	}
	if d.seen[name] {
		return errorf(n, ErrSyntax, "only one %s parser directive can be used", name)
	}
	d.seen[name] = true
	if name == "escape" {
		if m[2] != `\` && m[2] != "`" {
			return errorf(n, ErrSyntax, "invalid escape character %q: want \\ or `", m[2])
		}
		d.escape = rune(m[2][0])
	}
	return nil
}

// trimContinuation removes a trailing escape character (and the blanks after it) from line
// and reports whether there was one, that is whether the next line continues this one. An
// escaped escape character ("\\") at the end is not a continuation.
func (d *directives) trimContinuation(line string) (string, bool) {
	s := strings.TrimRight(line, " \t")
	esc := string(d.escape)
	if !strings.HasSuffix(s, esc) {
		return line, false
	}
	body := s[:len(s)-len(esc)]
	if body != "" && strings.HasSuffix(body, esc) {
		return line, false
	}
	return body, true
}

// logicalLines splits data into instructions: comments and blank lines dropped, parser
// directives applied, continuation lines joined (without separator, as Docker does; comment
// and blank lines inside a continuation are skipped). It returns the escape character.
func logicalLines(data []byte) ([]logicalLine, rune, error) {
	phys := strings.Split(string(data), "\n")
	d := directives{escape: '\\', seen: map[string]bool{}}
	var out []logicalLine
	for i := 0; i < len(phys); {
		n := i + 1
		tok := strings.TrimLeftFunc(strings.TrimSuffix(phys[i], "\r"), unicode.IsSpace)
		i++
		if err := d.check(tok, n); err != nil {
			return nil, 0, err
		}
		if strings.HasPrefix(tok, "#") {
			continue
		}
		text, more := d.trimContinuation(tok)
		if !more && text == "" {
			continue
		}
		for more && i < len(phys) {
			raw := strings.TrimSuffix(phys[i], "\r")
			i++
			if t := strings.TrimLeftFunc(raw, unicode.IsSpace); t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			var part string
			part, more = d.trimContinuation(raw)
			text += part
		}
		out = append(out, logicalLine{line: n, text: text})
	}
	return out, d.escape, nil
}

// instruction is one parsed instruction, before substitution.
type instruction struct {
	line  int
	kind  string            // the instruction word, upper-case
	flags map[string]string // --name=value flags (COPY and ADD)
	args  []string          // FROM: the image; COPY, ADD: sources then destination; RUN: argv
	json  bool              // RUN, COPY, ADD in JSON form
	text  string            // RUN shell form, WORKDIR, USER: the rest of the line
	pairs []rawPair         // ENV, LABEL, ARG
}

// rawPair is a NAME=VALUE pair before substitution; quotes are still in place.
type rawPair struct {
	key, value string
	hasValue   bool // ARG NAME has no value
}

// unsupported are Docker instructions that fusebox refuses.
var unsupported = map[string]bool{
	"CMD": true, "ENTRYPOINT": true, "EXPOSE": true, "VOLUME": true, "ONBUILD": true,
	"HEALTHCHECK": true, "SHELL": true, "STOPSIGNAL": true, "MAINTAINER": true,
}

// blanks are the characters that separate an instruction's words (as in Docker).
const blanks = "\t\v\f\r "

// parseInstruction parses one logical line.
func parseInstruction(l logicalLine, escape rune) (*instruction, error) {
	text := strings.TrimSpace(l.text)
	word, rest := text, ""
	if i := strings.IndexAny(text, blanks); i >= 0 {
		word, rest = text[:i], strings.TrimLeft(text[i:], blanks)
	}
	in := &instruction{line: l.line, kind: strings.ToUpper(word)}
	switch in.kind {
	case "FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG", "LABEL":
	default:
		if unsupported[in.kind] {
			return nil, errorf(l.line, ErrUnsupported, "%s is not supported (supported: %s)", in.kind, Supported)
		}
		return nil, errorf(l.line, ErrUnsupported, "%s is not a Dockerfile instruction (supported: %s)", word, Supported)
	}
	flags, rest := extractFlags(rest)
	if err := in.setFlags(flags); err != nil {
		return nil, err
	}
	rest = strings.TrimSpace(rest)
	var err error
	switch in.kind {
	case "FROM":
		err = in.parseFrom(rest)
	case "RUN":
		err = in.parseRun(rest)
	case "COPY", "ADD":
		err = in.parseCopy(rest, escape)
	case "ENV", "LABEL":
		err = in.parsePairs(rest, escape)
	case "ARG":
		err = in.parseArg(rest, escape)
	case "WORKDIR", "USER":
		if rest == "" {
			what := map[string]string{"WORKDIR": "a path", "USER": "a user"}[in.kind]
			return nil, errorf(l.line, ErrSyntax, "%s requires %s", in.kind, what)
		}
		in.text = rest
	}
	if err != nil {
		return nil, err
	}
	return in, nil
}

// extractFlags splits the --name[=value] words at the start of rest from what follows. Quotes
// and backslashes in a flag are removed (as Docker does); "--" alone ends the flags.
func extractFlags(rest string) ([]string, string) {
	var flags []string
	pos := 0
	for {
		for pos < len(rest) && isBlank(rest[pos]) {
			pos++
		}
		if !strings.HasPrefix(rest[pos:], "--") {
			return flags, rest[pos:]
		}
		var w strings.Builder
		var quote byte
		for pos < len(rest) {
			ch := rest[pos]
			switch {
			case quote != 0 && ch == quote:
				quote = 0
				pos++
				continue
			case quote == 0 && isBlank(ch):
			case quote == 0 && (ch == '\'' || ch == '"'):
				quote = ch
				pos++
				continue
			case ch == '\\':
				pos++
				if pos < len(rest) {
					w.WriteByte(rest[pos])
					pos++
				}
				continue
			default:
				w.WriteByte(ch)
				pos++
				continue
			}
			break
		}
		if w.String() == "--" {
			return flags, rest[pos:]
		}
		flags = append(flags, w.String())
	}
}

func isBlank(c byte) bool { return strings.IndexByte(blanks+"\n", c) >= 0 }

// refusedFlags are Docker flags that fusebox refuses, with the reason given.
var refusedFlags = map[string]map[string]string{
	"FROM": {"platform": "the image is built for the platform fusebox runs on"},
	"RUN": {
		"mount":    "steps see only the image's root filesystem",
		"network":  "the sandbox decides the network",
		"security": "steps always run confined",
		"device":   "steps get no host devices",
	},
	"COPY": {
		"from":    "multi-stage builds are not supported",
		"link":    "",
		"parents": "",
		"exclude": "",
	},
	"ADD": {
		"link":         "",
		"exclude":      "",
		"checksum":     "only local sources are supported",
		"keep-git-dir": "only local sources are supported",
		"unpack":       "",
	},
}

// setFlags checks the flags and keeps --chown and --chmod of COPY and ADD.
func (in *instruction) setFlags(flags []string) error {
	for _, f := range flags {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if why, ok := refusedFlags[in.kind][name]; ok {
			if why != "" {
				why = ": " + why
			}
			return errorf(in.line, ErrUnsupported, "%s --%s is not supported%s", in.kind, name, why)
		}
		if (in.kind != "COPY" && in.kind != "ADD") || (name != "chown" && name != "chmod") {
			return errorf(in.line, ErrSyntax, "%s: unknown flag --%s", in.kind, name)
		}
		if !hasValue || value == "" {
			form := map[string]string{"chown": "USER[:GROUP]", "chmod": "OCTAL"}[name]
			return errorf(in.line, ErrSyntax, "%s --%s needs a value: --%s=%s", in.kind, name, name, form)
		}
		if _, dup := in.flags[name]; dup {
			return errorf(in.line, ErrSyntax, "%s: flag --%s given twice", in.kind, name)
		}
		if in.flags == nil {
			in.flags = map[string]string{}
		}
		in.flags[name] = value
	}
	return nil
}

func (in *instruction) parseFrom(rest string) error {
	args := strings.FieldsFunc(rest, func(r rune) bool { return r < utf8.RuneSelf && isBlank(byte(r)) })
	switch {
	case len(args) == 0:
		return errorf(in.line, ErrSyntax, "FROM requires an image reference")
	case len(args) == 3 && strings.EqualFold(args[1], "AS"):
		return errorf(in.line, ErrUnsupported, "FROM ... AS %s: named build stages are not supported (only single-stage builds are)", args[2])
	case len(args) != 1:
		return errorf(in.line, ErrSyntax, "FROM takes exactly one image reference, not %q", rest)
	}
	in.args = args
	return nil
}

func (in *instruction) parseRun(rest string) error {
	argv, isJSON, err := jsonArray(rest)
	if err != nil {
		return errorf(in.line, ErrSyntax, "RUN: %v", err)
	}
	if isJSON {
		if len(argv) == 0 {
			return errorf(in.line, ErrSyntax, "RUN requires a command")
		}
		in.args, in.json = argv, true
		return nil
	}
	if rest == "" {
		return errorf(in.line, ErrSyntax, "RUN requires a command")
	}
	if hasHeredoc(rest) {
		return errorf(in.line, ErrUnsupported, "RUN: heredocs (<<WORD) are not supported")
	}
	in.text = rest
	return nil
}

func (in *instruction) parseCopy(rest string, escape rune) error {
	args, isJSON, err := jsonArray(rest)
	if err != nil {
		return errorf(in.line, ErrSyntax, "%s: %v", in.kind, err)
	}
	if !isJSON {
		if hasHeredoc(rest) {
			return errorf(in.line, ErrUnsupported, "%s: heredocs (<<WORD) are not supported", in.kind)
		}
		args = strings.FieldsFunc(rest, func(r rune) bool { return r < utf8.RuneSelf && isBlank(byte(r)) })
	}
	if len(args) < 2 {
		return errorf(in.line, ErrSyntax, "%s requires at least one source and a destination", in.kind)
	}
	in.args, in.json = args, isJSON
	// What holds no variable can be checked now; the rest is checked by Expand.
	lit := func(s string) (string, bool) {
		v, used, err := expandWord(s, escape, func(string) (string, bool) { return "", false })
		return v, err == nil && !used
	}
	c := &Step{Line: in.line, Kind: Kind(in.kind)}
	for _, s := range args[:len(args)-1] {
		if v, ok := lit(s); ok {
			if err := c.checkSource(v); err != nil {
				return err
			}
		}
	}
	if v, ok := lit(in.flags["chmod"]); ok && v != "" {
		if _, err := c.parseChmod(v); err != nil {
			return err
		}
	}
	return nil
}

func (in *instruction) parsePairs(rest string, escape rune) error {
	words := splitWords(rest, escape)
	if len(words) == 0 {
		return errorf(in.line, ErrSyntax, "%s requires at least one NAME=VALUE", in.kind)
	}
	if !strings.Contains(words[0], "=") {
		// The legacy form, NAME VALUE: the value is the rest of the line.
		value := strings.TrimLeft(strings.TrimPrefix(rest, words[0]), blanks)
		if value == "" {
			return errorf(in.line, ErrSyntax, "%s %s has no value: write %s %s=VALUE", in.kind, words[0], in.kind, words[0])
		}
		in.pairs = []rawPair{{key: words[0], value: value, hasValue: true}}
		return nil
	}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return errorf(in.line, ErrSyntax, "%s: %q is not NAME=VALUE", in.kind, w)
		}
		if k == "" {
			return errorf(in.line, ErrSyntax, "%s: %q has an empty name", in.kind, w)
		}
		in.pairs = append(in.pairs, rawPair{key: k, value: v, hasValue: true})
	}
	return nil
}

func (in *instruction) parseArg(rest string, escape rune) error {
	words := splitWords(rest, escape)
	if len(words) == 0 {
		return errorf(in.line, ErrSyntax, "ARG requires a NAME or NAME=DEFAULT")
	}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if k == "" {
			return errorf(in.line, ErrSyntax, "ARG: %q has an empty name", w)
		}
		in.pairs = append(in.pairs, rawPair{key: k, value: v, hasValue: ok})
	}
	return nil
}

// jsonArray parses s as a JSON array of strings. A text that is not a JSON array is not an
// error (it is shell form); a JSON array holding something other than strings is.
func jsonArray(s string) ([]string, bool, error) {
	if !strings.HasPrefix(s, "[") {
		return nil, false, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, false, nil
	}
	out := make([]string, 0, len(raw))
	for _, r := range raw {
		var v string
		// null would unmarshal into a string without error.
		if len(r) == 0 || r[0] != '"' || json.Unmarshal(r, &v) != nil {
			return nil, false, errNotStrings
		}
		out = append(out, v)
	}
	return out, true, nil
}

var errNotStrings = errors.New("a JSON array form must hold only strings")

// heredocPattern matches a heredoc word such as <<EOF, <<-"EOF" or 3<<EOF (as Docker does).
var heredocPattern = regexp.MustCompile(`^(\d*)<<(-?)([^<]+)$`)

// hasHeredoc reports whether a shell-form argument holds a heredoc.
func hasHeredoc(s string) bool {
	for _, w := range strings.Fields(s) {
		if heredocPattern.MatchString(w) {
			return true
		}
	}
	return false
}

// splitWords splits s at unquoted blanks, keeping quotes and escapes in the words (they are
// removed by substitution), as Docker does for ENV, LABEL and ARG.
func splitWords(s string, escape rune) []string {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case quote != 0:
			w.WriteRune(r)
			if r == quote {
				quote = 0
			} else if r == escape && quote != '\'' && i < len(s) {
				r, n = utf8.DecodeRuneInString(s[i:])
				i += n
				w.WriteRune(r)
			}
		case unicode.IsSpace(r):
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			inWord = true
			w.WriteRune(r)
			if r == '\'' || r == '"' {
				quote = r
			} else if r == escape && i < len(s) {
				r, n = utf8.DecodeRuneInString(s[i:])
				i += n
				w.WriteRune(r)
			}
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// checkSource checks a COPY or ADD source after substitution.
func (s *Step) checkSource(src string) error {
	if src == "" {
		return errorf(s.Line, ErrSyntax, "%s: empty source", s.Kind)
	}
	if isURL(src) {
		if s.Kind == KindAdd {
			return errorf(s.Line, ErrUnsupported, "ADD %s: only local sources are supported (no URLs or git repositories)", src)
		}
		return errorf(s.Line, ErrSyntax, "COPY %s: a COPY source cannot be a URL", src)
	}
	if path.IsAbs(src) {
		return errorf(s.Line, ErrSyntax, "%s %s: a source must be relative to the build context", s.Kind, src)
	}
	if c := path.Clean(src); c == ".." || strings.HasPrefix(c, "../") {
		return errorf(s.Line, ErrSyntax, "%s %s: a source must stay inside the build context", s.Kind, src)
	}
	if _, err := path.Match(src, ""); err != nil {
		return errorf(s.Line, ErrSyntax, "%s %s: bad pattern: %v", s.Kind, src, err)
	}
	return nil
}

// urlPattern matches a URL scheme.
var urlPattern = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://`)

// isURL reports whether s names a remote source (a URL, or git@host:repo).
func isURL(s string) bool {
	return urlPattern.MatchString(s) || strings.HasPrefix(s, "git@")
}

// parseChmod parses a --chmod value: octal permission bits, set-id and sticky bits included.
func (s *Step) parseChmod(v string) (uint32, error) {
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errorf(s.Line, ErrSyntax, "%s --chmod=%s: want an octal mode up to 7777", s.Kind, v)
	}
	return uint32(m), nil
}
