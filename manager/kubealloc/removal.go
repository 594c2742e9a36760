package kubealloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// RemovalFinalizer is the finalizer the manager's Deployment carries (components/manager) so
// that deleting it removes every sandbox pod first: the API server keeps a Deployment with a
// finalizer (and, deleted in the background, its ReplicaSet and pods) until the finalizer is
// removed, so the managers still run when its deletion starts. They see it (WatchRemoval),
// stop their pools, delete every sandbox pod and wait for them to be gone (RemoveSandboxes),
// and only then remove the finalizer (ReleaseRemoval). Whatever waits for the Deployment to be
// gone (Pulumi, before it deletes the sandbox namespace's network policies) therefore never
// sees a sandbox pod outlive the manager, even when the namespaces are not Pulumi's to delete.
const RemovalFinalizer = "fusebox.dev/sandboxes"

// ErrManagerRemoved is returned by WatchRemoval when the manager's Deployment is gone: a
// manager of a removed installation must not start a pool.
var ErrManagerRemoved = errors.New("the manager's Deployment is gone: not starting")

// WatchRemoval watches Deployment namespace/name (list and watch with a name field selector:
// RBAC authorises them by resourceNames) until ctx ends. The channel is closed once the
// Deployment is being deleted (its deletionTimestamp is set) or is gone; it is closed already
// when WatchRemoval returns if that was so at start. ErrManagerRemoved if the Deployment does
// not exist when its cache has synced.
func WatchRemoval(ctx context.Context, client kubernetes.Interface, namespace, name string) (<-chan struct{}, error) {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Apps().V1().Deployments()
	removing := make(chan struct{})
	closed := false
	// The informer calls its handlers one at a time, so closed needs no lock.
	see := func(obj any, deleted bool) {
		d, ok := obj.(*appsv1.Deployment)
		if closed || (!deleted && (!ok || d.DeletionTimestamp == nil)) {
			return
		}
		closed = true
		close(removing)
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { see(obj, false) },
		UpdateFunc: func(_, obj any) { see(obj, false) },
		DeleteFunc: func(obj any) { see(obj, true) },
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("syncing the %v informer for deployment %s/%s: %w", typ, namespace, name, context.Cause(ctx))
		}
	}
	if _, err := inf.Lister().Deployments(namespace).Get(name); apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w (deployment %s/%s)", ErrManagerRemoved, namespace, name)
	} else if err != nil {
		return nil, err
	}
	return removing, nil
}

// RemoveSandboxes deletes every sandbox pod of the namespace (every pod labelled AppName, in
// any state, whichever replica made or holds it) and returns once none is left, read from the
// API server rather than the cache. Their per-sandbox policies are owned by the pods and
// follow them. Call it after the manager's pool has stopped, on every replica: the deletes
// are idempotent.
func (a *Allocator) RemoveSandboxes(ctx context.Context) error {
	sel := labels.Set{LabelApp: AppName}.String()
	pods := a.o.Client.CoreV1().Pods(a.o.Namespace)
	for {
		var l *corev1.PodList
		if _, err := a.retry.do(ctx, func(ctx context.Context) (err error) {
			l, err = pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
			return err
		}); err != nil {
			return fmt.Errorf("listing the sandbox pods of %s: %w", a.o.Namespace, err)
		}
		if len(l.Items) == 0 {
			return nil
		}
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				continue // being deleted already
			}
			if err := a.Destroy(ctx, p.Name); err != nil {
				return err
			}
		}
		a.o.Logger.Info("removing the sandboxes: waiting for their pods to be gone", "namespace", a.o.Namespace, "pods", len(l.Items))
		t := a.o.Clock.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %d sandbox pods of %s to be gone: %w", len(l.Items), a.o.Namespace, context.Cause(ctx))
		case <-t.C():
		}
	}
}

// ReleaseRemoval removes RemovalFinalizer from Deployment namespace/name, which lets its
// deletion finish: call it once RemoveSandboxes returned. A Deployment without the finalizer,
// or gone, is success.
func ReleaseRemoval(ctx context.Context, client kubernetes.Interface, namespace, name string) error {
	deps := client.AppsV1().Deployments(namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deps.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		i := slices.Index(d.Finalizers, RemovalFinalizer)
		if i < 0 {
			return nil
		}
		d.Finalizers = slices.Delete(d.Finalizers, i, i+1)
		_, err = deps.Update(ctx, d, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer %s from deployment %s/%s: %w", RemovalFinalizer, namespace, name, err)
	}
	return nil
}
