package kubealloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Backoff bounds the retries of transient API errors. Attempt n+1 waits Initial·2^(n-1),
// capped at Max, with jitter (between half and all of it), or longer when the server asked
// for a longer delay (Retry-After); no attempt starts after Steps attempts or once ctx ends.
type Backoff struct {
	Initial, Max time.Duration
	// Steps is the number of attempts in all (1: no retry).
	Steps int
}

// DefaultBackoff is 6 attempts, waits from 50 ms to 2 s (about 2.5 s in all before jitter).
func DefaultBackoff() Backoff {
	return Backoff{Initial: 50 * time.Millisecond, Max: 2 * time.Second, Steps: 6}
}

// transient reports whether err may go away on its own (the API server is overloaded,
// restarting or timed out, or the connection broke) and how long the server asked the client
// to wait (0 if it did not). Errors that repeat identically (forbidden, invalid, not found,
// conflict) are not transient. A transient error on a write says nothing about whether the
// write was applied: the callers of retrier.do resolve that (see do's retried result).
func transient(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	var delay time.Duration
	if s, ok := apierrors.SuggestsClientDelay(err); ok && s > 0 {
		delay = time.Duration(s) * time.Second
	}
	switch {
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err):
		return delay, true
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsHTTP2ConnectionLost(err),
		errors.Is(err, io.ErrUnexpectedEOF):
		return 0, true
	}
	return 0, false
}

// retrier runs API calls with Backoff. sleep is replaced in tests.
type retrier struct {
	b     Backoff
	sleep func(context.Context, time.Duration) error
}

func newRetrier(b Backoff) retrier {
	d := DefaultBackoff()
	if b.Steps <= 0 {
		b.Steps = d.Steps
	}
	if b.Initial <= 0 {
		b.Initial = d.Initial
	}
	if b.Max <= 0 {
		b.Max = d.Max
	}
	b.Max = max(b.Max, b.Initial)
	return retrier{b: b, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// do runs op until it returns nil or an error that is not transient, Steps attempts have
// been made, or ctx ends (it does not start a wait that would outlast ctx's deadline). Use it
// only for operations that are safe to repeat: reads, deletes (NotFound then means done),
// server-side apply, creates with a fixed name, updates guarded by a resourceVersion.
//
// retried reports that an attempt failed transiently before the one whose error is returned:
// that attempt may have been applied with its response lost, so an AlreadyExists or Conflict
// returned now may be the echo of this caller's own write. The caller re-reads the object
// and decides. A transient error that outlasted the attempts is returned wrapped with how
// many attempts were made; its API status stays reachable with errors.As / apierrors.IsX.
func (r retrier) do(ctx context.Context, op func(context.Context) error) (retried bool, err error) {
	wait := r.b.Initial
	for attempt := 1; ; attempt++ {
		err = op(ctx)
		delay, ok := transient(err)
		if !ok {
			return attempt > 1, err
		}
		if attempt >= r.b.Steps {
			return true, fmt.Errorf("giving up after %d attempts: %w", attempt, err)
		}
		d := wait/2 + rand.N(wait/2+1) // jitter: replicas retrying together spread out
		d = max(d, delay)
		wait = min(2*wait, r.b.Max)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			return true, fmt.Errorf("giving up after %d attempts (the next would start after the deadline): %w", attempt, err)
		}
		if serr := r.sleep(ctx, d); serr != nil {
			return true, fmt.Errorf("giving up after %d attempts (%v): %w", attempt, serr, err)
		}
	}
}
