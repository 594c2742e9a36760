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

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
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
	// Owner, when set, owns the Lease (the manager's Deployment): the garbage collector
	// deletes the Lease with it, also where the namespace stays.
	Owner *metav1.OwnerReference
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
	if o.Owner != nil {
		if err := ownLease(ctx, o); err != nil {
			return nil, err
		}
	}
	e := &Elector{done: make(chan struct{})}
	var lock resourcelock.Interface = &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
		Client:     o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
	}
	if o.Owner != nil {
		lock = ownedLock{LeaseLock: lock.(*resourcelock.LeaseLock), owner: *o.Owner}
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

// ownedLock is a LeaseLock whose Lease, when the election has to make it again (it was
// deleted while the election ran: the garbage collector removing it with the Deployment
// while the replicas still stop), carries the owner too. Made without one, it would outlive
// the Deployment; made with an owner that is gone, the garbage collector deletes it again.
type ownedLock struct {
	*resourcelock.LeaseLock
	owner metav1.OwnerReference
}

// Create makes the Lease with its owner, then reads it back into the LeaseLock, whose Update
// writes what it read.
func (l ownedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	m := l.LeaseMeta
	lease := ownedLease(m.Namespace, m.Name, l.owner)
	lease.Spec = resourcelock.LeaderElectionRecordToLeaseSpec(&ler)
	if _, err := l.Client.Leases(m.Namespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, _, err := l.LeaseLock.Get(ctx)
	return err
}

// ownedLease is the Lease namespace/name, owned by owner, with an empty spec.
func ownedLease(namespace, name string, owner metav1.OwnerReference) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
		OwnerReferences: []metav1.OwnerReference{owner}}}
}

// ownLease makes the Lease, or adds o.Owner to the Lease's owners: the election then reads
// and renews that object, owners kept (client-go's LeaseLock updates what it read).
func ownLease(ctx context.Context, o Options) error {
	leases := o.Client.CoordinationV1().Leases(o.Namespace)
	_, err := leases.Create(ctx, ownedLease(o.Namespace, o.Name, *o.Owner), metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("creating the Lease %s/%s: %w", o.Namespace, o.Name, err)
		}
		return nil
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, o.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, r := range l.OwnerReferences {
			if r.UID == o.Owner.UID {
				return nil
			}
		}
		l.OwnerReferences = append(l.OwnerReferences, *o.Owner)
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("owning the Lease %s/%s by %s %s: %w", o.Namespace, o.Name, o.Owner.Kind, o.Owner.Name, err)
	}
	return nil
}
