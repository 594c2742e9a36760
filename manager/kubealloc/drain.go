package kubealloc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fusebox-dev/fusebox/manager"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var _ manager.OutdatedDrainer = (*Allocator)(nil)

// outdated reports whether pod p is a warm pod (state ready, not being deleted) of one of this
// replica's templates made from another version of it (another TemplateHash, or none: a pod
// made before template hashes).
func (a *Allocator) outdated(p *corev1.Pod) bool {
	hash, known := a.hashes[p.Labels[LabelTemplate]]
	return known && podState(p) == StateReady && p.DeletionTimestamp == nil && p.Labels[LabelTemplateHash] != hash
}

// DrainOutdated deletes the warm pods of this replica's templates that were made from another
// version of their template (another TemplateHash: an earlier image, other resources or
// placement) and created before before, as the informer's cache shows them. Each delete
// carries the pod's UID and cached resourceVersion as preconditions, so that it removes the
// pod only while it is still warm: a replica that still runs that version may claim it
// meanwhile, and then the delete fails with a Conflict and the pod is left to its claim and
// lease. Bound and claimed pods are never deleted here: they live out their leases. Pods of
// templates this replica does not know are left alone. It returns the pods it deleted, and
// the errors of the deletes that failed otherwise than by a Conflict or NotFound.
func (a *Allocator) DrainOutdated(ctx context.Context, before time.Time) ([]string, error) {
	if err := a.ready(); err != nil {
		return nil, err
	}
	objs, err := a.index.ByIndex(indexState, StateReady)
	if err != nil {
		return nil, fmt.Errorf("reading ready pods from the informer's cache: %w", err)
	}
	var drained []string
	var errs []error
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if !a.outdated(p) || !p.CreationTimestamp.Time.Before(before) || a.staleAfterOurWrite(p) {
			continue
		}
		uid, rv := p.UID, p.ResourceVersion
		// Preconditions make the retried delete safe: it removes this pod at this version
		// only, never a pod claimed since nor a later pod of the same name.
		_, err := a.retry.do(ctx, func(ctx context.Context) error {
			return a.o.Client.CoreV1().Pods(a.o.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
			})
		})
		switch {
		case err == nil:
			drained = append(drained, p.Name)
			a.o.Logger.Info("drained a warm sandbox pod of an earlier template", "pod", p.Name,
				"template", p.Labels[LabelTemplate], "hash", p.Labels[LabelTemplateHash], "current", a.hashes[p.Labels[LabelTemplate]])
		case apierrors.IsConflict(err), apierrors.IsNotFound(err):
			// Claimed, changed or gone since the cache saw it: a later pass looks again.
		default:
			errs = append(errs, fmt.Errorf("%w: draining pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, p.Name, err))
		}
	}
	return drained, errors.Join(errs...)
}
