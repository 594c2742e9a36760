// Package leader runs Kubernetes leader election (a coordination.k8s.io/v1 Lease) among
// manager replicas. Every replica serves Allocate, Renew and Release; only the leader sizes
// the shared warm pool and expires leases (manager.Options.IsLeader).
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Options configure an election. Client, Namespace, Name and Identity are required.
type Options struct {
	Client    kubernetes.Interface
	Namespace string // where the Lease lives (the manager's namespace)
	Name      string // the Lease's name
	Identity  string // this replica (its pod name)
	// Durations; zero means client-go's usual 15 s / 10 s / 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
}

// Elector reports whether this replica leads.
type Elector struct {
	leading atomic.Bool
	done    chan struct{}
}

// IsLeader reports whether this replica holds the lease now.
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// Done is closed when the election loop has stopped (ctx ended).
func (e *Elector) Done() <-chan struct{} { return e.done }

// Start joins the election and keeps re-joining after losing the lease, until ctx ends; on
// ctx's end a held lease is released so that another replica takes over at once.
func Start(ctx context.Context, o Options) (*Elector, error) {
	if o.Client == nil || o.Namespace == "" || o.Name == "" || o.Identity == "" {
		return nil, errors.New("leader: Client, Namespace, Name and Identity are required")
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Elector{done: make(chan struct{})}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
		Client:     o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            o.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				e.leading.Store(true)
				o.Logger.Info("leading the pool", "identity", o.Identity)
			},
			OnStoppedLeading: func() {
				e.leading.Store(false)
				o.Logger.Info("stopped leading the pool", "identity", o.Identity)
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	go func() {
		defer close(e.done)
		for ctx.Err() == nil {
			le.Run(ctx) // returns when leadership is lost or ctx ends
		}
	}()
	return e, nil
}
