package watch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusebox-dev/fusebox/internal/leakcheck"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
)

// newRoot returns a Root on a fresh workspace inside a parent directory that also holds an
// "outside" directory, so that escapes have somewhere to go. The test fails if goroutines
// started after it (the watchers' readers) outlive it.
func newRoot(t *testing.T, opts Options) (*Root, string) {
	t.Helper()
	leakcheck.Check(t)
	parent := t.TempDir()
	dir := filepath.Join(parent, "ws")
	for _, d := range []string{dir, filepath.Join(parent, "outside")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ws, err := workspace.Open(workspace.Options{Dir: dir, MountPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	opts.Dir, opts.Resolve, opts.Escape = dir, ws.Resolve, workspace.ErrEscape
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, dir
}

func watch(t *testing.T, r *Root, req Request) *Watcher {
	t.Helper()
	w, err := r.Watch(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// next returns the next change, failing on an overflow or an error.
func next(t *testing.T, w *Watcher) Change {
	t.Helper()
	ev, err := w.Next(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Change == nil {
		t.Fatalf("an overflow %+v, want a change", *ev.Overflow)
	}
	return *ev.Change
}

// collect reads changes until one satisfies stop, and returns them all.
func collect(t *testing.T, w *Watcher, stop func(Change) bool) []Change {
	t.Helper()
	var out []Change
	for {
		c := next(t, w)
		out = append(out, c)
		if stop(c) {
			return out
		}
	}
}

func write(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func has(cs []Change, want Change) bool {
	for _, c := range cs {
		if c.Path == want.Path && c.Kind == want.Kind && c.IsDir == want.IsDir && c.OldPath == want.OldPath {
			return true
		}
	}
	return false
}

func TestWatchKinds(t *testing.T) {
	r, dir := newRoot(t, Options{})
	if err := os.Mkdir(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := watch(t, r, Request{Path: "src", Recursive: true})

	write(t, filepath.Join(dir, "src/a"), "1")
	if err := os.Rename(filepath.Join(dir, "src/a"), filepath.Join(dir, "src/b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "src/b")); err != nil {
		t.Fatal(err)
	}
	// A directory made with a file in it at once: the file is reported whether it was
	// created before or after the directory's watch.
	if err := os.MkdirAll(filepath.Join(dir, "src/new/deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "src/new/deeper/f"), "x")
	// Moved out of the tree: a remove.
	write(t, filepath.Join(dir, "src/leaving"), "x")
	if err := os.Rename(filepath.Join(dir, "src/leaving"), filepath.Join(dir, "gone")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "src/end"), "")

	got := collect(t, w, func(c Change) bool { return c.Path == "src/end" })
	for _, want := range []Change{
		{Path: "src/a", Kind: Create},
		{Path: "src/b", Kind: Rename, OldPath: "src/a"},
		{Path: "src/b", Kind: Remove},
		{Path: "src/new", Kind: Create, IsDir: true},
		{Path: "src/new/deeper", Kind: Create, IsDir: true},
		{Path: "src/new/deeper/f", Kind: Create},
		{Path: "src/leaving", Kind: Remove},
	} {
		if !has(got, want) {
			t.Errorf("no %+v in %+v", want, got)
		}
	}
	for _, c := range got {
		if c.Count == 0 {
			t.Errorf("%+v: a zero count", c)
		}
	}

	// The watched directory removed: its own remove ends the stream.
	if err := os.RemoveAll(filepath.Join(dir, "src")); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := w.Next(ctx(t))
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Change != nil && ev.Change.Path == "src" && ev.Change.Kind != Remove {
			t.Errorf("the watched directory: %+v", *ev.Change)
		}
	}
}

func TestWatchNotRecursiveAndFilters(t *testing.T) {
	r, dir := newRoot(t, Options{})
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := watch(t, r, Request{Include: []string{"*.go", "end"}, Exclude: []string{"skip_*"}})
	write(t, filepath.Join(dir, "sub/deep.go"), "not watched: below a non-recursive watch")
	write(t, filepath.Join(dir, "a.txt"), "not included")
	write(t, filepath.Join(dir, "skip_me.go"), "excluded")
	write(t, filepath.Join(dir, "b.go"), "reported")
	write(t, filepath.Join(dir, "end"), "")
	got := collect(t, w, func(c Change) bool { return c.Path == "end" })
	if len(got) != 2 || got[0].Path != "b.go" || got[0].Kind != Create {
		t.Errorf("got %+v, want the create of b.go (writes coalesced), then end", got)
	}
}

func TestWatchExcludedDirectoryNotWatched(t *testing.T) {
	r, dir := newRoot(t, Options{})
	w := watch(t, r, Request{Recursive: true, Exclude: []string{"node_modules"}})
	if err := os.MkdirAll(filepath.Join(dir, "node_modules/x"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "node_modules/x/f"), "")
	write(t, filepath.Join(dir, "end"), "")
	got := collect(t, w, func(c Change) bool { return c.Path == "end" })
	if len(got) != 1 {
		t.Errorf("got %+v, want only end", got)
	}
}

// TestCoalesce: writes to a path whose change is queued are added to it; a create followed by
// writes stays a create; a change already delivered is not added to.
func TestCoalesce(t *testing.T) {
	q := newQueue(10)
	q.push(Change{Path: "a", Kind: Create})
	for range 5 {
		q.push(Change{Path: "a", Kind: Write})
		q.push(Change{Path: "b", Kind: Write})
	}
	q.push(Change{Path: "a", Kind: Remove})
	q.push(Change{Path: "a", Kind: Write}) // after the remove: a new change
	want := []Change{
		{Path: "a", Kind: Create, Count: 6},
		{Path: "b", Kind: Write, Count: 5},
		{Path: "a", Kind: Remove, Count: 1},
		{Path: "a", Kind: Write, Count: 1},
	}
	for _, w := range want {
		ev, err := q.pop(ctx(t))
		if err != nil || ev.Change == nil || *ev.Change != w {
			t.Fatalf("got %+v %v, want %+v", ev.Change, err, w)
		}
	}
	q.push(Change{Path: "b", Kind: Write})
	if ev, _ := q.pop(ctx(t)); ev.Change.Count != 1 {
		t.Errorf("a write after delivery: %+v, want a new change", *ev.Change)
	}
}

// TestQueueOverflow: beyond the bound changes are dropped and counted, and the overflow comes
// before the next change; the kernel's overflow is one too.
func TestQueueOverflow(t *testing.T) {
	q := newQueue(2)
	for i := range 5 {
		q.push(Change{Path: fmt.Sprint(i), Kind: Create})
	}
	ev, _ := q.pop(ctx(t))
	if ev.Change == nil || ev.Change.Path != "0" {
		t.Fatalf("first: %+v", ev)
	}
	q.push(Change{Path: "later", Kind: Create}) // room again: queued after the overflow
	q.lost()
	q.push(Change{Path: "last", Kind: Create})
	q.close(io.EOF)
	var got []string
	for {
		ev, err := q.pop(ctx(t))
		if errors.Is(err, io.EOF) {
			break
		}
		if ev.Overflow != nil {
			got = append(got, fmt.Sprintf("overflow(%d,%v)", ev.Overflow.Dropped, ev.Overflow.Unknown))
		} else {
			got = append(got, ev.Change.Path)
		}
	}
	// "last" found the queue full again (1 and later): dropped, counted in the kernel's marker.
	want := fmt.Sprint([]string{"1", "overflow(3,false)", "later", "overflow(1,true)"})
	if fmt.Sprint(got) != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestWatchOverflowEndToEnd: a tiny queue and a burst of creates report the drop with its
// count, and every change is accounted for.
func TestWatchOverflowEndToEnd(t *testing.T) {
	r, dir := newRoot(t, Options{})
	w := watch(t, r, Request{QueueSize: 4})
	const n = 50
	for i := range n {
		write(t, filepath.Join(dir, fmt.Sprint("f", i)), "")
	}
	// An end marker may be dropped too: after each overflow, another one.
	var changes, dropped uint64
	marker := 0
	write(t, filepath.Join(dir, "end0"), "")
	for {
		ev, err := w.Next(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Overflow != nil {
			dropped += ev.Overflow.Dropped
			marker++
			write(t, filepath.Join(dir, fmt.Sprint("end", marker)), "")
			continue
		}
		if ev.Change.Path == fmt.Sprint("end", marker) {
			break
		}
		if len(ev.Change.Path) < 3 || ev.Change.Path[:3] != "end" {
			changes++
		}
	}
	if dropped == 0 || changes+dropped < n {
		t.Errorf("%d changes and %d dropped of %d creates", changes, dropped, n)
	}
}

func TestKernelOverflow(t *testing.T) {
	r, _ := newRoot(t, Options{})
	w := watch(t, r, Request{})
	b := make([]byte, unix.SizeofInotifyEvent)
	binary.NativeEndian.PutUint32(b[0:], ^uint32(0)) // wd -1
	binary.NativeEndian.PutUint32(b[4:], unix.IN_Q_OVERFLOW)
	if err := w.handle(b); err != nil {
		t.Fatal(err)
	}
	ev, err := w.Next(ctx(t))
	if err != nil || ev.Overflow == nil || !ev.Overflow.Unknown {
		t.Fatalf("got %+v %v, want an overflow of unknown size", ev, err)
	}
}

func TestWatchRefusals(t *testing.T) {
	r, dir := newRoot(t, Options{})
	parent := filepath.Dir(dir)
	for _, l := range [][2]string{{"../outside", "out"}, {"/", "root"}, {"in-target", "in"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(dir, "file"), "")
	for _, c := range []struct {
		path string
		want error
	}{
		{"../outside", workspace.ErrEscape},
		{"a/../../outside", workspace.ErrEscape},
		{"/etc", workspace.ErrEscape},
		{filepath.Join(parent, "outside"), workspace.ErrEscape},
		{"out", workspace.ErrEscape},
		{"out/x", workspace.ErrEscape},
		{"root/etc", workspace.ErrEscape},
		{"missing", fs.ErrNotExist},
		{"in", fs.ErrNotExist}, // a dangling link inside
		{"file", syscall.ENOTDIR},
	} {
		w, err := r.Watch(Request{Path: c.path})
		if err == nil {
			w.Close()
		}
		if !errors.Is(err, c.want) {
			t.Errorf("watch %q: %v, want %v", c.path, err, c.want)
		}
	}
	for _, req := range []Request{{Include: []string{"["}}, {Exclude: []string{""}}, {QueueSize: -1}} {
		if _, err := r.Watch(req); !errors.Is(err, ErrInvalid) {
			t.Errorf("watch %+v: %v, want ErrInvalid", req, err)
		}
	}
	// The absolute path of the workspace itself is the root.
	w := watch(t, r, Request{Path: dir})
	write(t, filepath.Join(dir, "x"), "")
	if c := next(t, w); c.Path != "x" {
		t.Errorf("got %+v", c)
	}
}

// TestWatchLimitAndLeaks: the limit refuses at once; closing a watcher releases its place, its
// descriptor and its goroutine.
func TestWatchLimitAndLeaks(t *testing.T) {
	r, _ := newRoot(t, Options{MaxWatches: 2})
	g0, fds0 := runtime.NumGoroutine(), countFDs(t)
	a, err := r.Watch(Request{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Watch(Request{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Watch(Request{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("a third watch with MaxWatches 2: %v, want ErrLimit", err)
	}
	// A Next in progress returns when the watcher is closed.
	done := make(chan error, 1)
	go func() { _, err := a.Next(context.Background()); done <- err }()
	a.Close()
	if err := <-done; !errors.Is(err, errClosed) {
		t.Errorf("Next across Close: %v", err)
	}
	a.Close() // idempotent
	c, err := r.Watch(Request{})
	if err != nil {
		t.Fatalf("after a Close: %v", err)
	}
	b.Close()
	c.Close()
	// Close has waited for each reader; the goroutine above may still be on its way out
	// (leakcheck waits for it).
	if g := runtime.NumGoroutine(); g > g0+1 {
		t.Errorf("after closing every watcher: %d goroutines, %d before", g, g0)
	}
	if fds := countFDs(t); fds != fds0 {
		t.Errorf("after closing every watcher: %d descriptors, %d before", fds, fds0)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestWatchHidesInFlightWrites: a file written under the workspace's temporary name and
// renamed into place, as the workspace writes files, is one create of its target; the
// temporary name never shows.
func TestWatchHidesInFlightWrites(t *testing.T) {
	r, dir := newRoot(t, Options{TempPrefix: workspace.TempPrefix})
	w := watch(t, r, Request{Path: "."})
	tmp := filepath.Join(dir, workspace.TempPrefix+"x1")
	write(t, tmp, "data")
	if err := os.Rename(tmp, filepath.Join(dir, "main.py")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "after"), "x")
	cs := collect(t, w, func(c Change) bool { return c.Path == "after" })
	for _, c := range cs {
		if strings.Contains(c.Path+c.OldPath, workspace.TempPrefix) {
			t.Errorf("a change of the temporary name: %+v", c)
		}
	}
	if !has(cs, Change{Path: "main.py", Kind: Create}) {
		t.Errorf("changes %+v, want a create of main.py", cs)
	}
}
