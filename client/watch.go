package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// WatchOptions say what a watch reports.
type WatchOptions struct {
	// Recursive watches the whole tree below the path, directories made later included (and
	// what was created in one before its watch was in place is reported as created).
	Recursive bool
	// Include and Exclude are globs (path.Match: "*", "?", "[...]") on the base name of a
	// change's path: with Include only matching changes are reported, and changes matching
	// Exclude are not. A recursive watch does not descend into an excluded directory.
	Include, Exclude []string
	// QueueSize is the most changes the sandbox holds for the client at once (0: its
	// default); the sandbox caps it. Beyond it changes are dropped and an event with
	// Overflow set says how many.
	QueueSize int
}

// WatchKind is what happened to a path.
type WatchKind int

// The kinds of change.
const (
	// WatchCreate: a file or directory was created.
	WatchCreate WatchKind = iota + 1
	// WatchWrite: a file was written (or opened for writing and closed).
	WatchWrite
	// WatchRemove: a file or directory was removed, or moved out of the watched tree.
	WatchRemove
	// WatchRename: a file or directory was renamed within the tree (OldPath set), or moved
	// into it (OldPath empty).
	WatchRename
)

func (k WatchKind) String() string {
	switch k {
	case WatchCreate:
		return "create"
	case WatchWrite:
		return "write"
	case WatchRemove:
		return "remove"
	case WatchRename:
		return "rename"
	default:
		return fmt.Sprintf("WatchKind(%d)", int(k))
	}
}

// WatchEvent is one change, or, with Overflow set, a report of lost changes.
type WatchEvent struct {
	// Path (and OldPath, for a rename within the tree) are relative to the workspace root.
	Path    string
	Kind    WatchKind
	IsDir   bool
	OldPath string
	// Count is how many of the sandbox kernel's events the change stands for: writes to a
	// path whose event had not yet been sent are coalesced into it.
	Count uint64

	// Overflow: changes were lost before the events that follow (Dropped of them, or with
	// DroppedUnknown an unknown number, when the sandbox kernel's own queue overflowed).
	// Rescan what you watch if you must not miss a change.
	Overflow       bool
	Dropped        uint64
	DroppedUnknown bool
}

// Watcher is a watch's stream of events, read with Recv. Close it (or end the context it was
// started with) to stop watching.
type Watcher struct {
	stream sandboxv1.Sandbox_WatchClient
	cancel context.CancelFunc
	// QueueSize is the queue size the sandbox applies.
	QueueSize int
}

// Watch watches the directory path (empty: the workspace root) and returns once the
// sandbox's watches are in place: every change made after Watch returns is reported (or
// counted in an overflow). The path is jailed as every file call's is: a path leaving the
// workspace ("..", an absolute path elsewhere, a symlink leading out) fails with
// PermissionDenied, a missing one with NotFound, a file with FailedPrecondition; more
// watches at once than the sandbox allows (fusebox-sandbox -max-watches) fail with
// ResourceExhausted.
//
//	w, err := sb.Watch(ctx, "src", client.WatchOptions{Recursive: true, Include: []string{"*.go"}})
//	if err != nil {
//		return err
//	}
//	defer w.Close()
//	for {
//		ev, err := w.Recv()
//		if err != nil {
//			return err
//		}
//		fmt.Println(ev.Kind, ev.Path)
//	}
func (s *Sandbox) Watch(ctx context.Context, path string, opts WatchOptions) (*Watcher, error) {
	if opts.QueueSize < 0 {
		return nil, errors.New("watch: negative queue size")
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := s.rpc.Watch(ctx, &sandboxv1.WatchRequest{
		Path: path, Recursive: opts.Recursive, Include: opts.Include, Exclude: opts.Exclude,
		QueueSize: uint32(min(opts.QueueSize, 1<<31)),
	})
	if err == nil {
		var first *sandboxv1.WatchEvent
		if first, err = stream.Recv(); err == nil {
			if r := first.GetReady(); r != nil {
				return &Watcher{stream: stream, cancel: cancel, QueueSize: int(r.GetQueueSize())}, nil
			}
			err = errors.New("the first event is not the ready event")
		}
	}
	cancel()
	return nil, fmt.Errorf("watching %q: %w", path, err)
}

// Recv returns the next event. It returns io.EOF after the watched directory's own removal
// (WatchRemove of the path itself, the last event), and an error once the watcher is closed,
// its context ends or the connection breaks.
func (w *Watcher) Recv() (WatchEvent, error) {
	ev, err := w.stream.Recv()
	if err != nil {
		w.cancel()
		if errors.Is(err, io.EOF) {
			return WatchEvent{}, io.EOF
		}
		return WatchEvent{}, fmt.Errorf("watch: %w", err)
	}
	if o := ev.GetOverflow(); o != nil {
		return WatchEvent{Overflow: true, Dropped: o.GetDropped(), DroppedUnknown: o.GetUnknown()}, nil
	}
	c := ev.GetChange()
	if c == nil {
		return WatchEvent{}, errors.New("watch: an event that is neither a change nor an overflow")
	}
	return WatchEvent{Path: c.GetPath(), Kind: WatchKind(c.GetKind()), IsDir: c.GetIsDir(), OldPath: c.GetOldPath(), Count: c.GetCount()}, nil
}

// Close stops watching; the sandbox releases the watch. Recv then fails.
func (w *Watcher) Close() {
	w.cancel()
}
