package manager

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// This file holds what both pools do to units: start their creations (counted, with a
// backoff after failures), destroy them, and count what happened.

// toDestroying moves a unit from state from to Destroying (a Ready unit's prepared init
// connection is forgotten).
func (m *Manager) toDestroying(id string, from State) error {
	u, err := m.ops.Transition(id, from, Destroying, func(u *Unit) { u.Remains = false })
	if err != nil {
		return err
	}
	if from == Ready && m.o.Forget != nil {
		m.o.Forget(u.Info.InitAddr)
	}
	return nil
}

// destroy moves a unit from state from to Destroying and destroys it.
func (m *Manager) destroy(ctx context.Context, id string, from State) error {
	if err := m.toDestroying(id, from); err != nil {
		return err
	}
	return m.finishDestroy(ctx, id)
}

// destroyInBackground moves a unit from state from to Destroying now and destroys it in the
// background (ctx's values, not its cancellation).
func (m *Manager) destroyInBackground(ctx context.Context, id string, from State) error {
	if err := m.toDestroying(id, from); err != nil {
		return err
	}
	m.bg.Add(1)
	go func() { defer m.bg.Done(); m.finishDestroy(context.WithoutCancel(ctx), id) }()
	return nil
}

// startCreate counts one creation of tmpl in m.creating (before starting the goroutine, so
// that a reconcile pass in between sees it) and has the pool make it in the background; the
// channel receives whether it made a unit.
func (m *Manager) startCreate(ctx context.Context, tmpl string) <-chan bool {
	made := make(chan bool, 1)
	m.creating.Add(1)
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		made <- func() bool { defer m.creating.Add(-1); return m.pool.create(ctx, tmpl) }()
	}()
	return made
}

func (m *Manager) finishDestroy(ctx context.Context, id string) error {
	m.publishCounts()
	err := m.alloc.Destroy(ctx, id)
	if err != nil {
		m.failure("destroy")
		m.ops.Transition(id, Destroying, Failed, func(u *Unit) {
			u.Err, u.Remains = fmt.Sprintf("destroy: %v (retried every %v)", err, RemainsRetry), true
		})
		m.log.Error("destroying unit; it is retried", "id", id, "err", err, "retry_after", RemainsRetry)
	} else {
		m.ops.Transition(id, Destroying, Gone, nil)
		m.destroyed()
	}
	m.publishCounts()
	return err
}

// destroyed counts a destruction.
func (m *Manager) destroyed() {
	m.totals.destructions.Add(1)
	if m.m != nil {
		m.m.Destructions.Inc()
	}
}

func (m *Manager) failure(stage string) {
	m.totals.failures.Add(1)
	if m.m != nil {
		m.m.Failures.WithLabelValues(stage).Inc()
	}
}

// noteCreate keeps the creation backoff: exponential (0.5 s doubling to a minute) after
// consecutive failures, so that a broken runtime does not spin; failures stay visible in
// status and metrics meanwhile.
func (m *Manager) noteCreate(err error) {
	m.backoffMu.Lock()
	defer m.backoffMu.Unlock()
	if err != nil {
		m.failStreak++
		m.holdUntil = m.o.Clock.Now().Add(min(time.Minute, 500*time.Millisecond<<min(m.failStreak-1, 7)))
	} else {
		m.failStreak = 0
	}
}

// backoffLeft is how long creations still wait for the backoff.
func (m *Manager) backoffLeft() time.Duration {
	m.backoffMu.Lock()
	defer m.backoffMu.Unlock()
	return max(0, m.holdUntil.Sub(m.o.Clock.Now()))
}

// heldBack reports whether creations wait for the backoff.
func (m *Manager) heldBack() bool { return m.backoffLeft() > 0 }

func (m *Manager) recordLatency(d time.Duration) {
	m.latMu.Lock()
	defer m.latMu.Unlock()
	m.latencies = append(m.latencies, d)
	if len(m.latencies) > 32 {
		m.latencies = m.latencies[len(m.latencies)-32:]
	}
}

// ProvisioningLatency is the median of recent creation times (1 s before any creation) plus
// the units' WarmUp: how long a unit takes from the decision to create it to serving at full
// speed.
func (m *Manager) ProvisioningLatency() time.Duration {
	m.latMu.Lock()
	defer m.latMu.Unlock()
	if len(m.latencies) == 0 {
		return time.Second + m.o.WarmUp
	}
	s := slices.Clone(m.latencies)
	slices.Sort(s)
	return s[len(s)/2] + m.o.WarmUp
}
