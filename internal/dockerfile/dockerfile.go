// Package dockerfile parses the subset of the Dockerfile language that `fusebox template
// build` supports: one build stage made of FROM, RUN, COPY, ADD (local sources only), ENV,
// WORKDIR, USER, ARG and LABEL. Everything else is refused with an error naming the line,
// rather than ignored, so that an image never silently differs from what its Dockerfile says.
//
// Parsing follows Docker's documented syntax (the BuildKit frontend's behaviour): comments,
// parser directives (escape, syntax), line continuations, case-insensitive instruction
// words, JSON (exec) forms, ENV and LABEL pairs in both forms, and variable substitution.
// Parse checks the syntax; Expand then substitutes build arguments and ENV values and
// returns typed steps, each with a canonical cache key.
//
// Choices where Docker offers more than fusebox supports:
//   - The `# escape=` directive is supported (backslash or backtick); `# syntax=` is accepted
//     and ignored (there is no frontend image to run).
//   - COPY and ADD sources may hold path.Match patterns (*, ?, [...]); the builder expands
//     them against the build context. A source must be relative and stay inside the
//     context after cleaning; URLs and git sources are refused, and ADD is left to the
//     builder to treat as COPY plus the extraction of local tar archives.
//   - Heredocs (RUN <<EOF) are refused: their body lines would otherwise be read as
//     instructions.
//   - A JSON form must be a JSON array of strings making up the whole rest of the line;
//     anything else is shell form (Docker ignores text after a JSON array).
//   - Docker's predefined proxy arguments (HTTP_PROXY...) and platform arguments
//     (TARGETARCH...) are not predefined: declare them with ARG.
package dockerfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// Sentinel errors wrapped by every *Error, for errors.Is.
var (
	// ErrSyntax: the Dockerfile is malformed (a missing argument, a bad flag value, an
	// unterminated quote, a source that leaves the build context).
	ErrSyntax = errors.New("Dockerfile syntax error")
	// ErrUnsupported: valid Docker syntax that fusebox refuses (an instruction, a flag, a
	// second stage, a URL source, a heredoc).
	ErrUnsupported = errors.New("unsupported Dockerfile feature")
	// ErrVariable: a ${NAME:?message} or ${NAME?message} substitution of an unset variable.
	ErrVariable = errors.New("required variable not set")
)

// Error is a Dockerfile error at an instruction's first line.
type Error struct {
	// Line is the 1-based line where the instruction starts; 0 when the error concerns the
	// whole file (no FROM instruction).
	Line int
	// Msg says what is wrong, naming the instruction.
	Msg string
	// Err is ErrSyntax, ErrUnsupported or ErrVariable.
	Err error
}

// Error formats e as "Dockerfile:LINE: MSG", as compilers do, so editors can jump to it.
func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("Dockerfile:%d: %s", e.Line, e.Msg)
	}
	return "Dockerfile: " + e.Msg
}

// Unwrap returns the sentinel e wraps.
func (e *Error) Unwrap() error { return e.Err }

// errorf returns an *Error of kind err at line.
func errorf(line int, err error, format string, args ...any) *Error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Supported lists the supported instructions, in the order error messages give them.
const Supported = "FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, LABEL"

// Kind is the instruction a Step comes from.
type Kind string

// The kinds of steps. FROM and ARG make no step: FROM is Stage.From, and ARG values reach
// later steps through substitution and Step.Args.
const (
	// KindRun runs a command in the image being built.
	KindRun Kind = "RUN"
	// KindCopy copies files from the build context.
	KindCopy Kind = "COPY"
	// KindAdd is COPY that also extracts local tar archives (as Docker's ADD does).
	KindAdd Kind = "ADD"
	// KindEnv sets environment variables in the image configuration.
	KindEnv Kind = "ENV"
	// KindWorkdir sets (and the builder creates) the working directory.
	KindWorkdir Kind = "WORKDIR"
	// KindUser sets the user later RUN steps and the image run as.
	KindUser Kind = "USER"
	// KindLabel sets labels in the image configuration.
	KindLabel Kind = "LABEL"
)

// KeyValue is one NAME=VALUE pair of ENV, LABEL or ARG.
type KeyValue struct {
	Key, Value string
}

// File is a parsed Dockerfile, before substitution.
type File struct {
	digest     string
	escape     rune
	globalArgs []*instruction // ARG instructions before FROM
	from       *instruction
	body       []*instruction // instructions after FROM
}

// Parse reads and parses a Dockerfile. Errors are *Error values (wrapping ErrSyntax or
// ErrUnsupported) naming the line, or the reader's error.
func Parse(r io.Reader) (*File, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading the Dockerfile: %w", err)
	}
	return ParseBytes(data)
}

// ParseBytes parses the Dockerfile data; see Parse.
func ParseBytes(data []byte) (*File, error) {
	sum := sha256.Sum256(data)
	f := &File{digest: "sha256:" + hex.EncodeToString(sum[:])}
	lines, escape, err := logicalLines(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))
	if err != nil {
		return nil, err
	}
	f.escape = escape
	for _, l := range lines {
		in, err := parseInstruction(l, escape)
		if err != nil {
			return nil, err
		}
		switch {
		case in.kind == "FROM" && f.from != nil:
			return nil, errorf(in.line, ErrUnsupported, "multi-stage builds are not supported: a second FROM (the first is on line %d)", f.from.line)
		case in.kind == "FROM":
			f.from = in
		case f.from == nil && in.kind == "ARG":
			f.globalArgs = append(f.globalArgs, in)
		case f.from == nil:
			return nil, errorf(in.line, ErrSyntax, "%s before FROM: a Dockerfile starts with FROM, which only ARG may precede", in.kind)
		default:
			f.body = append(f.body, in)
		}
	}
	if f.from == nil {
		return nil, errorf(0, ErrSyntax, "no FROM instruction")
	}
	return f, nil
}

// Digest is the sha256 digest of the Dockerfile's bytes, as "sha256:HEX", for the build
// record.
func (f *File) Digest() string { return f.digest }
