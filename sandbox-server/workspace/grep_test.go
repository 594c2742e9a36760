package workspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

func grepTree(t *testing.T) *env {
	e := newEnv(t)
	files := map[string]string{
		"main.go":            "package main\n\nfunc main() {\n\tprintln(\"Hello\")\n}\n",
		"lib/util.go":        "package lib\n// hello world\nvar X = 1\n",
		"lib/util_test.go":   "package lib\n// HELLO test\n",
		"docs/readme.md":     "# Hello docs\nno newline at the end: hello",
		"vendor/dep/dep.go":  "package dep // hello vendored\n",
		"bin/tool":           "hello\x00binary",
		"crlf.txt":           "hello\r\nworld\r\n",
		"latin1.txt":         "hello \xff\xfe\n",
		"long/line.txt":      "start " + strings.Repeat("a", 200<<10) + " hello end\n" + "hello second\n",
		"long/beyond.txt":    strings.Repeat("b", grepLineMatchBytes+10) + " hello\nnext\n",
		"many/matches.txt":   strings.Repeat("match\n", 50),
		"empty.txt":          "",
		"lib/nested/deep.go": "// hello deep\n",
	}
	for p, data := range files {
		full := filepath.Join(e.dir, filepath.FromSlash(p))
		mustMkdir(t, filepath.Dir(full))
		mustWrite(t, full, data)
	}
	os.Symlink("main.go", filepath.Join(e.dir, "mainlink.go")) // not followed in walks
	return e
}

type grepHit struct {
	path string
	line uint32
}

func hits(resp *sandboxv1.GrepResponse) []grepHit {
	var hs []grepHit
	for _, m := range resp.Matches {
		hs = append(hs, grepHit{m.Path, m.Line})
	}
	return hs
}

func TestGrep(t *testing.T) {
	e := grepTree(t)
	ctx := context.Background()
	tests := []struct {
		name      string
		req       *sandboxv1.GrepRequest
		want      []grepHit
		truncated bool
	}{
		{"case sensitive", &sandboxv1.GrepRequest{Pattern: "Hello"}, []grepHit{{"docs/readme.md", 1}, {"main.go", 4}}, false},
		{"case insensitive", &sandboxv1.GrepRequest{Pattern: "hello", CaseInsensitive: true, Paths: []string{"lib", "docs"}},
			[]grepHit{{"lib/nested/deep.go", 1}, {"lib/util.go", 2}, {"lib/util_test.go", 2}, {"docs/readme.md", 1}, {"docs/readme.md", 2}}, false},
		{"include base name", &sandboxv1.GrepRequest{Pattern: "hello", Include: []string{"*.go"}},
			[]grepHit{{"lib/nested/deep.go", 1}, {"lib/util.go", 2}, {"vendor/dep/dep.go", 1}}, false},
		{"include path glob", &sandboxv1.GrepRequest{Pattern: "(?i)hello", Include: []string{"lib/**/*.go"}},
			[]grepHit{{"lib/nested/deep.go", 1}, {"lib/util.go", 2}, {"lib/util_test.go", 2}}, false},
		{"exclude dir", &sandboxv1.GrepRequest{Pattern: "hello", Include: []string{"*.go"}, Exclude: []string{"vendor", "lib/nested"}},
			[]grepHit{{"lib/util.go", 2}}, false},
		{"exclude file", &sandboxv1.GrepRequest{Pattern: "(?i)hello", Paths: []string{"lib"}, Exclude: []string{"*_test.go"}},
			[]grepHit{{"lib/nested/deep.go", 1}, {"lib/util.go", 2}}, false},
		{"explicit file", &sandboxv1.GrepRequest{Pattern: "println", Paths: []string{"/workspace/main.go", "mainlink.go"}},
			[]grepHit{{"main.go", 4}, {"mainlink.go", 4}}, false},
		{"crlf", &sandboxv1.GrepRequest{Pattern: "^world\r$", Paths: []string{"crlf.txt"}}, []grepHit{{"crlf.txt", 2}}, false},
		{"long line", &sandboxv1.GrepRequest{Pattern: "hello", Paths: []string{"long/line.txt"}}, []grepHit{{"long/line.txt", 1}, {"long/line.txt", 2}}, false},
		{"beyond the matched part of a line", &sandboxv1.GrepRequest{Pattern: "hello|next", Paths: []string{"long/beyond.txt"}}, []grepHit{{"long/beyond.txt", 2}}, false},
		{"max matches", &sandboxv1.GrepRequest{Pattern: "match", MaxMatches: 3}, []grepHit{{"many/matches.txt", 1}, {"many/matches.txt", 2}, {"many/matches.txt", 3}}, true},
		{"max matches across paths", &sandboxv1.GrepRequest{Pattern: "match", Paths: []string{"many", "many/matches.txt"}, MaxMatches: 2}, []grepHit{{"many/matches.txt", 1}, {"many/matches.txt", 2}}, true},
		{"max matches exact", &sandboxv1.GrepRequest{Pattern: "^match$", Paths: []string{"many"}, MaxMatches: 50}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.w.Grep(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			got := hits(resp)
			if tt.name == "max matches exact" {
				if len(got) != 50 || resp.Truncated {
					t.Fatalf("%d matches, truncated %v", len(got), resp.Truncated)
				}
				return
			}
			if !slices.Equal(got, tt.want) || resp.Truncated != tt.truncated {
				t.Fatalf("got %v truncated=%v, want %v %v", got, resp.Truncated, tt.want, tt.truncated)
			}
		})
	}
}

func TestGrepDetails(t *testing.T) {
	e := grepTree(t)
	ctx := context.Background()
	resp, err := e.w.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.BinaryFilesSkipped != 1 {
		t.Errorf("binary files skipped = %d", resp.BinaryFilesSkipped)
	}
	if resp.FilesSearched != 12 {
		t.Errorf("files searched = %d", resp.FilesSearched)
	}
	for _, m := range resp.Matches {
		if m.Path == "bin/tool" {
			t.Error("matched a binary file")
		}
		if len(m.Text) > grepLineTextBytes+3 {
			t.Errorf("%s:%d: text of %d bytes", m.Path, m.Line, len(m.Text))
		}
		if !strings.Contains(m.Text, "hello") && !strings.HasPrefix(m.Text, "start aaa") {
			t.Errorf("%s:%d: text %q", m.Path, m.Line, short(m.Text))
		}
		if m.Path == "latin1.txt" && m.Text != "hello \uFFFD" {
			t.Errorf("invalid UTF-8 not replaced: %q", m.Text)
		}
	}
	for _, tt := range []struct {
		name string
		req  *sandboxv1.GrepRequest
		want error
	}{
		{"bad regexp", &sandboxv1.GrepRequest{Pattern: "a(b"}, ErrInvalidArgument},
		{"bad include", &sandboxv1.GrepRequest{Pattern: "a", Include: []string{"[x"}}, ErrInvalidPath},
		{"empty exclude", &sandboxv1.GrepRequest{Pattern: "a", Exclude: []string{""}}, ErrInvalidPath},
		{"missing path", &sandboxv1.GrepRequest{Pattern: "a", Paths: []string{"nope"}}, fs.ErrNotExist},
		{"escaping path", &sandboxv1.GrepRequest{Pattern: "a", Paths: []string{"../x"}}, ErrEscape},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.w.Grep(ctx, tt.req); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.w.Grep(cctx, &sandboxv1.GrepRequest{Pattern: "x"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	small := newEnv(t, func(o *Options) { o.MaxFileBytes = 10 })
	mustWrite(t, filepath.Join(small.dir, "big"), "hello hello hello")
	mustWrite(t, filepath.Join(small.dir, "small"), "hello")
	resp, err = small.w.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "hello"})
	if err != nil || fmt.Sprint(hits(resp)) != "[{small 1}]" {
		t.Errorf("over MaxFileBytes: %v %v", hits(resp), err)
	}
}
