package watch

import (
	"context"
	"sync"
)

// queue holds the events a Watcher has not yet delivered: at most max changes, coalesced, and
// overflow markers where changes were dropped. A marker does not count towards max (there is
// at most one between two changes, so the queue holds at most 2*max+1 entries).
type queue struct {
	max int

	mu      sync.Mutex
	items   []*Event          // guarded by mu; items[head:] are queued, oldest first
	head    int               // guarded by mu
	changes int               // guarded by mu: the changes in items[head:]
	last    map[string]*Event // guarded by mu: each path's latest queued change
	end     error             // guarded by mu: set once nothing more will be pushed
	wake    chan struct{}     // a token when something was pushed or the end was set
}

func newQueue(max int) *queue {
	return &queue{max: max, last: make(map[string]*Event), wake: make(chan struct{}, 1)}
}

// mergeable reports whether a write to a path whose latest queued change is e is added to e.
func mergeable(e *Event, c *Change) bool {
	return e != nil && c.Kind == Write && (e.Change.Kind == Write || e.Change.Kind == Create) && e.Change.IsDir == c.IsDir
}

// push queues c: a write is coalesced with the path's queued create or write; otherwise c is
// appended, or, with the queue full, dropped and counted in the overflow marker at the tail.
func (q *queue) push(c Change) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.Count == 0 {
		c.Count = 1
	}
	if e := q.last[c.Path]; mergeable(e, &c) {
		e.Change.Count += c.Count
		return
	}
	if q.changes >= q.max {
		q.overflowLocked().Dropped++
		return
	}
	e := &Event{Change: &c}
	q.items = append(q.items, e)
	q.changes++
	q.last[c.Path] = e
	q.signal()
}

// lost records that the kernel's queue overflowed.
func (q *queue) lost() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.overflowLocked().Unknown = true
}

// overflowLocked returns the overflow marker at the tail, appending one if the tail is a
// change (or the queue is empty). q.mu is held.
func (q *queue) overflowLocked() *Overflow {
	if n := len(q.items); n > q.head && q.items[n-1].Overflow != nil {
		return q.items[n-1].Overflow
	}
	o := &Overflow{}
	q.items = append(q.items, &Event{Overflow: o})
	q.signal()
	return o
}

// close records that nothing more will be pushed; pop returns err once the queue is empty.
func (q *queue) close(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.end == nil {
		q.end = err
		q.signal()
	}
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop waits for the oldest event and removes it. It returns the error given to close once the
// queue is empty, and ctx's error if ctx ends first.
func (q *queue) pop(ctx context.Context) (Event, error) {
	for {
		q.mu.Lock()
		if q.head < len(q.items) {
			e := q.items[q.head]
			q.items[q.head] = nil
			q.head++
			if q.head == len(q.items) {
				q.items, q.head = q.items[:0], 0
			} else if q.head >= 1024 && q.head*2 >= len(q.items) {
				q.items = append(q.items[:0], q.items[q.head:]...)
				q.head = 0
			}
			if e.Change != nil {
				q.changes--
				if q.last[e.Change.Path] == e {
					delete(q.last, e.Change.Path)
				}
			}
			q.mu.Unlock()
			return *e, nil
		}
		end := q.end
		q.mu.Unlock()
		if end != nil {
			return Event{}, end
		}
		select {
		case <-q.wake:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}
