// Package kubealloc is the Kubernetes Allocator: each unit is a gVisor pod (runtimeClassName
// gvisor) in one sandbox namespace, made by BuildPod, with its own network policies
// (SandboxPolicies) applied at bind time on top of the namespace's default-deny policy
// (DefaultDenyPolicy, checked by CheckDefaultDeny). The policies come from
// policies/sandboxnet, the one source the Pulumi program uses too, in the cluster's flavour:
// CiliumNetworkPolicy, NetworkPolicy plus GKE's FQDNNetworkPolicy, or plain NetworkPolicy
// (whose egress allowlists take IP addresses only: ValidateEgress refuses names there).
//
// Everything the allocator reads comes from one shared pod informer (filtered to
// app.kubernetes.io/name=fusebox-sandbox in the namespace): no polling, no GET or LIST per
// request once the cache has synced. Writes per operation: Create 1 (plus 1 delete on
// failure), Claim 1 per attempt (a Conflict moves to the next candidate), Pick none and
// ClaimBound 1 (the claim and the lease in one write: the manager's default), BindEgress 1 per
// policy object (server-side apply; 2 on GKE when the allowlist names hosts), Annotate 1,
// Destroy 1 plus 1 per policy kind of the flavour.
//
// Transient API errors (timeouts, 429 with its Retry-After, 500, 503, refused or reset
// connections) are retried with Backoff wherever repeating the call is safe, which is every
// call here: reads, deletes, server-side apply, creates with a fixed name and updates guarded
// by a resourceVersion. When a retried write meets AlreadyExists or Conflict, the object is
// read back to see whether the lost attempt was this allocator's own (create nonce, claim
// identity and time) before the error is believed. Other errors are returned at once, wrapped
// with what was being done to which object.
//
// Pods are built from a Template per template name; ParseTemplate reads the one the manager
// component renders into its ConfigMap and refuses any that contradicts the security
// settings BuildPod enforces. Each pod carries its template's TemplateHash: a replica counts,
// claims and picks only the pods of its own template version, and DrainOutdated deletes the
// warm pods of another (an upgrade's old image), each only while it is still warm.
//
// A bound pod carries Karpenter's do-not-disrupt annotation (AnnotationDoNotDisrupt), set in
// the write that binds it; warm pods do not, so that Karpenter may still consolidate or
// replace a node holding only warm pods.
//
// Several manager replicas share the pods. The pod's state annotation carries the unit's
// state (ready -> claimed -> bound, or ready -> bound); Claim moves ready -> claimed with an
// Update, and ClaimBound ready -> bound with a patch, each carrying the cached
// resourceVersion, so the API server lets exactly one replica win each pod and no lock is
// needed.
//
// A bound pod whose sandbox server ended on its own (its container terminated or restarted,
// or the pod failed: the kubelet's status, through the informer) is reported with
// manager.AnnotationFailed and the reason, on every replica and with no write: the manager
// lists the unit failed and refuses its renewal, and the pod stays until its lease ends or
// its agent releases it.
package kubealloc

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/egress"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// ErrNoReady is returned by Claim when no ready pod of the template could be claimed; it
// wraps manager.ErrNoReadyUnit, which the manager waits on.
var ErrNoReady = fmt.Errorf("%w: no ready sandbox pod to claim", manager.ErrNoReadyUnit)

var (
	_ manager.SharedPool      = (*Allocator)(nil)
	_ manager.OneWriteClaimer = (*Allocator)(nil)
)

// FieldManager is the field manager of every write.
const FieldManager = "fusebox-manager"

// EndpointResolver returns a Ready pod's init and data endpoints ("tcp://host:port").
// Tests map pods to endpoints they own; the default is the pod IP with InitPort/DataPort.
type EndpointResolver func(*corev1.Pod) (initAddr, dataAddr string, err error)

// PodIPEndpoints is the default EndpointResolver.
func PodIPEndpoints(p *corev1.Pod) (string, string, error) {
	if p.Status.PodIP == "" {
		return "", "", fmt.Errorf("pod %s has no IP", p.Name)
	}
	host := p.Status.PodIP
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "tcp://" + host + ":" + strconv.Itoa(int(InitPort)), "tcp://" + host + ":" + strconv.Itoa(int(DataPort)), nil
}

// Options configure the allocator. Client, Dynamic, Namespace, Identity, Templates (each
// with an Image), Selectors.Manager with Selectors.ManagerNamespace, and
// Selectors.AgentNamespaces or Selectors.AgentCIDRs are required.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface // the network policies
	// Flavour is how the cluster enforces network policy (default sandboxnet.Cilium).
	Flavour sandboxnet.Flavour
	// Namespace holds the sandbox pods and their policies.
	Namespace string
	// Identity names this replica (pod name); it is recorded on the pods it claims.
	Identity  string
	Templates map[string]Template
	// Selectors say who may reach the data port (agents) and the init port (the manager).
	Selectors PolicySelectors
	// ImagePullSecrets are given to every sandbox pod (Secrets in Namespace).
	ImagePullSecrets []string
	// RuntimeClassName defaults to "gvisor".
	RuntimeClassName string
	// Pool defaults to DefaultNodePool.
	Pool *NodePool
	// NodeName puts every pod on one node directly: only for control planes without a
	// scheduler (tests with kwok).
	NodeName string
	// Endpoints defaults to PodIPEndpoints.
	Endpoints EndpointResolver
	// ReadyTimeout bounds Create's wait for a Ready pod (default 2 minutes).
	ReadyTimeout time.Duration
	// Backoff bounds the retries of transient API errors (default DefaultBackoff).
	Backoff Backoff
	Clock   manager.Clock
	Logger  *slog.Logger
}

// Allocator runs units as gVisor pods. Call Start before anything else.
type Allocator struct {
	o       Options
	retry   retrier
	factory informers.SharedInformerFactory
	pods    listersv1.PodLister
	index   cache.Indexer
	synced  atomic.Bool

	conflicts atomic.Uint64

	// hashes maps each template name to its TemplateHash: only pods of that hash are this
	// replica's to count, claim and pick.
	hashes map[string]string

	mu      sync.Mutex // guards waiters, written and changed
	waiters map[string]*waiter
	// changed holds, per template, the channel Changed handed out; notify closes it when a
	// pod of the template is claimable.
	changed map[string]chan struct{}
	// written maps a pod we updated to the resourceVersion it had before our write: while
	// the cache still shows that version, the pod is known to be stale and is skipped.
	written map[string]string
}

var (
	_ manager.Allocator     = (*Allocator)(nil)
	_ manager.Annotator     = (*Allocator)(nil)
	_ manager.EgressBinder  = (*Allocator)(nil)
	_ manager.EgressChecker = (*Allocator)(nil)
)

type waiter struct {
	ch      chan struct{} // capacity 1: "the pod changed"
	deleted atomic.Bool
}

// The informer's indexes: pods by template, template hash and state, and by state alone.
const (
	indexTemplateState = "template-state"
	indexState         = "state"
)

func templateStateKey(template, hash, state string) string {
	return template + "/" + hash + "/" + state
}

// podKey is pod p's indexTemplateState key (a pod made before template hashes has hash "").
func podKey(p *corev1.Pod) string {
	return templateStateKey(p.Labels[LabelTemplate], p.Labels[LabelTemplateHash], podState(p))
}

// poolKey is the indexTemplateState key of the pods of template, as this replica makes
// them, in state.
func (a *Allocator) poolKey(template, state string) string {
	return templateStateKey(template, a.hashes[template], state)
}

// New checks o and sets up the informer; Start runs it.
func New(o Options) (*Allocator, error) {
	switch {
	case o.Client == nil || o.Dynamic == nil:
		return nil, errors.New("kubealloc: Client and Dynamic are required")
	case o.Namespace == "" || o.Identity == "":
		return nil, errors.New("kubealloc: Namespace and Identity are required")
	case len(o.Templates) == 0:
		return nil, errors.New("kubealloc: at least one template is required")
	case len(o.Selectors.Manager) == 0:
		return nil, errors.New("kubealloc: Selectors.Manager is required (an empty selector would admit every pod of the manager namespace)")
	}
	if o.Flavour == "" {
		o.Flavour = sandboxnet.Cilium
	}
	if _, err := sandboxnet.ParseFlavour(string(o.Flavour)); err != nil {
		return nil, fmt.Errorf("kubealloc: %w", err)
	}
	if err := o.Selectors.network(o.Namespace).Validate(); err != nil {
		return nil, fmt.Errorf("kubealloc: Selectors: %w", err)
	}
	for name, t := range o.Templates {
		if t.Image == "" {
			return nil, fmt.Errorf("kubealloc: template %q has no image", name)
		}
	}
	if o.RuntimeClassName == "" {
		o.RuntimeClassName = "gvisor"
	}
	if o.Pool == nil {
		p := DefaultNodePool()
		o.Pool = &p
	}
	if o.Endpoints == nil {
		o.Endpoints = PodIPEndpoints
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	if o.Clock == nil {
		o.Clock = manager.RealClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Allocator{o: o, retry: newRetrier(o.Backoff), waiters: map[string]*waiter{}, written: map[string]string{},
		changed: map[string]chan struct{}{}, hashes: map[string]string{}}
	for name, t := range o.Templates {
		a.hashes[name] = TemplateHash(a.podSpec("", name, t))
	}
	a.factory = informers.NewSharedInformerFactoryWithOptions(o.Client, 0,
		informers.WithNamespace(o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = labels.Set{LabelApp: AppName}.String()
		}))
	inf := a.factory.Core().V1().Pods()
	if err := inf.Informer().AddIndexers(cache.Indexers{
		indexTemplateState: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok {
				return []string{podKey(p)}, nil
			}
			return nil, nil
		},
		indexState: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok {
				return []string{podState(p)}, nil
			}
			return nil, nil
		},
	}); err != nil {
		return nil, err
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.notify(obj, false) },
		UpdateFunc: func(old, obj any) { a.notify(obj, false); a.noticeEnd(old, obj) },
		DeleteFunc: func(obj any) { a.notify(obj, true) },
	}); err != nil {
		return nil, err
	}
	a.pods = inf.Lister()
	a.index = inf.Informer().GetIndexer()
	return a, nil
}

// Start runs the informer until ctx ends and returns once its cache has synced.
func (a *Allocator) Start(ctx context.Context) error {
	a.factory.Start(ctx.Done())
	for typ, ok := range a.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("kubealloc: syncing the %v informer: %w", typ, context.Cause(ctx))
		}
	}
	a.synced.Store(true)
	return nil
}

// Shutdown waits for the informer goroutines to end (after Start's ctx ended).
func (a *Allocator) Shutdown() { a.factory.Shutdown() }

func (a *Allocator) notify(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	w := a.waiters[p.Name]
	if w != nil && deleted {
		w.deleted.Store(true)
	}
	if deleted {
		delete(a.written, p.Name)
	}
	// The informer updates its cache before it calls the handlers, so a Claim woken by this
	// close finds the pod.
	if tmpl := p.Labels[LabelTemplate]; !deleted && podKey(p) == a.poolKey(tmpl, StateReady) && podReady(p) {
		if ch := a.changed[tmpl]; ch != nil {
			close(ch)
			delete(a.changed, p.Labels[LabelTemplate])
		}
	}
	a.mu.Unlock()
	if w != nil {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// noticeEnd logs, once per pod, a bound pod whose sandbox server stopped serving (see
// serverEnded): the unit is reported failed from then on.
func (a *Allocator) noticeEnd(old, obj any) {
	was, ok1 := old.(*corev1.Pod)
	p, ok2 := obj.(*corev1.Pod)
	if !ok1 || !ok2 || podState(p) != StateBound || p.DeletionTimestamp != nil {
		return
	}
	if reason := serverEnded(p); reason != "" && serverEnded(was) == "" {
		a.o.Logger.Error("a bound sandbox pod's server ended on its own; the unit is failed", "pod", p.Name, "reason", reason)
	}
}

func (a *Allocator) ready() error {
	if !a.synced.Load() {
		return fmt.Errorf("%w: kubealloc used before Start synced its informer", manager.ErrAllocator)
	}
	return nil
}

// Name returns "kube".
func (a *Allocator) Name() string { return "kube" }

// gVisorWarmUp is the warm-up of a sandbox pod under gVisor's runtime class: the same clock
// calibration as runscalloc.GVisorWarmUp's.
const gVisorWarmUp = time.Second

// Capabilities: egress through per-sandbox network policies, leases in pod annotations, a
// warm pool shared by every manager replica, pools keyed by template version (TemplateHash,
// DrainOutdated), and gVisor's warm-up. Its creations run on the
// cluster's nodes, not the manager's host.
func (a *Allocator) Capabilities() manager.Capabilities {
	return manager.Capabilities{Egress: true, Adoption: true, SharedPool: true, Versions: true, WarmUp: gVisorWarmUp}
}

// Changed returns a channel closed when the informer next sees a Ready pod of template, of
// this replica's TemplateHash, in state ready (an add or an update; it may already have been
// claimed by then). It reads
// nothing from the API server.
func (a *Allocator) Changed(template string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := a.changed[template]
	if ch == nil {
		ch = make(chan struct{})
		a.changed[template] = ch
	}
	return ch
}

// ClaimConflicts is how many claim attempts lost an optimistic-concurrency race so far.
func (a *Allocator) ClaimConflicts() uint64 { return a.conflicts.Load() }

// Create creates pod id (labelled ready) and returns once the informer shows it Running and
// Ready (its readiness probe is the init port) with an IP. On any error, the pod is deleted,
// unless it already existed (then it belongs to someone else and is left alone).
func (a *Allocator) Create(ctx context.Context, id, template string) (manager.UnitInfo, error) {
	if err := a.ready(); err != nil {
		return manager.UnitInfo{}, err
	}
	t, ok := a.o.Templates[template]
	if !ok {
		return manager.UnitInfo{}, fmt.Errorf("%w: %q", manager.ErrUnknownTemplate, template)
	}
	if errs := validation.IsDNS1123Label(id); len(errs) > 0 {
		return manager.UnitInfo{}, fmt.Errorf("%w: sandbox id %q: %s", manager.ErrInvalid, id, strings.Join(errs, "; "))
	}
	w := &waiter{ch: make(chan struct{}, 1)}
	a.mu.Lock()
	if a.waiters[id] != nil {
		a.mu.Unlock()
		return manager.UnitInfo{}, fmt.Errorf("%w: sandbox %s is already being created", manager.ErrInvalid, id)
	}
	a.waiters[id] = w
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiters, id)
		a.mu.Unlock()
	}()

	pod := BuildPod(a.podSpec(id, template, t))
	created, err := a.createPod(ctx, pod)
	if err != nil {
		return manager.UnitInfo{}, fmt.Errorf("%w: creating pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, id, err)
	}
	info, err := a.waitReady(ctx, w, id, created.UID, a.o.ReadyTimeout+t.WarmUpTimeout)
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		uid := created.UID
		// The UID precondition makes the retried delete safe: it can only ever remove this
		// pod, never a later one of the same name.
		_, derr := a.retry.do(dctx, func(ctx context.Context) error {
			return a.o.Client.CoreV1().Pods(a.o.Namespace).Delete(ctx, id, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &uid},
			})
		})
		if derr != nil && !apierrors.IsNotFound(derr) {
			a.o.Logger.Warn("deleting a pod that did not become ready", "pod", id, "err", derr)
		}
		return manager.UnitInfo{}, fmt.Errorf("%w: sandbox pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, id, err)
	}
	return info, nil
}

// createPod creates pod, retrying transient errors. The pod carries a random
// AnnotationCreateNonce: when an attempt failed transiently and a later one finds the name
// taken, the existing pod is read back and is ours (the lost attempt created it) only if it
// carries the same nonce; otherwise AlreadyExists is returned and the pod is left alone.
func (a *Allocator) createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	nonce := crand.Text()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationCreateNonce] = nonce
	pods := a.o.Client.CoreV1().Pods(a.o.Namespace)
	var created *corev1.Pod
	retried, err := a.retry.do(ctx, func(ctx context.Context) error {
		var err error
		created, err = pods.Create(ctx, pod, metav1.CreateOptions{FieldManager: FieldManager})
		return err
	})
	if err == nil || !retried || !apierrors.IsAlreadyExists(err) {
		return created, err
	}
	got, gerr := a.getPod(ctx, pod.Name)
	if gerr != nil {
		return nil, fmt.Errorf("%w (and reading it back to see whether a lost attempt created it: %w)", err, gerr)
	}
	if got.Annotations[AnnotationCreateNonce] != nonce {
		return nil, fmt.Errorf("%w (made by someone else: its create nonce differs)", err)
	}
	return got, nil
}

// podSpec is BuildPod's input for pod id of template t under the allocator's options.
func (a *Allocator) podSpec(id, template string, t Template) PodSpec {
	return PodSpec{
		ID: id, Namespace: a.o.Namespace, TemplateName: template, Template: t,
		RuntimeClassName: a.o.RuntimeClassName, Pool: *a.o.Pool, NodeName: a.o.NodeName,
		ImagePullSecrets: a.o.ImagePullSecrets,
	}
}

// waitReady waits until the informer shows pod id (of uid) Ready, for at most timeout. A pod
// that ended, or whose containers cannot start (podStuck), is not waited for: the error says
// why, naming the container and its image.
func (a *Allocator) waitReady(ctx context.Context, w *waiter, id string, uid types.UID, timeout time.Duration) (manager.UnitInfo, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p, err := a.pods.Pods(a.o.Namespace).Get(id)
		switch {
		case err == nil && p.UID == uid && podReady(p):
			return a.unitInfo(p)
		case err == nil && p.UID == uid && podEnded(p):
			return manager.UnitInfo{}, fmt.Errorf("pod ended before it was ready: %s", endReason(p))
		case err == nil && p.UID == uid && podStuck(p) != "":
			return manager.UnitInfo{}, fmt.Errorf("pod cannot start: %s", podStuck(p))
		case err == nil && p.UID != uid, apierrors.IsNotFound(err) && w.deleted.Load():
			return manager.UnitInfo{}, errors.New("pod was deleted before it was ready")
		}
		select {
		case <-w.ch:
		case <-timer.C:
			state := "not in the informer's cache"
			if p != nil {
				state = fmt.Sprintf("phase %s, IP %q, conditions %v", p.Status.Phase, p.Status.PodIP, p.Status.Conditions)
			}
			return manager.UnitInfo{}, fmt.Errorf("not ready within %v (%s)", timeout, state)
		case <-ctx.Done():
			return manager.UnitInfo{}, fmt.Errorf("waiting for readiness: %w", context.Cause(ctx))
		}
	}
}

func (a *Allocator) unitInfo(p *corev1.Pod) (manager.UnitInfo, error) {
	info := manager.UnitInfo{
		ID:          p.Name,
		Template:    p.Labels[LabelTemplate],
		Created:     p.CreationTimestamp.Time,
		Annotations: managerAnnotations(p.Annotations),
	}
	if podState(p) == StateClaimed {
		// Reported (not stored) for the manager's orphan collection: a unit claimed by a
		// replica that died before binding it.
		if info.Annotations == nil {
			info.Annotations = map[string]string{}
		}
		info.Annotations[manager.AnnotationState] = "claimed"
		info.Annotations[manager.AnnotationClaimedAt] = p.Annotations[AnnotationClaimedAt]
	}
	if reason := serverEnded(p); reason != "" && podState(p) == StateBound {
		// Reported (not stored), like "claimed": every replica reads it from the pod's
		// status, and the manager lists the unit failed with it and refuses its renewal.
		if info.Annotations == nil {
			info.Annotations = map[string]string{}
		}
		info.Annotations[manager.AnnotationFailed] = reason
	}
	if podState(p) == StateReady && !podReady(p) && !podEnded(p) {
		// Reported for every replica's view of the pool (PoolStatus, List): a pod on its
		// way is not yet a unit to claim, whichever replica created it.
		if info.Annotations == nil {
			info.Annotations = map[string]string{}
		}
		info.Annotations[manager.AnnotationState] = "creating"
	}
	if p.Status.PodIP != "" {
		var err error
		if info.InitAddr, info.DataAddr, err = a.o.Endpoints(p); err != nil {
			return manager.UnitInfo{}, fmt.Errorf("resolving the endpoints of pod %s: %w", p.Name, err)
		}
	}
	return info, nil
}

// managerAnnotations drops the allocator's own annotations (and returns nil for none).
func managerAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if allocatorAnnotation(k) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// Destroy deletes pod id and its policies (every kind of the flavour); anything being gone
// already is success. The policies also carry an owner reference to the pod, so the garbage
// collector removes them if a later delete is lost.
func (a *Allocator) Destroy(ctx context.Context, id string) error {
	// The deletes are idempotent (NotFound is success), so transient errors are retried.
	_, err := a.retry.do(ctx, func(ctx context.Context) error {
		return a.o.Client.CoreV1().Pods(a.o.Namespace).Delete(ctx, id, metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: deleting pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, id, err)
	}
	for _, k := range sandboxnet.SandboxKinds(a.o.Flavour) {
		res, err := gvr(k.Kind)
		if err != nil {
			return err
		}
		_, err = a.retry.do(ctx, func(ctx context.Context) error {
			return a.o.Dynamic.Resource(res).Namespace(a.o.Namespace).Delete(ctx, PolicyName(id), metav1.DeleteOptions{})
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: deleting %s %s/%s: %w", manager.ErrAllocator, k.Kind, a.o.Namespace, PolicyName(id), err)
		}
	}
	return nil
}

// List returns every sandbox pod in the informer's cache that is not being deleted, in any
// state, with the manager's annotations (the allocator's own are left out). Units without a
// pod IP yet have empty addresses.
func (a *Allocator) List(ctx context.Context) ([]manager.UnitInfo, error) {
	if err := a.ready(); err != nil {
		return nil, err
	}
	pods, err := a.pods.Pods(a.o.Namespace).List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing sandbox pods from the informer's cache: %w", err)
	}
	out := make([]manager.UnitInfo, 0, len(pods))
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		info, err := a.unitInfo(p)
		if err != nil {
			a.o.Logger.Warn("listing sandbox pod", "pod", p.Name, "err", err)
			info = manager.UnitInfo{ID: p.Name, Template: p.Labels[LabelTemplate], Created: p.CreationTimestamp.Time, Annotations: managerAnnotations(p.Annotations)}
		}
		out = append(out, info)
	}
	return out, nil
}

// Lookup returns sandbox pod id read from the API server (one GET: the informer's cache may
// not yet hold a lease another replica bound a moment ago). manager.ErrUnitNotFound when there
// is no such sandbox pod or it is being deleted.
func (a *Allocator) Lookup(ctx context.Context, id string) (manager.UnitInfo, error) {
	if err := a.ready(); err != nil {
		return manager.UnitInfo{}, err
	}
	// A live read, not the informer's cache: the lease may have been written by another
	// replica a moment ago and this replica's watch may not have delivered it yet.
	p, err := a.getPod(ctx, id)
	switch {
	case apierrors.IsNotFound(err):
		return manager.UnitInfo{}, fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	case err != nil:
		return manager.UnitInfo{}, fmt.Errorf("%w: reading pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, id, err)
	case p.DeletionTimestamp != nil || p.Labels[LabelApp] != AppName:
		return manager.UnitInfo{}, fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	}
	return a.unitInfo(p)
}

// Counts returns, from the informer's cache, how many pods of template, as this replica makes
// them (its TemplateHash), are ready to claim (state ready, pod Ready) and how many are on
// their way (state ready, not Ready yet, not ended).
func (a *Allocator) Counts(template string) (ready, creating int) {
	objs, _ := a.index.ByIndex(indexTemplateState, a.poolKey(template, StateReady))
	for _, o := range objs {
		p := o.(*corev1.Pod)
		switch {
		case a.staleAfterOurWrite(p):
		case podReady(p):
			ready++
		case !podEnded(p):
			creating++
		}
	}
	return ready, creating
}

func (a *Allocator) staleAfterOurWrite(p *corev1.Pod) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	rv, ok := a.written[p.Name]
	if ok && rv != p.ResourceVersion {
		delete(a.written, p.Name) // the cache has caught up
		return false
	}
	return ok
}

// Claim takes one Ready pod of template for this replica: state ready -> claimed and
// AnnotationClaimedBy = Identity, written with an Update that carries the cached
// resourceVersion. A Conflict (another replica won, or the pod changed) or NotFound moves
// on to the next candidate, in random order so that replicas rarely race for the same pod.
// ErrNoReady when every candidate is gone. Other API errors are returned.
func (a *Allocator) Claim(ctx context.Context, template string) (manager.UnitInfo, error) {
	objs, err := a.readyPods(template)
	if err != nil {
		return manager.UnitInfo{}, err
	}
	for _, o := range objs {
		if err := ctx.Err(); err != nil {
			return manager.UnitInfo{}, context.Cause(ctx)
		}
		p := o.(*corev1.Pod)
		if !podReady(p) || a.staleAfterOurWrite(p) {
			continue
		}
		c := p.DeepCopy()
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[AnnotationState] = StateClaimed
		c.Annotations[AnnotationClaimedBy] = a.o.Identity
		c.Annotations[AnnotationClaimedAt] = a.o.Clock.Now().UTC().Format(time.RFC3339Nano)
		var got *corev1.Pod
		// The resourceVersion guards the update, so repeating it after a transient error
		// cannot claim a pod that changed meanwhile.
		retried, err := a.retry.do(ctx, func(ctx context.Context) error {
			var err error
			got, err = a.o.Client.CoreV1().Pods(a.o.Namespace).Update(ctx, c, metav1.UpdateOptions{FieldManager: FieldManager})
			return err
		})
		if retried && apierrors.IsConflict(err) {
			// An attempt whose response was lost may have been our own winning claim.
			got, err = a.ownClaim(ctx, c, err)
		}
		switch {
		case apierrors.IsConflict(err):
			a.conflicts.Add(1)
			continue
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			// A transient error that outlasted the retries may hide a claim that was applied;
			// the leader collects such a pod once its claim is older than the claim grace.
			return manager.UnitInfo{}, fmt.Errorf("%w: claiming pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, p.Name, err)
		}
		a.mu.Lock()
		a.written[p.Name] = p.ResourceVersion
		a.mu.Unlock()
		return a.unitInfo(got)
	}
	return manager.UnitInfo{}, fmt.Errorf("%w (template %q)", ErrNoReady, template)
}

// readyPods returns the cached pods of template in state ready, of this replica's
// TemplateHash (a pod of another version of the template is never handed out here), in
// random order so that replicas rarely race for the same pod (Claim and Pick take the first
// that will do).
func (a *Allocator) readyPods(template string) ([]any, error) {
	if err := a.ready(); err != nil {
		return nil, err
	}
	if _, ok := a.o.Templates[template]; !ok {
		return nil, fmt.Errorf("%w: %q", manager.ErrUnknownTemplate, template)
	}
	objs, err := a.index.ByIndex(indexTemplateState, a.poolKey(template, StateReady))
	if err != nil {
		return nil, fmt.Errorf("reading ready pods of template %q from the informer's cache: %w", template, err)
	}
	rand.Shuffle(len(objs), func(i, j int) { objs[i], objs[j] = objs[j], objs[i] })
	return objs, nil
}

// Pick returns a Ready pod of template in state ready from the informer's cache, chosen at
// random so that replicas rarely pick the same pod, passing over the pods skip names and
// those the cache shows as they were before this replica's own write. It reads nothing from
// the API server; the UnitInfo's Version is the pod's resourceVersion.
func (a *Allocator) Pick(template string, skip func(id string) bool) (manager.UnitInfo, error) {
	objs, err := a.readyPods(template)
	if err != nil {
		return manager.UnitInfo{}, err
	}
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if !podReady(p) || skip(p.Name) || a.staleAfterOurWrite(p) {
			continue
		}
		info, err := a.unitInfo(p)
		if err != nil {
			return manager.UnitInfo{}, err
		}
		info.Version = p.ResourceVersion
		return info, nil
	}
	return manager.UnitInfo{}, fmt.Errorf("%w (template %q)", ErrNoReady, template)
}

// ClaimBound claims pod u.ID and binds it in one merge patch that carries u.Version as its
// resourceVersion: state bound, AnnotationClaimedBy = Identity, and annotations as the
// manager's (as Annotate writes them). A Conflict or NotFound is manager.ErrUnitTaken (a
// Conflict after a lost attempt is resolved by reading the pod back).
func (a *Allocator) ClaimBound(ctx context.Context, u manager.UnitInfo, annotations map[string]string) error {
	if err := a.ready(); err != nil {
		return err
	}
	if u.Version == "" {
		return fmt.Errorf("%w: pod %s picked without a resourceVersion", manager.ErrBadTransition, u.ID)
	}
	ann := boundAnnotations(annotations)
	ann[AnnotationClaimedBy] = a.o.Identity
	ann[AnnotationClaimedAt] = a.o.Clock.Now().UTC().Format(time.RFC3339Nano)
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann, "resourceVersion": u.Version}})
	if err != nil {
		return err
	}
	retried, err := a.retry.do(ctx, func(ctx context.Context) error {
		_, err := a.o.Client.CoreV1().Pods(a.o.Namespace).Patch(ctx, u.ID, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		return err
	})
	if retried && apierrors.IsConflict(err) && a.annotated(ctx, u.ID, annotations) {
		err = nil // the attempt whose answer was lost won
	}
	if err == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// Either way the cache's version is behind: Pick passes it over until the cache
		// catches up, rather than offer the same lost pod again.
		a.mu.Lock()
		a.written[u.ID] = u.Version
		a.mu.Unlock()
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		a.conflicts.Add(1)
		return fmt.Errorf("%w: pod %s/%s: %w", manager.ErrUnitTaken, a.o.Namespace, u.ID, err)
	case err != nil:
		return fmt.Errorf("%w: claiming and binding pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, u.ID, err)
	}
	return nil
}

// getPod reads pod name from the API server (not the cache), retrying transient errors.
func (a *Allocator) getPod(ctx context.Context, name string) (*corev1.Pod, error) {
	var p *corev1.Pod
	_, err := a.retry.do(ctx, func(ctx context.Context) error {
		var err error
		p, err = a.o.Client.CoreV1().Pods(a.o.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err
	})
	return p, err
}

// ownClaim re-reads pod c after a Conflict that followed a transient error: if it carries
// exactly the claim c wrote (this replica's identity and claim time), that claim won and the
// pod is returned; otherwise conflict is returned.
func (a *Allocator) ownClaim(ctx context.Context, c *corev1.Pod, conflict error) (*corev1.Pod, error) {
	p, err := a.getPod(ctx, c.Name)
	if err != nil {
		return nil, err
	}
	if podState(p) == StateClaimed && p.Annotations[AnnotationClaimedBy] == a.o.Identity &&
		p.Annotations[AnnotationClaimedAt] == c.Annotations[AnnotationClaimedAt] {
		return p, nil
	}
	return nil, conflict
}

// Annotate replaces unit id's manager annotations (the allocator's own stay) and marks the
// pod bound, with one merge patch built from the cache. It refuses (ErrBadTransition) a pod
// that another replica claimed, and ErrUnitNotFound if the pod is not in the cache.
func (a *Allocator) Annotate(ctx context.Context, id string, annotations map[string]string) error {
	if err := a.ready(); err != nil {
		return err
	}
	p, err := a.pods.Pods(a.o.Namespace).Get(id)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	} else if err != nil {
		return fmt.Errorf("reading pod %s from the informer's cache: %w", id, err)
	}
	guarded, err := a.annotate(ctx, p, annotations)
	if guarded && apierrors.IsConflict(err) {
		// The cache showed the pod ready and it had changed: the cache may be behind a bind
		// by another replica (an agent renewing through this one). Once more from a live read.
		if p, err = a.getPod(ctx, id); err == nil {
			_, err = a.annotate(ctx, p, annotations)
		}
	}
	var refused refusedError
	switch {
	case errors.As(err, &refused):
		return fmt.Errorf("%w: %s", manager.ErrBadTransition, refused)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	case apierrors.IsConflict(err):
		return fmt.Errorf("%w: pod %s changed while it was being bound (claim it with Claim): %w", manager.ErrBadTransition, id, err)
	case err != nil:
		return fmt.Errorf("%w: annotating pod %s/%s: %w", manager.ErrAllocator, a.o.Namespace, id, err)
	}
	return nil
}

// refusedError is a transition annotate refuses without asking the API server.
type refusedError string

func (e refusedError) Error() string { return string(e) }

// annotate patches pod p (as read from the cache or the API server) with annotations, as
// Annotate describes. guarded reports whether the patch carried p's resourceVersion (p was
// ready and is taken here), so that a Conflict may mean p was stale.
func (a *Allocator) annotate(ctx context.Context, p *corev1.Pod, annotations map[string]string) (guarded bool, err error) {
	// A pod claimed by another replica and not yet bound is that replica's to bind. Once it
	// is bound, any replica may rewrite its lease (renewals go to whichever replica the
	// agent reaches).
	if by := p.Annotations[AnnotationClaimedBy]; by != "" && by != a.o.Identity && podState(p) != StateBound {
		return false, refusedError(fmt.Sprintf("pod %s was claimed by %s", p.Name, by))
	}
	ann := boundAnnotations(annotations)
	for k := range managerAnnotations(p.Annotations) {
		if _, set := ann[k]; !set {
			ann[k] = nil // removed
		}
	}
	meta := map[string]any{"annotations": ann}
	if podState(p) == StateReady && !a.staleAfterOurWrite(p) {
		// Not claimed through this replica's Claim (a stale cache still showing our own
		// claim is recognised above): take it here, guarded by the resourceVersion read.
		ann[AnnotationClaimedBy] = a.o.Identity
		meta["resourceVersion"] = p.ResourceVersion
		guarded = true
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return guarded, err
	}
	// The patch sets fixed values, so repeating it is harmless; when it carries a
	// resourceVersion, a Conflict after a lost attempt is resolved by reading the pod back.
	retried, err := a.retry.do(ctx, func(ctx context.Context) error {
		_, err := a.o.Client.CoreV1().Pods(a.o.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		return err
	})
	if retried && apierrors.IsConflict(err) && a.annotated(ctx, p.Name, annotations) {
		err = nil
	}
	return guarded, err
}

// allocatorAnnotation reports whether annotation key is the allocator's own, never the
// manager's to write: its prefix, and Karpenter's do-not-disrupt on bound pods.
func allocatorAnnotation(key string) bool {
	return strings.HasPrefix(key, internalAnnotationPrefix) || key == AnnotationDoNotDisrupt
}

// boundAnnotations is a merge patch's annotations for a bound pod: the manager's (the
// allocator's own are not the manager's to write), state bound, and Karpenter's
// do-not-disrupt, so that no voluntary disruption (consolidation, drift) evicts a sandbox an
// agent holds.
func boundAnnotations(annotations map[string]string) map[string]any {
	ann := map[string]any{}
	for k, v := range annotations {
		if !allocatorAnnotation(k) {
			ann[k] = v
		}
	}
	ann[AnnotationState] = StateBound
	ann[AnnotationDoNotDisrupt] = "true"
	return ann
}

// annotated reports whether pod id, read from the API server, is bound by this replica with
// exactly annotations as its manager annotations.
func (a *Allocator) annotated(ctx context.Context, id string, annotations map[string]string) bool {
	p, err := a.getPod(ctx, id)
	if err != nil {
		return false
	}
	want := managerAnnotations(annotations)
	return podState(p) == StateBound && p.Annotations[AnnotationClaimedBy] == a.o.Identity &&
		maps.Equal(managerAnnotations(p.Annotations), want)
}

// CheckEgress reports whether allow could be bound under the allocator's flavour (a host
// on a plain-NetworkPolicy cluster is refused, wrapping manager.ErrInvalid and
// sandboxnet.ErrFQDNUnsupported; so is a metadata address): the manager asks before it
// spends a warm sandbox on the allocation.
func (a *Allocator) CheckEgress(allow []string) error {
	al, err := egress.ParseAllowlist(allow)
	if err != nil {
		return fmt.Errorf("%w: %w", manager.ErrInvalid, err)
	}
	if err := sandboxnet.CheckAllowlist(a.o.Flavour, al.Entries()); err != nil {
		return fmt.Errorf("%w: %w", manager.ErrInvalid, err)
	}
	if _, err := sandboxnet.SandboxPolicies(a.o.Flavour, a.o.Selectors.network(a.o.Namespace), "check", al.Entries()); err != nil {
		return fmt.Errorf("%w: %w", manager.ErrInvalid, err)
	}
	return nil
}

// BindEgress applies (server-side apply: create or update, one request per object) sandbox
// id's policies for allow under the allocator's flavour, owned by the pod; an empty allowlist
// has none (the namespace's policies cover the sandbox), and so no request. When it returns
// nil the policy objects exist with exactly that allowlist; the network plugin enforces them
// asynchronously, which the default deny covers until then. ErrUnitNotFound if the pod is not
// in the cache; a malformed or unsupported entry wraps manager.ErrInvalid.
func (a *Allocator) BindEgress(ctx context.Context, id string, allow []string) error {
	if err := a.ready(); err != nil {
		return err
	}
	p, err := a.pods.Pods(a.o.Namespace).Get(id)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	} else if err != nil {
		return fmt.Errorf("reading pod %s from the informer's cache: %w", id, err)
	}
	pols, err := SandboxPolicies(a.o.Flavour, a.o.Namespace, id, allow, a.o.Selectors)
	if err != nil {
		return fmt.Errorf("%w: %w", manager.ErrInvalid, err)
	}
	yes := true
	for _, pol := range pols {
		pol.SetOwnerReferences([]metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, BlockOwnerDeletion: &yes,
		}})
		res, err := gvr(pol.GetKind())
		if err != nil {
			return err
		}
		// Server-side apply of a whole object is idempotent: retried as is.
		_, err = a.retry.do(ctx, func(ctx context.Context) error {
			_, err := a.o.Dynamic.Resource(res).Namespace(a.o.Namespace).Apply(ctx, pol.GetName(), pol,
				metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
			return err
		})
		if err != nil {
			return fmt.Errorf("%w: applying %s %s/%s for pod %s: %w", manager.ErrAllocator, pol.GetKind(), a.o.Namespace, pol.GetName(), id, err)
		}
	}
	return nil
}
