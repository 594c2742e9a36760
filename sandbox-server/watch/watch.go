// Package watch reports the changes under a directory of the workspace (create, write, remove,
// rename) from the kernel's inotify, for the sandbox server's Watch call.
//
// Jail: a watched directory is never named to the kernel by its path. It is opened beneath the
// workspace root's descriptor with openat2 and RESOLVE_BENEATH (as package workspace opens
// every path), the directories of a recursive watch one name at a time without following
// symlinks, and the inotify watch is added through the open descriptor (/proc/self/fd/N), so
// "..", absolute paths and symlinks cannot place a watch outside the workspace, even when a
// directory is swapped for a symlink concurrently.
//
// Delivery: a goroutine per Watcher reads the inotify descriptor and pushes changes into a
// bounded queue, where writes to a path whose event is still queued are coalesced into it.
// When the queue is full further changes are dropped and counted, and an overflow event
// carrying the count is delivered before the next change; the kernel's own overflow
// (IN_Q_OVERFLOW) is an overflow event too. Nothing is dropped silently.
//
// Limits: a Root allows MaxWatches watchers at once (ErrLimit beyond), each with a queue of at
// most MaxQueue changes. Close releases everything a Watcher holds: its inotify descriptor,
// its goroutine and its place under the limit.
package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"

	"golang.org/x/sys/unix"
)

// Defaults for zero Options fields.
const (
	DefaultMaxWatches = 16
	DefaultMaxQueue   = 65536
	DefaultQueue      = 4096
	// maxDepth bounds how deep a recursive watch descends (as package workspace's walks):
	// each level holds a directory descriptor open while the tree is scanned.
	maxDepth = 256
)

var (
	// ErrLimit reports a watch beyond Options.MaxWatches.
	ErrLimit = errors.New("too many watches")
	// ErrInvalid reports a malformed request: a bad glob.
	ErrInvalid = errors.New("invalid watch request")
)

// Kind is what happened to a path.
type Kind int

// The kinds of change.
const (
	// Create: a file or directory appeared (created, hard-linked, or found in a directory
	// of a recursive watch that appeared).
	Create Kind = iota + 1
	// Write: a file was modified, or closed after being opened for writing.
	Write
	// Remove: a file or directory was removed, or moved out of the watched tree (also the
	// watched directory itself, the stream's last event).
	Remove
	// Rename: a file or directory was renamed within the watched tree (OldPath set) or moved
	// into it (OldPath empty).
	Rename
)

func (k Kind) String() string {
	switch k {
	case Create:
		return "create"
	case Write:
		return "write"
	case Remove:
		return "remove"
	case Rename:
		return "rename"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// Change is one change, or several coalesced (Count).
type Change struct {
	// Path is relative to the workspace root, as OldPath.
	Path    string
	Kind    Kind
	IsDir   bool
	OldPath string
	// Count is how many of the kernel's events this change stands for (at least 1).
	Count uint64
}

// Overflow reports lost changes.
type Overflow struct {
	// Dropped is how many changes the full queue dropped.
	Dropped uint64
	// Unknown: the kernel's queue overflowed; how many changes it lost is not known.
	Unknown bool
}

// Event is a Change or an Overflow (exactly one is set).
type Event struct {
	Change   *Change
	Overflow *Overflow
}

// Options configure New. Dir, Resolve and Escape are required: together they decide what a
// client can watch.
type Options struct {
	// Dir is the workspace root as this process sees it.
	Dir string
	// Resolve checks a client path lexically and returns it relative to Dir ("." for Dir
	// itself), as the workspace's other calls do (workspace.Workspace.Resolve).
	Resolve func(p string) (string, error)
	// Escape is the error that reports a path leaving the workspace (workspace.ErrEscape):
	// the kernel's refusal (EXDEV) is reported wrapping it.
	Escape error
	// MaxWatches bounds the watchers open at once (DefaultMaxWatches if 0).
	MaxWatches int
	// MaxQueue caps a request's queue size (DefaultMaxQueue if 0); DefaultQueue (or MaxQueue,
	// if smaller) applies to a request without one.
	MaxQueue int
	// TempPrefix, if set, starts the names of the workspace's in-flight writes (a file written
	// under such a name, then renamed into place): their own changes are not reported, and the
	// rename is reported as the creation of its target, so that a watcher sees one create of
	// the file the agent wrote.
	TempPrefix string
}

// Root places watches inside one workspace. It is safe for concurrent use.
type Root struct {
	opts Options
	fd   int // the workspace root, O_PATH

	mu     sync.Mutex // guards active
	active int
}

// New opens the workspace root opts.Dir.
func New(opts Options) (*Root, error) {
	switch {
	case opts.Dir == "":
		return nil, errors.New("watch: the workspace directory is required")
	case opts.Resolve == nil:
		return nil, errors.New("watch: a path resolver is required")
	case opts.Escape == nil:
		return nil, errors.New("watch: the escape error is required")
	case opts.MaxWatches < 0 || opts.MaxQueue < 0:
		return nil, errors.New("watch: negative limit")
	}
	if opts.MaxWatches == 0 {
		opts.MaxWatches = DefaultMaxWatches
	}
	if opts.MaxQueue == 0 {
		opts.MaxQueue = DefaultMaxQueue
	}
	fd, err := unix.Open(opts.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: opts.Dir, Err: err}
	}
	return &Root{opts: opts, fd: fd}, nil
}

// Close closes the root's descriptor. Watchers already open keep working.
func (r *Root) Close() error {
	return unix.Close(r.fd)
}

// Request is what to watch.
type Request struct {
	// Path names a directory (empty: the workspace root).
	Path      string
	Recursive bool
	// Include and Exclude are globs (path.Match) on base names; see the package proto's
	// WatchRequest.
	Include, Exclude []string
	// QueueSize is the most changes held at once (0: the default), capped at MaxQueue.
	QueueSize int
}

// Watch places the watches of req and returns once they are all in place: a change made
// after it returns is reported. Errors: ErrInvalid (a bad glob or queue size), what
// Options.Resolve returns, Options.Escape (wrapped) for a path the kernel refuses as leaving
// the workspace, fs.ErrNotExist, syscall.ENOTDIR, ErrLimit (MaxWatches watchers open). The
// caller must Close the Watcher.
func (r *Root) Watch(req Request) (*Watcher, error) {
	for _, g := range append(append([]string(nil), req.Include...), req.Exclude...) {
		if _, err := path.Match(g, ""); err != nil || g == "" {
			return nil, fmt.Errorf("%w: glob %q", ErrInvalid, g)
		}
	}
	if req.QueueSize < 0 {
		return nil, fmt.Errorf("%w: negative queue size", ErrInvalid)
	}
	p := req.Path
	if p == "" {
		p = "."
	}
	rel, err := r.opts.Resolve(p)
	if err != nil {
		return nil, err
	}
	size := req.QueueSize
	if size == 0 {
		size = DefaultQueue
	}
	size = min(size, r.opts.MaxQueue)

	r.mu.Lock()
	if r.active >= r.opts.MaxWatches {
		r.mu.Unlock()
		return nil, fmt.Errorf("watching %q: %w (%d at once)", rel, ErrLimit, r.opts.MaxWatches)
	}
	r.active++
	r.mu.Unlock()
	w, err := r.start(rel, req, size)
	if err != nil {
		r.release()
		return nil, fmt.Errorf("watching %q: %w", rel, err)
	}
	return w, nil
}

func (r *Root) release() {
	r.mu.Lock()
	r.active--
	r.mu.Unlock()
}

// start opens rel, sets up the inotify descriptor and its watches, and starts the reader.
func (r *Root) start(rel string, req Request, size int) (*Watcher, error) {
	dfd, err := openat2(r.fd, rel, unix.O_RDONLY|unix.O_DIRECTORY, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_MAGICLINKS)
	if err != nil {
		return nil, r.openErr(rel, err)
	}
	defer unix.Close(dfd)
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating an inotify instance: %w", err)
	}
	w := &Watcher{
		root:      r,
		rel:       rel,
		recursive: req.Recursive,
		include:   req.Include,
		exclude:   req.Exclude,
		q:         newQueue(size),
		file:      os.NewFile(uintptr(ifd), "inotify"),
		dirs:      make(map[int32]string),
		wds:       make(map[string]int32),
		done:      make(chan struct{}),
		QueueSize: size,
	}
	if err := w.addTree(dfd, rel, 0, false); err != nil {
		w.file.Close()
		return nil, err
	}
	go w.read()
	return w, nil
}

// openErr describes a failed open of rel beneath the root: EXDEV, the kernel's verdict on a
// path leaving the workspace, wraps Options.Escape.
func (r *Root) openErr(rel string, err error) error {
	if err == unix.EXDEV {
		return &fs.PathError{Op: "openat2", Path: rel, Err: r.opts.Escape}
	}
	return &fs.PathError{Op: "openat2", Path: rel, Err: err}
}

// Watcher delivers the changes of one watch. Next may be called from one goroutine at a time;
// Close from any.
type Watcher struct {
	// QueueSize is the queue size in effect.
	QueueSize int

	root             *Root
	rel              string // the watched directory, relative to the workspace root
	recursive        bool
	include, exclude []string
	q                *queue
	file             *os.File // the inotify descriptor, closed by Close
	done             chan struct{}
	closeOnce        sync.Once
	rootWd           int32 // the watched directory's own watch

	// Owned by the reader goroutine once Watch has returned (set up by start before).
	dirs  map[int32]string // watch descriptor -> directory, relative to the workspace
	wds   map[string]int32 // the inverse
	moved *movedFrom       // a move out of a watched directory not yet paired with its arrival
}

// movedFrom is an IN_MOVED_FROM waiting for the IN_MOVED_TO with its cookie.
type movedFrom struct {
	cookie uint32
	path   string
	isDir  bool
}

// Next waits for the next event. It returns io.EOF after the watched directory's own Remove
// event (it was removed or moved away), the reader's error if reading inotify failed, and
// ctx's error if ctx ends first.
func (w *Watcher) Next(ctx context.Context) (Event, error) {
	return w.q.pop(ctx)
}

// Close ends the watch: it closes the inotify descriptor, waits for the reader goroutine to
// return and releases the watch's place under the limit. Idempotent.
func (w *Watcher) Close() error {
	w.closeOnce.Do(func() {
		w.file.Close() // the reader's pending read returns os.ErrClosed
		<-w.done
		w.root.release()
	})
	return nil
}

// errClosed ends the queue of a watcher whose descriptor was closed.
var errClosed = fmt.Errorf("watch closed: %w", io.ErrClosedPipe)
