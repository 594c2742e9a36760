package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fusebox-dev/fusebox/client"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// tempPrefix is the name prefix of the server's in-flight atomic writes.
const tempPrefix = ".fusebox-tmp-"

func TestWriteTreeRoundTrip(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 3*time.Minute)
	c := b.Client
	rng := rand.New(rand.NewPCG(1, 2))

	local := t.TempDir()
	want := map[string][]byte{} // workspace path -> content, symlinks resolved
	modes := map[string]fs.FileMode{}
	put := func(rel string, data []byte, mode fs.FileMode) {
		p := filepath.Join(local, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the local umask
			t.Fatal(err)
		}
		want["tree/"+rel] = data
		modes["tree/"+rel] = mode
	}
	random := func(n int) []byte {
		d := make([]byte, n)
		for i := range d {
			d[i] = byte(rng.Uint32())
		}
		return d
	}
	put("a/b/c/deep.txt", []byte("deep\n"), 0o644)
	put("bin/tool.sh", []byte("#!/bin/sh\necho tool\n"), 0o755)
	put("secret.txt", []byte("s3cret\n"), 0o600)
	put("big.bin", random(6<<20), 0o644)
	for i := range 500 {
		put(fmt.Sprintf("many/d%02d/f%03d.txt", i%17, i), random(rng.IntN(3000)), 0o644)
	}
	for _, d := range []string{"empty", "e1/e2/e3"} {
		if err := os.MkdirAll(filepath.Join(local, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("b/c/deep.txt", filepath.Join(local, "a/link")); err != nil {
		t.Fatal(err)
	}
	want["tree/a/link"] = want["tree/a/b/c/deep.txt"]
	var total int64
	for p, d := range want {
		if p != "tree/a/link" {
			total += int64(len(d))
		}
	}

	st, err := c.WriteTree(ctx, local, "tree")
	if err != nil {
		t.Fatalf("WriteTree: %v", err)
	}
	if st.Files != 504 || st.Symlinks != 1 || st.Streamed != 1 || st.Batches < 1 || st.Bytes != total {
		t.Errorf("WriteStats %+v; want 504 files, 1 symlink, 1 streamed, >= 1 batch, %d bytes", st, total)
	}

	got, rst, err := c.ReadFiles(ctx, "tree/**")
	if err != nil {
		t.Fatalf("ReadFiles: %v", err)
	}
	if rst.Streamed != 1 || len(rst.Missing) != 0 {
		t.Errorf("ReadStats %+v; want the 6 MiB file streamed and nothing missing", rst)
	}
	for p, d := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s not read back", p)
		} else if !bytes.Equal(g, d) {
			t.Errorf("%s: read back %d bytes that differ from the %d written", p, len(g), len(d))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("read back %s, which was never written", p)
		}
	}

	for _, p := range []string{"tree/secret.txt", "tree/bin/tool.sh", "tree/big.bin"} {
		fi, err := c.Stat(ctx, p, false)
		if err != nil {
			t.Fatal(err)
		}
		if fs.FileMode(fi.GetMode()) != modes[p] || fi.GetSize() != uint64(len(want[p])) {
			t.Errorf("Stat %s: mode %o size %d, want %o and %d", p, fi.GetMode(), fi.GetSize(), modes[p], len(want[p]))
		}
	}
	entries, err := c.List(ctx, "tree/bin", false, 0)
	if err != nil || len(entries) != 1 || entries[0].GetPath() != "tree/bin/tool.sh" || entries[0].GetMode() != 0o755 {
		t.Errorf("List tree/bin = %v, %v; want tool.sh with mode 0755", entries, err)
	}
	for _, d := range []string{"tree/empty", "tree/e1/e2/e3"} {
		fi, err := c.Stat(ctx, d, false)
		if err != nil || fi.GetType() != sandboxv1.FileType_FILE_TYPE_DIR {
			t.Errorf("empty directory %s: %v, %v", d, fi, err)
		}
		if l, err := c.List(ctx, d, false, 0); err != nil || len(l) != 0 {
			t.Errorf("List %s = %v, %v; want it empty", d, l, err)
		}
	}
	if fi, err := c.Stat(ctx, "tree/a/link", false); err != nil || fi.GetType() != sandboxv1.FileType_FILE_TYPE_SYMLINK || fi.GetSymlinkTarget() != "b/c/deep.txt" {
		t.Errorf("Stat tree/a/link: %v, %v; want a symlink to b/c/deep.txt", fi, err)
	}
	if fi, err := c.Stat(ctx, "tree/a/link", true); err != nil || fi.GetType() != sandboxv1.FileType_FILE_TYPE_FILE || fi.GetSize() != 5 {
		t.Errorf("Stat tree/a/link following it: %v, %v; want the 5-byte file", fi, err)
	}
	// 504 files, 1 link, and the directories: a, a/b, a/b/c, bin, empty, e1, e1/e2, e1/e2/e3,
	// many and its 17 subdirectories.
	all, err := c.List(ctx, "tree", true, 0)
	if err != nil || len(all) != 504+1+8+1+17 {
		t.Errorf("List -r tree: %d entries, %v; want %d", len(all), err, 504+1+8+1+17)
	}
}

// blockingReader delivers n bytes, then blocks until ctx ends.
type blockingReader struct {
	ctx       context.Context
	left      int
	once      sync.Once
	delivered chan struct{}
}

func (r *blockingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		r.once.Do(func() { close(r.delivered) })
		<-r.ctx.Done()
		return 0, r.ctx.Err()
	}
	n := min(len(p), r.left)
	for i := range p[:n] {
		p[i] = 'x'
	}
	r.left -= n
	return n, nil
}

// tempFiles returns the in-flight write files in a workspace directory.
func tempFiles(t testing.TB, ctx context.Context, c *client.Sandbox, dir string) []string {
	t.Helper()
	var temps []string
	for _, n := range lsA(t, ctx, c, path.Join("/workspace", dir)) {
		if strings.HasPrefix(n, tempPrefix) {
			temps = append(temps, n)
		}
	}
	return temps
}

func TestWriteFileFromCancelledLeavesNothing(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 3*time.Minute)
	c := b.Client
	if err := c.WriteFile(ctx, "up/existing.txt", []byte("old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		old        []byte // nil: the file must not exist afterwards
	}{
		{"new file", "up/new.bin", nil},
		{"overwrite", "up/existing.txt", []byte("old content")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			r := &blockingReader{ctx: cctx, left: 8 << 20, delivered: make(chan struct{})}
			done := make(chan error, 1)
			go func() {
				_, err := c.WriteFileFrom(cctx, tc.path, 0o644, r, -1)
				done <- err
			}()
			select {
			case <-r.delivered:
			case err := <-done:
				t.Fatalf("the write ended before its data was delivered: %v", err)
			}
			// The control: the server is writing a temp file when the cancel comes.
			sandboxtest.Eventually(t, time.Minute, "a temp file in flight", func() (bool, string) {
				temps := tempFiles(t, ctx, c, "up")
				return len(temps) == 1, fmt.Sprintf("temp files %q", temps)
			})
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) && codeOf(err) != codes.Canceled {
				t.Errorf("cancelled WriteFileFrom returned %v, want a cancellation", err)
			}
			// The server sees the cancel after the client has returned: wait for its cleanup.
			sandboxtest.Eventually(t, time.Minute, "no temp file left", func() (bool, string) {
				temps := tempFiles(t, ctx, c, "up")
				return len(temps) == 0, fmt.Sprintf("temp files %q", temps)
			})
			data, err := c.ReadFile(ctx, tc.path)
			switch {
			case tc.old == nil && codeOf(err) != codes.NotFound:
				t.Errorf("%s after a cancelled write: %d bytes, %v; want NotFound", tc.path, len(data), err)
			case tc.old != nil && (err != nil || !bytes.Equal(data, tc.old)):
				t.Errorf("%s after a cancelled overwrite: %d bytes (%.20q), %v; want its old content", tc.path, len(data), data, err)
			}
		})
	}
	if got := lsA(t, ctx, c, "/workspace/up"); !slices.Equal(got, []string{"existing.txt"}) {
		t.Errorf("up/ holds %q, want only existing.txt", got)
	}
}

// wantNoFile asserts that p does not exist and that its directory holds no temp file.
func wantNoFile(t testing.TB, ctx context.Context, c *client.Sandbox, p string) {
	t.Helper()
	if _, err := c.Stat(ctx, p, false); codeOf(err) != codes.NotFound {
		t.Errorf("%s: Stat = %v, want NotFound", p, err)
	}
	if temps := tempFiles(t, ctx, c, path.Dir(p)); len(temps) > 0 {
		t.Errorf("temp files left in %s: %q", path.Dir(p), temps)
	}
}

func TestWriteFileFromSizeMismatch(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	if err := c.Mkdir(ctx, "sz", false); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		data     int
		declared int64
	}{
		{"shorter than declared", 100, 200},
		{"longer than declared", 300, 200},
		{"much longer than declared", 3 << 20, 1 << 20},
		// The client documents that a size that is not negative is checked, but 0 travels as
		// "unset" in the proto (no presence), so the server checks nothing.
		{"data where empty was declared", 5, 0},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := fmt.Sprintf("sz/f%d", i)
			_, err := c.WriteFileFrom(ctx, p, 0o644, bytes.NewReader(make([]byte, tc.data)), tc.declared)
			wantCode(t, fmt.Sprintf("%d bytes declared as %d", tc.data, tc.declared), err, codes.InvalidArgument)
			wantNoFile(t, ctx, c, p)
		})
	}
	// The control: a matching size is accepted.
	if n, err := c.WriteFileFrom(ctx, "sz/ok", 0o644, bytes.NewReader(make([]byte, 200)), 200); err != nil || n != 200 {
		t.Fatalf("matching size: %d, %v", n, err)
	}
}

func TestWriteOverFileLimit(t *testing.T) {
	const limit = 1 << 20
	b := sandboxtest.StartBound(t, sandboxtest.Options{ServerArgs: []string{fmt.Sprintf("-max-file-bytes=%d", limit)}})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	if err := c.Mkdir(ctx, "lim", false); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		write func(p string) error
	}{
		{"2 MiB stream of unknown size", func(p string) error {
			_, err := c.WriteFileFrom(ctx, p, 0o644, bytes.NewReader(make([]byte, 2<<20)), -1)
			return err
		}},
		{"2 MiB stream declared", func(p string) error {
			_, err := c.WriteFileFrom(ctx, p, 0o644, bytes.NewReader(make([]byte, 2<<20)), 2<<20)
			return err
		}},
		{"one byte over in a stream", func(p string) error {
			_, err := c.WriteFileFrom(ctx, p, 0o644, bytes.NewReader(make([]byte, limit+1)), -1)
			return err
		}},
		{"1.5 MiB in a batch", func(p string) error {
			return c.WriteFile(ctx, p, make([]byte, 3<<19), 0o644)
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := fmt.Sprintf("lim/f%d", i)
			wantCode(t, tc.name, tc.write(p), codes.ResourceExhausted)
			wantNoFile(t, ctx, c, p)
		})
	}
	// At the limit is fine; reading a file over it (made by a command) is not.
	if _, err := c.WriteFileFrom(ctx, "lim/at-limit", 0o644, bytes.NewReader(make([]byte, limit)), -1); err != nil {
		t.Errorf("a stream of exactly the limit: %v", err)
	}
	sandboxtest.Sh(t, ctx, c, "head -c 2097152 /dev/zero > /workspace/lim/made-by-command")
	_, err := c.ReadFile(ctx, "lim/made-by-command")
	wantCode(t, "reading a file over the limit", err, codes.ResourceExhausted)
}

func TestGrepAndFind(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	var many strings.Builder
	for i := range 100 {
		fmt.Fprintf(&many, "error %d\n", i)
	}
	_, err := c.WriteFiles(ctx, []client.File{
		{Path: "src/main.go", Data: []byte("package main\n\nfunc main() {\n\tprintln(\"hello\")\n}\n")},
		{Path: "src/util/util.go", Data: []byte("package util\n\nfunc Helper() int { return 1 }\nfunc other() {}\n")},
		{Path: "src/notes.txt", Data: []byte("func inText() is not code\n")},
		{Path: "src/blob.bin", Data: []byte("func binary\x00\x01\x02\n")},
		{Path: "logs/many.log", Data: []byte(many.String())},
		{Path: "docs/README.md", Data: []byte("Hello World\n")},
	}, []string{"empty"}, nil)
	if err != nil {
		t.Fatal(err)
	}

	type match struct {
		path string
		line uint32
	}
	grepTests := []struct {
		name      string
		req       *sandboxv1.GrepRequest
		want      []match
		truncated bool
		searched  uint32
		binary    uint32
	}{
		{"RE2 with include glob", &sandboxv1.GrepRequest{Pattern: `^func \w+\(`, Include: []string{"*.go"}},
			[]match{{"src/main.go", 3}, {"src/util/util.go", 3}, {"src/util/util.go", 4}}, false, 2, 0},
		{"binary file skipped and counted", &sandboxv1.GrepRequest{Pattern: "func", Paths: []string{"src"}},
			[]match{{"src/main.go", 3}, {"src/notes.txt", 1}, {"src/util/util.go", 3}, {"src/util/util.go", 4}}, false, 3, 1},
		{"include by relative path", &sandboxv1.GrepRequest{Pattern: "func", Include: []string{"src/util/*.go"}},
			[]match{{"src/util/util.go", 3}, {"src/util/util.go", 4}}, false, 1, 0},
		{"exclude prunes a directory", &sandboxv1.GrepRequest{Pattern: "func", Paths: []string{"src"}, Exclude: []string{"util", "*.bin"}},
			[]match{{"src/main.go", 3}, {"src/notes.txt", 1}}, false, 2, 0},
		{"case insensitive", &sandboxv1.GrepRequest{Pattern: "hello world", CaseInsensitive: true},
			[]match{{"docs/README.md", 1}}, false, 5, 1},
		{"max matches truncates", &sandboxv1.GrepRequest{Pattern: `^error \d+$`, Paths: []string{"logs"}, MaxMatches: 10},
			[]match{{"logs/many.log", 1}, {"logs/many.log", 2}, {"logs/many.log", 3}, {"logs/many.log", 4}, {"logs/many.log", 5},
				{"logs/many.log", 6}, {"logs/many.log", 7}, {"logs/many.log", 8}, {"logs/many.log", 9}, {"logs/many.log", 10}}, true, 1, 0},
		{"explicit file", &sandboxv1.GrepRequest{Pattern: "Helper", Paths: []string{"src/util/util.go"}},
			[]match{{"src/util/util.go", 3}}, false, 1, 0},
	}
	for _, tc := range grepTests {
		t.Run("grep "+tc.name, func(t *testing.T) {
			resp, err := c.Grep(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []match
			for _, m := range resp.GetMatches() {
				got = append(got, match{m.GetPath(), m.GetLine()})
			}
			if !slices.Equal(got, tc.want) || resp.GetTruncated() != tc.truncated ||
				resp.GetFilesSearched() != tc.searched || resp.GetBinaryFilesSkipped() != tc.binary {
				t.Errorf("got %v truncated %v searched %d binary %d;\nwant %v truncated %v searched %d binary %d",
					got, resp.GetTruncated(), resp.GetFilesSearched(), resp.GetBinaryFilesSkipped(),
					tc.want, tc.truncated, tc.searched, tc.binary)
			}
		})
	}
	if resp, err := c.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "println", Paths: []string{"src/main.go"}}); err != nil ||
		len(resp.GetMatches()) != 1 || resp.GetMatches()[0].GetText() != "\tprintln(\"hello\")" {
		t.Errorf("grep match text: %v, %v", resp.GetMatches(), err)
	}
	for _, bad := range []struct {
		name string
		req  *sandboxv1.GrepRequest
		want codes.Code
	}{
		{"bad regexp", &sandboxv1.GrepRequest{Pattern: "("}, codes.InvalidArgument},
		{"backreference (not RE2)", &sandboxv1.GrepRequest{Pattern: `(a)\1`}, codes.InvalidArgument},
		{"bad include glob", &sandboxv1.GrepRequest{Pattern: "x", Include: []string{"["}}, codes.InvalidArgument},
		{"missing path", &sandboxv1.GrepRequest{Pattern: "x", Paths: []string{"nope"}}, codes.NotFound},
	} {
		_, err := c.Grep(ctx, bad.req)
		wantCode(t, "grep "+bad.name, err, bad.want)
	}

	findTests := []struct {
		name      string
		req       *sandboxv1.FindRequest
		want      []string
		truncated bool
	}{
		{"name glob", &sandboxv1.FindRequest{Name: "*.go"}, []string{"src/main.go", "src/util/util.go"}, false},
		{"directories", &sandboxv1.FindRequest{Type: sandboxv1.FileType_FILE_TYPE_DIR}, []string{"docs", "empty", "logs", "src", "src/util"}, false},
		{"depth 1", &sandboxv1.FindRequest{MaxDepth: 1}, []string{"docs", "empty", "logs", "src"}, false},
		{"depth 1 under src", &sandboxv1.FindRequest{Path: "src", MaxDepth: 1}, []string{"src/blob.bin", "src/main.go", "src/notes.txt", "src/util"}, false},
		{"files at depth 2", &sandboxv1.FindRequest{Type: sandboxv1.FileType_FILE_TYPE_FILE, MaxDepth: 2}, []string{"docs/README.md", "logs/many.log", "src/blob.bin", "src/main.go", "src/notes.txt"}, false},
		{"name and type that match nothing", &sandboxv1.FindRequest{Name: "*.go", Type: sandboxv1.FileType_FILE_TYPE_DIR}, nil, false},
		{"max results", &sandboxv1.FindRequest{Name: "*", MaxResults: 2}, []string{"docs", "docs/README.md"}, true},
	}
	for _, tc := range findTests {
		t.Run("find "+tc.name, func(t *testing.T) {
			resp, err := c.Find(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range resp.GetEntries() {
				got = append(got, e.GetPath())
			}
			if !slices.Equal(got, tc.want) || resp.GetTruncated() != tc.truncated {
				t.Errorf("got %q truncated %v, want %q truncated %v", got, resp.GetTruncated(), tc.want, tc.truncated)
			}
		})
	}
	_, err = c.Find(ctx, &sandboxv1.FindRequest{Name: "["})
	wantCode(t, "find with a bad glob", err, codes.InvalidArgument)
	_, err = c.Find(ctx, &sandboxv1.FindRequest{Path: "src/main.go"})
	wantCode(t, "find in a file", err, codes.FailedPrecondition)
}

func TestReadFilesPlan(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	files := []client.File{
		{Path: "p/a.txt", Data: []byte("aaaaaaaa")},
		{Path: "p/b.txt", Data: []byte("bbbbbbbb")},
		{Path: "p/c.md", Data: []byte("cccccccc")},
		{Path: "p/sub/d.txt", Data: []byte("dddddddd")},
		{Path: "p/big.txt", Data: bytes.Repeat([]byte("e"), 20)},
	}
	if _, err := c.WriteFiles(ctx, files, nil, nil); err != nil {
		t.Fatal(err)
	}

	got, st, err := c.ReadFiles(ctx, "p/*.txt", "missing.txt", "nomatch/*.x", "p/sub", "p/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := map[string]string{"p/a.txt": "aaaaaaaa", "p/b.txt": "bbbbbbbb", "p/big.txt": strings.Repeat("e", 20), "p/sub/d.txt": "dddddddd"}
	if len(got) != len(wantFiles) {
		t.Errorf("read %d files, want %d: %q", len(got), len(wantFiles), keys(got))
	}
	for p, d := range wantFiles {
		if string(got[p]) != d {
			t.Errorf("%s = %q, want %q", p, got[p], d)
		}
	}
	if !slices.Equal(st.Missing, []string{"missing.txt", "nomatch/*.x"}) || st.Batches != 1 || st.Streamed != 0 || st.Bytes != 44 {
		t.Errorf("ReadStats %+v; want missing [missing.txt nomatch/*.x], 1 batch, 0 streamed, 44 bytes", st)
	}

	// The raw plan with a small batch limit: 8-byte files two per batch, the 20-byte one streamed.
	plan, err := c.RPC().GetReadFilesPlan(ctx, &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"p/**"}, MaxBatchBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	var batched []string
	for _, bt := range plan.GetBatches() {
		if bt.GetTotalBytes() > 16 {
			t.Errorf("batch of %d bytes over the 16-byte limit", bt.GetTotalBytes())
		}
		for _, f := range bt.GetFiles() {
			batched = append(batched, f.GetPath())
		}
	}
	slices.Sort(batched)
	if !slices.Equal(batched, []string{"p/a.txt", "p/b.txt", "p/c.md", "p/sub/d.txt"}) || len(plan.GetBatches()) != 2 ||
		len(plan.GetStreamed()) != 1 || plan.GetStreamed()[0].GetPath() != "p/big.txt" || plan.GetTotalBytes() != 52 {
		t.Errorf("plan: batches %v streamed %v total %d; want 2 batches of the 8-byte files, p/big.txt streamed, 52 bytes",
			plan.GetBatches(), plan.GetStreamed(), plan.GetTotalBytes())
	}
	_, err = c.RPC().GetReadFilesPlan(ctx, &sandboxv1.GetReadFilesPlanRequest{Paths: []string{"p/[.txt"}})
	wantCode(t, "plan with a bad glob", err, codes.InvalidArgument)
	_, err = c.RPC().ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"p"}})
	wantCode(t, "ReadFiles of a directory", err, codes.FailedPrecondition)
	_, err = c.RPC().ReadFiles(ctx, &sandboxv1.ReadFilesRequest{Paths: []string{"p/missing"}})
	wantCode(t, "ReadFiles of a missing file", err, codes.NotFound)
	data, err := c.ReadFile(ctx, "p/big.txt")
	if err != nil || string(data) != strings.Repeat("e", 20) {
		t.Errorf("ReadFile p/big.txt = %q, %v", data, err)
	}
}

func keys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
