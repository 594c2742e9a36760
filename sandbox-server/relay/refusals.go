package relay

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// refusalSummaryEvery is the least time between two log lines of one cause of refusal.
// A variable for tests.
var refusalSummaryEvery = time.Minute

// refusals logs the connections the relay could not pass on, counted rather than a line each:
// the first of each cause is logged at once, the later ones are summed up in one line per
// cause at most every refusalSummaryEvery. The sandbox server's log is a file on the host, and
// a bound sandbox outlives a stopped manager: with the proxy gone, every connection a command
// opens is refused, and a line each would let the sandbox grow that file as fast as it can
// connect. Causes are few (an errno, a timeout), so their number is bounded.
type refusals struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex // guards causes (and what they point to) and closed
	causes map[refusalKey]*refusalCause
	closed bool
}

// refusalKey is one kind of refusal: its message and cause.
type refusalKey struct{ msg, cause string }

type refusalCause struct {
	refusalKey
	counted int         // refusals since the cause's last line
	total   int         // refusals of the cause in all
	last    time.Time   // the cause's last line
	timer   *time.Timer // the pending summary, nil if none
}

func newRefusals(log *slog.Logger) *refusals {
	return &refusals{log: log, every: refusalSummaryEvery, causes: map[refusalKey]*refusalCause{}}
}

// refusalCauseOf names err's cause: its errno ("connection refused", "no such file or
// directory"), "timeout", or "other".
func refusalCauseOf(err error) string {
	var errno syscall.Errno
	var ne net.Error
	switch {
	case errors.As(err, &errno):
		return errno.Error()
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return "other"
	}
}

// add records one refusal described by msg and err (the cause is refusalCauseOf(err)); attrs
// go on its first line only.
func (r *refusals) add(msg string, err error, attrs ...any) {
	k := refusalKey{msg, refusalCauseOf(err)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	c := r.causes[k]
	if c == nil {
		r.causes[k] = &refusalCause{refusalKey: k, total: 1, last: time.Now()}
		r.log.Warn(msg, append(attrs, "err", err, "cause", k.cause,
			"note", "further refusals of this cause are counted and logged at most every "+r.every.String())...)
		return
	}
	c.counted++
	c.total++
	if c.timer == nil {
		c.timer = time.AfterFunc(max(time.Until(c.last.Add(r.every)), 0), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if !r.closed {
				r.summarise(c)
			}
		})
	}
}

// summarise logs c's count since its last line. Called with r.mu held.
func (r *refusals) summarise(c *refusalCause) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.counted == 0 {
		return
	}
	r.log.Warn(c.msg, "cause", c.cause, "refused", c.counted, "since", time.Since(c.last).Round(time.Millisecond), "refused_in_all", c.total)
	c.counted = 0
	c.last = time.Now()
}

// close logs every pending summary at once and stops logging.
func (r *refusals) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.causes {
		r.summarise(c)
	}
	r.closed = true
}
