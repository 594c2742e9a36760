package envstate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrBadDump reports a state dump that does not have the shape BashTrap writes.
var ErrBadDump = errors.New("malformed shell state dump")

// BashTrap is prepended to scripts run by bash. On exit it writes the final working directory,
// whether the script changed directory, and the exported variables to file descriptor 3, using
// only builtins (no extra process: starting one is among the dearest things a sandbox does,
// docs/performance.md), and keeps the script's exit status. cd, pushd and popd are wrapped so
// that a change of directory counts as a write even when it ends where it started.
const BashTrap = `cd() { builtin cd "$@" && __fusebox_cd=1; }; ` +
	`pushd() { builtin pushd "$@" && __fusebox_cd=1; }; ` +
	`popd() { builtin popd "$@" && __fusebox_cd=1; }; ` +
	`trap '__fusebox_rc=$?; { builtin printf "%s\0%s\0" "$PWD" "${__fusebox_cd:-0}"; builtin declare -px; } >&3 2>/dev/null; builtin exit $__fusebox_rc' EXIT` + "\n"

// Dump is a script's final state as BashTrap reports it.
type Dump struct {
	Cwd        string
	CwdChanged bool // the script ran cd, pushd or popd successfully
	Env        map[string]string
}

// ParseBashDump parses what BashTrap wrote: the working directory, a NUL byte, "1" or "0"
// (directory changed), a NUL byte, then the output of bash's `declare -px`.
func ParseBashDump(b []byte) (Dump, error) {
	cwd, rest, ok := strings.Cut(string(b), "\x00")
	if !ok {
		return Dump{}, fmt.Errorf("%w: no working directory", ErrBadDump)
	}
	flag, rest, ok := strings.Cut(rest, "\x00")
	if !ok || (flag != "0" && flag != "1") {
		return Dump{}, fmt.Errorf("%w: no directory-change flag", ErrBadDump)
	}
	d := Dump{Cwd: cwd, CwdChanged: flag == "1", Env: map[string]string{}}
	env := d.Env
	var err error
	for len(rest) > 0 {
		if rest[0] == '\n' {
			rest = rest[1:]
			continue
		}
		if !strings.HasPrefix(rest, "declare -") {
			return Dump{}, fmt.Errorf("%w: unexpected %q", ErrBadDump, head(rest))
		}
		rest = rest[len("declare -"):]
		sp := strings.IndexByte(rest, ' ')
		if sp < 0 {
			return Dump{}, fmt.Errorf("%w: no name", ErrBadDump)
		}
		flags := rest[:sp]
		rest = rest[sp+1:]
		end := strings.IndexAny(rest, "=\n")
		if end < 0 {
			end = len(rest)
		}
		name := rest[:end]
		rest = rest[end:]
		if len(rest) == 0 || rest[0] == '\n' {
			continue // exported but never assigned: not in the environment
		}
		rest = rest[1:] // '='
		var val string
		if val, rest, err = unquote(rest); err != nil {
			return Dump{}, fmt.Errorf("%s: %w", name, err)
		}
		// Arrays and associative arrays are never exported to children.
		if !strings.ContainsAny(flags, "aA") {
			env[name] = val
		}
	}
	return d, nil
}

func head(s string) string {
	if len(s) > 40 {
		return s[:40]
	}
	return s
}

// unquote reads one bash-quoted word: "..." with backslash escapes of " $ ` \ (and a
// backslash-newline), $'...' ANSI-C quoting, or a bare word up to the end of the line.
func unquote(s string) (val, rest string, err error) {
	switch {
	case strings.HasPrefix(s, `"`):
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			c := s[i]
			switch {
			case c == '"':
				return b.String(), s[i+1:], nil
			case c == '\\' && i+1 < len(s) && strings.IndexByte("\"$`\\\n", s[i+1]) >= 0:
				i++
				if s[i] != '\n' {
					b.WriteByte(s[i])
				}
			default:
				b.WriteByte(c)
			}
		}
		return "", "", fmt.Errorf("%w: unterminated double quote", ErrBadDump)
	case strings.HasPrefix(s, `$'`):
		return ansiC(s[2:])
	default:
		end := strings.IndexByte(s, '\n')
		if end < 0 {
			end = len(s)
		}
		return s[:end], s[end:], nil
	}
}

// ansiC decodes the body of a $'...' word.
func ansiC(s string) (val, rest string, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\'' {
			return b.String(), s[i+1:], nil
		}
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'e', 'E':
			b.WriteByte(0x1b)
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '\\', '\'', '"', '?':
			b.WriteByte(e)
		case 'c':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i] & 0x1f)
			}
		case 'x', 'u', 'U':
			max := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			j := i + 1
			for j < len(s) && j-i-1 < max && isHex(s[j]) {
				j++
			}
			if j == i+1 {
				b.WriteByte('\\')
				b.WriteByte(e)
				continue
			}
			n, _ := strconv.ParseUint(s[i+1:j], 16, 32)
			if e == 'x' {
				b.WriteByte(byte(n))
			} else {
				b.WriteRune(rune(n))
				if !utf8.ValidRune(rune(n)) {
					return "", "", fmt.Errorf("%w: bad code point %x", ErrBadDump, n)
				}
			}
			i = j - 1
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j-i < 3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			n, _ := strconv.ParseUint(s[i:j], 8, 16)
			b.WriteByte(byte(n))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", "", fmt.Errorf("%w: unterminated $'...'", ErrBadDump)
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
