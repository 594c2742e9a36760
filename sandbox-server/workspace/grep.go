package workspace

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

const (
	// grepLineTextBytes cuts the text of a reported line.
	grepLineTextBytes = 4 << 10
	// grepLineMatchBytes bounds how much of one line is held and matched; the rest of a longer
	// line (minified code, data) is skipped.
	grepLineMatchBytes = 1 << 20
	// binaryProbeBytes is how much of a file is checked for a NUL byte.
	binaryProbeBytes = 8 << 10
)

// Grep searches regular files for lines matching an RE2 pattern. Paths may be files (always
// searched, symlinks inside the workspace followed) or directories (walked without following
// symlinks; include and exclude globs apply, to the base name or the path relative to the
// workspace root, "**" allowed; exclude also prunes directories). Files whose first 8 KiB hold a
// NUL byte are skipped as binary, files over MaxFileBytes are skipped. Only the first 1 MiB of a
// line is matched and the reported text is cut at 4 KiB (invalid UTF-8 replaced). At most
// max_matches matches are returned (capped at MaxGrepMatches); truncated says more exist.
func (w *Workspace) Grep(ctx context.Context, req *sandboxv1.GrepRequest) (*sandboxv1.GrepResponse, error) {
	pattern := req.GetPattern()
	if req.GetCaseInsensitive() {
		pattern = "(?i)" + pattern
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("grep: %w: %w", ErrInvalidArgument, err)
	}
	include, err := compileGlobs(w, req.GetInclude())
	if err != nil {
		return nil, err
	}
	exclude, err := compileGlobs(w, req.GetExclude())
	if err != nil {
		return nil, err
	}
	paths := req.GetPaths()
	if len(paths) == 0 {
		paths = []string{"."}
	}
	rels := make([]string, 0, len(paths))
	for _, p := range paths {
		rel, err := w.Resolve(p)
		if err != nil {
			return nil, fmt.Errorf("grep: %w", err)
		}
		rels = append(rels, rel)
	}

	g := &grepper{
		w:     w,
		re:    re,
		limit: capLimit(req.GetMaxMatches(), w.maxGrep),
		br:    bufio.NewReaderSize(nil, 64<<10),
		resp:  &sandboxv1.GrepResponse{},
	}
	for _, rel := range rels {
		if err := g.searchPath(ctx, rel, include, exclude); err != nil {
			if err == errStopWalk {
				break
			}
			return nil, err
		}
	}
	return g.resp, nil
}

func compileGlobs(w *Workspace, patterns []string) ([]*glob, error) {
	globs := make([]*glob, 0, len(patterns))
	for _, p := range patterns {
		if p == "" || strings.IndexByte(p, 0) >= 0 {
			return nil, fmt.Errorf("grep: %w: glob %q", ErrInvalidPath, short(p))
		}
		g, err := compileGlob(strings.TrimPrefix(p, "./"))
		if err != nil {
			return nil, fmt.Errorf("grep: %w", err)
		}
		globs = append(globs, g)
	}
	return globs, nil
}

func anyMatch(globs []*glob, rel, base string) bool {
	for _, g := range globs {
		if g.matchBaseOrPath(rel, base) {
			return true
		}
	}
	return false
}

// grepper holds one Grep call's state.
type grepper struct {
	w     *Workspace
	re    *regexp.Regexp
	limit int
	br    *bufio.Reader // reused for every file
	line  []byte        // reused for lines longer than br's buffer
	resp  *sandboxv1.GrepResponse
}

// searchPath searches one explicit path; errStopWalk means the match limit was hit.
func (g *grepper) searchPath(ctx context.Context, rel string, include, exclude []*glob) error {
	fi, err := g.w.root.stat(rel)
	if err != nil {
		return wrap("grep", rel, err)
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() || fi.Size() > g.w.maxFileBytes {
			return nil
		}
		h, err := g.w.root.openRead(rel)
		if err != nil {
			return wrap("grep", rel, err)
		}
		defer h.Close()
		return g.searchFile(ctx, rel, h)
	}
	err = g.w.walk(ctx, rel, 0, func(e *walkEntry) (bool, error) {
		if len(exclude) > 0 && anyMatch(exclude, e.rel, e.name) {
			return false, nil
		}
		if !e.info.Mode().IsRegular() || e.info.Size() > g.w.maxFileBytes {
			return true, nil
		}
		if len(include) > 0 && !anyMatch(include, e.rel, e.name) {
			return false, nil
		}
		h, err := e.dir.openRead(e.name)
		if err != nil {
			return false, nil // gone, or swapped for a symlink (walks follow none)
		}
		defer h.Close()
		return false, g.searchFile(ctx, e.rel, h)
	})
	if err == nil && g.resp.Truncated {
		return errStopWalk // walk swallowed it; the remaining paths need no search
	}
	return wrap("grep", rel, err)
}

// searchFile searches one open file.
func (g *grepper) searchFile(ctx context.Context, rel string, h handle) error {
	if _, mode, err := h.stat(); err != nil || !mode.IsRegular() {
		return nil // swapped for a FIFO or device since it was listed
	}
	g.br.Reset(h)
	defer g.br.Reset(nil)
	head, err := g.br.Peek(binaryProbeBytes)
	if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
		return wrap("grep", rel, err)
	}
	if bytes.IndexByte(head, 0) >= 0 {
		g.resp.BinaryFilesSkipped++
		return nil
	}
	g.resp.FilesSearched++
	for lineNo := uint32(1); ; lineNo++ {
		if lineNo%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		line, err := g.readLine()
		if len(line) == 0 && err == io.EOF {
			return nil
		}
		if err != nil && err != io.EOF {
			return wrap("grep", rel, err)
		}
		if g.re.Match(line) {
			if len(g.resp.Matches) == g.limit {
				g.resp.Truncated = true
				return errStopWalk
			}
			g.resp.Matches = append(g.resp.Matches, &sandboxv1.GrepMatch{Path: rel, Line: lineNo, Text: lineText(line)})
		}
		if err == io.EOF {
			return nil
		}
	}
}

// readLine returns the next line without its newline, holding at most grepLineMatchBytes of it
// and discarding the rest. The slice is valid until the next call.
func (g *grepper) readLine() ([]byte, error) {
	frag, err := g.br.ReadSlice('\n')
	if err == nil {
		return frag[:len(frag)-1], nil
	}
	if err != bufio.ErrBufferFull {
		return frag, err // io.EOF with the last line, or a read error
	}
	g.line = append(g.line[:0], frag...)
	for {
		frag, err = g.br.ReadSlice('\n')
		room := grepLineMatchBytes - len(g.line)
		g.line = append(g.line, frag[:min(len(frag), max(room, 0))]...)
		switch err {
		case nil:
			if room >= len(frag) {
				g.line = g.line[:len(g.line)-1] // the newline
			}
			return g.line, nil
		case bufio.ErrBufferFull:
			continue
		default:
			return g.line, err
		}
	}
}

// lineText cuts a line for reporting and makes it valid UTF-8 (a protobuf string must be).
func lineText(line []byte) string {
	if len(line) > grepLineTextBytes {
		line = line[:grepLineTextBytes]
	}
	return strings.ToValidUTF8(string(line), "\uFFFD")
}
