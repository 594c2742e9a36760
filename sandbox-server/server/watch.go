package server

import (
	"context"
	"errors"
	"fmt"
	"io"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/sandbox-server/watch"
)

// Watch serves one watch (package watch): the ready event once the watches are in place, then
// the changes and overflows as they come, until the client cancels or the watched directory
// is gone (the stream then ends cleanly after its remove). The watch is closed when the call
// returns, whatever the reason: its inotify descriptor, its goroutine and its place under
// the limit go with it.
func (d *dataService) Watch(req *sandboxv1.WatchRequest, stream sandboxv1.Sandbox_WatchServer) error {
	return toStatus(serveWatch(stream.Context(), d.watch, req, stream.Send))
}

func serveWatch(ctx context.Context, root *watch.Root, req *sandboxv1.WatchRequest, send func(*sandboxv1.WatchEvent) error) error {
	w, err := root.Watch(watch.Request{
		Path: req.GetPath(), Recursive: req.GetRecursive(),
		Include: req.GetInclude(), Exclude: req.GetExclude(), QueueSize: int(req.GetQueueSize()),
	})
	if err != nil {
		return err
	}
	defer w.Close()
	ready := &sandboxv1.WatchEvent{Event: &sandboxv1.WatchEvent_Ready{Ready: &sandboxv1.WatchReady{QueueSize: uint32(w.QueueSize)}}}
	if err := send(ready); err != nil {
		return err
	}
	for {
		ev, err := w.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(watchEvent(ev)); err != nil {
			return fmt.Errorf("sending a watch event: %w", err)
		}
	}
}

// watchEvent is ev as the protocol carries it.
func watchEvent(ev watch.Event) *sandboxv1.WatchEvent {
	if o := ev.Overflow; o != nil {
		return &sandboxv1.WatchEvent{Event: &sandboxv1.WatchEvent_Overflow{Overflow: &sandboxv1.WatchOverflow{Dropped: o.Dropped, Unknown: o.Unknown}}}
	}
	c := ev.Change
	return &sandboxv1.WatchEvent{Event: &sandboxv1.WatchEvent_Change{Change: &sandboxv1.WatchChange{
		Path: c.Path, Kind: watchKinds[c.Kind], IsDir: c.IsDir, OldPath: c.OldPath, Count: c.Count,
	}}}
}

var watchKinds = map[watch.Kind]sandboxv1.WatchChangeKind{
	watch.Create: sandboxv1.WatchChangeKind_WATCH_CHANGE_KIND_CREATE,
	watch.Write:  sandboxv1.WatchChangeKind_WATCH_CHANGE_KIND_WRITE,
	watch.Remove: sandboxv1.WatchChangeKind_WATCH_CHANGE_KIND_REMOVE,
	watch.Rename: sandboxv1.WatchChangeKind_WATCH_CHANGE_KIND_RENAME,
}
