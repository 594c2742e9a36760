package dataplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// writesPy makes a subdirectory of the watched tree (after the watch started), opens five
// files (three in the tree, two in the new subdirectory) and writes each 200 times, one
// write system call at a time: 1,000 writes. It then creates "done". (The sandbox's kernel
// merges a write into an identical one still unread, as Linux does; the server coalesces
// the rest: a write into its path's create or write still queued.)
const writesPy = `
import os
os.chdir('tree')
os.mkdir('sub')
fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for p in ('a', 'b', 'c', 'sub/d', 'sub/e')]
for fd in fds:
    for i in range(200):
        os.write(fd, b'%d\n' % i)
for fd in fds:
    os.close(fd)
open('done', 'w').close()
`

// watchUntil reads w's events until one is a change of path, failing on an error.
func watchUntil(t *testing.T, w *client.Watcher, path string) []client.WatchEvent {
	t.Helper()
	var evs []client.WatchEvent
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("waiting for a change of %s: %v (after %d events)", path, err, len(evs))
		}
		evs = append(evs, ev)
		if !ev.Overflow && ev.Path == path {
			return evs
		}
	}
}

// TestWatchCoalescesWrites: 1,000 writes to five files of a recursively watched tree, two of
// them in a directory made after the watch started, are all reported (every path, no
// overflow below the queue's bound), coalesced into fewer than 1,000 events.
func TestWatchCoalescesWrites(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	sandboxtest.Sh(t, ctx, c, "mkdir tree")
	w, err := c.Watch(ctx, "tree", client.WatchOptions{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := c.Exec(ctx, client.Command{Argv: []string{"python3", "-c", writesPy}}); err != nil {
		t.Fatal(err)
	}
	evs := watchUntil(t, w, "tree/done")

	seen := map[string]client.WatchEvent{}
	var raw uint64
	for _, ev := range evs {
		if ev.Overflow {
			t.Fatalf("an overflow (%+v) with %d events queued at most", ev, w.QueueSize)
		}
		if ev.Count == 0 {
			t.Errorf("%+v: a zero count", ev)
		}
		raw += ev.Count
		if _, ok := seen[ev.Path]; !ok {
			seen[ev.Path] = ev
		}
	}
	for _, p := range []string{"tree/a", "tree/b", "tree/c", "tree/sub/d", "tree/sub/e"} {
		if ev, ok := seen[p]; !ok || ev.Kind != client.WatchCreate {
			t.Errorf("%s: first event %+v (seen: %v), want its create", p, ev, ok)
		}
	}
	if ev := seen["tree/sub"]; ev.Kind != client.WatchCreate || !ev.IsDir {
		t.Errorf("tree/sub: %+v, want the create of a directory", ev)
	}
	merged := 0
	for _, ev := range evs {
		if ev.Count > 1 {
			merged++
		}
	}
	if len(evs) >= 1000 || merged == 0 {
		t.Errorf("%d events for 1,000 writes, %d of them with a count above 1: not coalesced", len(evs), merged)
	}
	t.Logf("%d events standing for %d of the kernel's", len(evs), raw)
}

// TestWatchOverflow: a queue of one change and a burst of 2,000 creates: the changes beyond
// the queue are dropped and an overflow event says how many.
func TestWatchOverflow(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	sandboxtest.Sh(t, ctx, c, "mkdir burst")
	w, err := c.Watch(ctx, "burst", client.WatchOptions{QueueSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.QueueSize != 1 {
		t.Errorf("queue size %d, want 1", w.QueueSize)
	}
	sandboxtest.Sh(t, ctx, c, "cd burst && touch $(seq -f f%g 2000)")
	var changes int
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("after %d changes and no overflow: %v", changes, err)
		}
		if ev.Overflow {
			if ev.Dropped == 0 && !ev.DroppedUnknown {
				t.Errorf("an overflow without a count: %+v", ev)
			}
			t.Logf("overflow: %d dropped after %d changes", ev.Dropped, changes)
			return
		}
		changes++
	}
}

// TestWatchRefusals: a watch leaving the workspace is refused with the jail's code (Stat's
// for the same path), a missing path with NotFound, a file with FailedPrecondition, bad
// globs with InvalidArgument.
func TestWatchRefusals(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	sandboxtest.Sh(t, ctx, c, "ln -s /etc out && ln -s .. up && mkdir d && ln -s ../../tmp d/deep && touch file")
	for _, p := range []string{"../x", "/etc", "out", "up", "d/deep", "d/../../etc"} {
		_, err := c.Watch(ctx, p, client.WatchOptions{})
		wantCode(t, "watch "+p, err, codes.PermissionDenied)
		_, serr := c.Stat(ctx, p, true)
		if codeOf(serr) != codeOf(err) {
			t.Errorf("%s: watch refused with %v, Stat with %v", p, codeOf(err), codeOf(serr))
		}
	}
	_, err := c.Watch(ctx, "missing", client.WatchOptions{})
	wantCode(t, "watch of a missing path", err, codes.NotFound)
	_, err = c.Watch(ctx, "file", client.WatchOptions{})
	wantCode(t, "watch of a file", err, codes.FailedPrecondition)
	_, err = c.Watch(ctx, "", client.WatchOptions{Include: []string{"["}})
	wantCode(t, "a bad glob", err, codes.InvalidArgument)
	// The workspace's absolute path is inside.
	w, err := c.Watch(ctx, "/workspace/d", client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// TestWatchLimitAndLeaks: the sandbox's watch limit fails at once with ResourceExhausted;
// a watch whose stream is cancelled releases its place, and once all are closed the server's
// goroutines are back to where they were.
func TestWatchLimitAndLeaks(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{ServerArgs: []string{"-max-watches=2"}})
	ctx := testenv.Context(t, 2*time.Minute)
	c := b.Client
	baseline := goroutines(t, ctx, c)

	wctx, cancel := context.WithCancel(ctx)
	first, err := c.Watch(wctx, "", client.WatchOptions{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Watch(ctx, "", client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Watch(ctx, "", client.WatchOptions{})
	wantCode(t, "a third watch with -max-watches=2", err, codes.ResourceExhausted)
	if n := goroutines(t, ctx, c); n <= baseline {
		t.Errorf("%d goroutines with two watches open, %d before: the count does not see them", n, baseline)
	}

	cancel() // the first stream's context: the sandbox ends that watch
	if _, err := first.Recv(); codeOf(err) != codes.Canceled {
		t.Errorf("Recv after the cancel: %v, want Canceled", err)
	}
	sandboxtest.Eventually(t, 30*time.Second, "a place free again after a cancelled watch", func() (bool, string) {
		w, err := c.Watch(ctx, "", client.WatchOptions{})
		if err != nil {
			return false, err.Error()
		}
		w.Close()
		return true, ""
	})
	sandboxtest.Sh(t, ctx, c, "touch x")
	watchUntil(t, second, "x") // the remaining watch still reports
	second.Close()
	sandboxtest.Eventually(t, 30*time.Second, "the server's goroutines back to the baseline", func() (bool, string) {
		n := goroutines(t, ctx, c)
		return n <= baseline, fmt.Sprintf("%d goroutines, %d at the start", n, baseline)
	})
}
