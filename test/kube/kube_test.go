// Package kube tests the kube allocator against a real API server (kubetest: etcd,
// kube-apiserver and kwok on loopback). Pod IPs that kwok invents are never dialled: the
// allocators map every pod to a loopback listener the test owns.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/policies/sandboxnet"
	"github.com/fusebox-dev/fusebox/test/kubetest"
	"github.com/fusebox-dev/fusebox/test/testenv"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env)) }

const image = "registry.example/fusebox-sandbox:test"

var selectors = kubealloc.PolicySelectors{
	Agents:           map[string]string{"fusebox.dev/role": "agent"},
	AgentNamespaces:  []string{"agents"},
	Manager:          map[string]string{"app.kubernetes.io/name": "fusebox-manager"},
	ManagerNamespace: "fusebox-system",
}

// ciliumPolicy is sandbox id's one CiliumNetworkPolicy.
func ciliumPolicy(t *testing.T, ns, id string, allow []string) *unstructured.Unstructured {
	t.Helper()
	us, err := kubealloc.SandboxPolicies(sandboxnet.Cilium, ns, id, allow, selectors)
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 1 {
		t.Fatalf("%d Cilium policies for one sandbox", len(us))
	}
	return us[0]
}

// endpoint is a loopback listener standing in for every pod's init and data ports.
var (
	endpointOnce sync.Once
	endpointAddr string
)

func testEndpoints(t *testing.T) kubealloc.EndpointResolver {
	endpointOnce.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpointAddr = "tcp://" + l.Addr().String()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	})
	return func(p *corev1.Pod) (string, string, error) {
		if p.Status.PodIP == "" {
			return "", "", errors.New("no pod IP")
		}
		return endpointAddr, endpointAddr, nil
	}
}

// newAllocator starts an allocator (replica identity) on namespace ns; its requests are
// counted in counts when not nil.
func newAllocator(t *testing.T, ns, identity string, counts *kubealloc.RequestCounts) *kubealloc.Allocator {
	t.Helper()
	return newAllocatorWith(t, ns, identity, counts, nil)
}

func newAllocatorWith(t *testing.T, ns, identity string, counts *kubealloc.RequestCounts, mut func(*kubealloc.Options)) *kubealloc.Allocator {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	if counts != nil {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return kubealloc.NewCountingTransport(counts, rt) })
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := kubealloc.Options{
		Client: cs, Dynamic: dyn, Namespace: ns, Identity: identity,
		Templates:    map[string]kubealloc.Template{manager.DefaultTemplate: kubealloc.DefaultTemplate(image)},
		Selectors:    selectors,
		NodeName:     kubetest.NodeName,
		Endpoints:    testEndpoints(t),
		ReadyTimeout: 20 * time.Second,
	}
	if mut != nil {
		mut(&o)
	}
	a, err := kubealloc.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); a.Shutdown() })
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return a
}

// createPool creates n pods concurrently and waits until every allocator's cache counts
// them ready.
func createPool(t *testing.T, a *kubealloc.Allocator, prefix string, n int, all ...*kubealloc.Allocator) []string {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	ids := make([]string, n)
	errs := make(chan error, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
		go func() {
			_, err := a.Create(ctx, ids[i], manager.DefaultTemplate)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range append(all, a) {
		waitFor(t, func() bool { r, _ := b.Counts(manager.DefaultTemplate); return r == n })
	}
	return ids
}

// createDefaultDeny creates the default-deny CiliumNetworkPolicy in ns.
func createDefaultDeny(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	dd, err := kubealloc.DefaultDenyPolicy(sandboxnet.Cilium, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Create(ctx, dd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits for an informer-fed condition (test side only).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCreatePodSpecSecurity(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocator(t, ns, "replica-a", nil)
	ctx := testenv.Context(t, 2*time.Minute)
	start := time.Now()
	info, err := a.Create(ctx, "sb-0001", manager.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Create returned in %v", time.Since(start))
	if info.ID != "sb-0001" || info.Template != manager.DefaultTemplate || info.InitAddr != endpointAddr || info.DataAddr != endpointAddr {
		t.Fatalf("UnitInfo = %+v", info)
	}
	p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "sb-0001", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		t.Fatalf("pod phase %s IP %q, want Running with an IP", p.Status.Phase, p.Status.PodIP)
	}
	s := p.Spec
	c := s.Containers[0]
	csc := c.SecurityContext
	checks := []struct {
		name string
		ok   bool
	}{
		{"runtimeClassName gvisor", s.RuntimeClassName != nil && *s.RuntimeClassName == "gvisor"},
		{"automountServiceAccountToken false", s.AutomountServiceAccountToken != nil && !*s.AutomountServiceAccountToken},
		{"no host namespaces", !s.HostNetwork && !s.HostPID && !s.HostIPC},
		{"restartPolicy Never", s.RestartPolicy == corev1.RestartPolicyNever},
		// The server starts as root inside gVisor and runs its commands as 65532 (privsep).
		{"pod runAsUser 0, fsGroup 65532", s.SecurityContext.RunAsUser != nil && *s.SecurityContext.RunAsUser == 0 &&
			s.SecurityContext.FSGroup != nil && *s.SecurityContext.FSGroup == 65532},
		{"pod seccomp RuntimeDefault", s.SecurityContext.SeccompProfile != nil && s.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"one container", len(s.Containers) == 1 && len(s.InitContainers) == 0},
		{"container runAsUser 0", csc.RunAsUser != nil && *csc.RunAsUser == 0},
		{"commands run as 65532", slices.Contains(c.Args, "-command-user=65532:65532")},
		{"allowPrivilegeEscalation false", csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation},
		{"not privileged", csc.Privileged == nil || !*csc.Privileged},
		{"readOnlyRootFilesystem", csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem},
		{"drop ALL capabilities, add SETUID and SETGID", csc.Capabilities != nil && len(csc.Capabilities.Drop) == 1 && csc.Capabilities.Drop[0] == "ALL" &&
			slices.Equal(csc.Capabilities.Add, []corev1.Capability{"SETUID", "SETGID"})},
		{"container seccomp RuntimeDefault", csc.SeccompProfile != nil && csc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"cpu and memory requests", !c.Resources.Requests.Cpu().IsZero() && !c.Resources.Requests.Memory().IsZero()},
		{"a memory limit and no cpu quota", c.Resources.Limits.Cpu().IsZero() && !c.Resources.Limits.Memory().IsZero()},
		{"nodeSelector sandbox pool", s.NodeSelector["fusebox.dev/pool"] == "sandbox"},
		{"toleration for the sandbox taint", len(s.Tolerations) > 0 && s.Tolerations[0].Key == "fusebox.dev/sandbox"},
		{"ports init 7070 and data 7071", len(c.Ports) == 2 && c.Ports[0].Name == "init" && c.Ports[0].ContainerPort == 7070 && c.Ports[1].Name == "data" && c.Ports[1].ContainerPort == 7071},
		{"readiness probe on init", c.ReadinessProbe != nil && c.ReadinessProbe.TCPSocket != nil && c.ReadinessProbe.TCPSocket.Port.String() == "init"},
		{"server args", len(c.Args) >= 3 && c.Args[0] == "-init-listen=tcp://0.0.0.0:7070" && c.Args[1] == "-data-listen=tcp://0.0.0.0:7071" && c.Args[2] == "-workspace=/workspace"},
		{"workspace emptyDir Memory", len(s.Volumes) == 1 && s.Volumes[0].EmptyDir != nil && s.Volumes[0].EmptyDir.Medium == corev1.StorageMediumMemory &&
			len(c.VolumeMounts) == 1 && c.VolumeMounts[0].MountPath == "/workspace"},
		{"labels", p.Labels["app.kubernetes.io/name"] == "fusebox-sandbox" && p.Labels["fusebox.dev/template"] == manager.DefaultTemplate &&
			p.Labels["fusebox.dev/sandbox-id"] == "sb-0001"},
		// The pool state is an annotation: a label change would make the network plugin
		// recompute its rules for the pod.
		{"state annotation, no state label", p.Annotations[kubealloc.AnnotationState] == kubealloc.StateReady && p.Labels["fusebox.dev/state"] == ""},
	}
	for _, v := range s.Volumes {
		if v.HostPath != nil {
			t.Errorf("hostPath volume %s", v.Name)
		}
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("pod spec: %s: not met", c.name)
		}
	}
	if _, err := a.Create(ctx, "sb-0002", "nope"); !errors.Is(err, manager.ErrUnknownTemplate) {
		t.Errorf("unknown template: %v", err)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	ns := env.Namespace(t)
	// The pod becomes Ready but its endpoints cannot be resolved: Create fails and deletes it.
	a := newAllocatorWith(t, ns, "replica-a", nil, func(o *kubealloc.Options) {
		o.Endpoints = func(*corev1.Pod) (string, string, error) { return "", "", errors.New("no endpoint for this pod") }
	})
	ctx := testenv.Context(t, 2*time.Minute)
	_, err := a.Create(ctx, "fail-0001", manager.DefaultTemplate)
	if !errors.Is(err, manager.ErrAllocator) {
		t.Fatalf("Create: %v, want ErrAllocator", err)
	}
	waitFor(t, func() bool {
		_, err := env.Client.CoreV1().Pods(ns).Get(ctx, "fail-0001", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func TestConcurrentClaimsTwoReplicas(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocator(t, ns, "replica-a", nil)
	b := newAllocator(t, ns, "replica-b", nil)
	const pool, claims = 40, 200
	createPool(t, a, "pool", pool, b)
	ctx := testenv.Context(t, 2*time.Minute)
	type result struct {
		id, by string
		err    error
	}
	results := make(chan result, claims)
	startGate := make(chan struct{})
	for i := range claims {
		r := []*kubealloc.Allocator{a, b}[i%2]
		by := []string{"replica-a", "replica-b"}[i%2]
		go func() {
			<-startGate
			info, err := r.Claim(ctx, manager.DefaultTemplate)
			results <- result{info.ID, by, err}
		}()
	}
	close(startGate)
	byPod := map[string][]string{}
	noReady := 0
	for range claims {
		r := <-results
		switch {
		case errors.Is(r.err, kubealloc.ErrNoReady):
			noReady++
		case r.err != nil:
			t.Fatalf("claim: %v", r.err)
		default:
			byPod[r.id] = append(byPod[r.id], r.by)
		}
	}
	for id, by := range byPod {
		if len(by) != 1 {
			t.Errorf("pod %s claimed %d times: %v", id, len(by), by)
		}
	}
	if len(byPod) != pool || noReady != claims-pool {
		t.Errorf("claimed %d pods, %d ErrNoReady; want %d and %d", len(byPod), noReady, pool, claims-pool)
	}
	conflicts := a.ClaimConflicts() + b.ClaimConflicts()
	t.Logf("%d claims, %d pods claimed, %d conflicts retried", claims, len(byPod), conflicts)
	if conflicts == 0 {
		t.Errorf("no conflicts: the race was not exercised")
	}
	// The API server's view agrees: each pod claimed once, by the replica that got it.
	pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		by := byPod[p.Name]
		if p.Annotations[kubealloc.AnnotationState] != kubealloc.StateClaimed || len(by) != 1 || p.Annotations[kubealloc.AnnotationClaimedBy] != by[0] {
			t.Errorf("pod %s: state %q claimed-by %q, claims %v", p.Name, p.Annotations[kubealloc.AnnotationState], p.Annotations[kubealloc.AnnotationClaimedBy], by)
		}
	}
	if r, c := a.Counts(manager.DefaultTemplate); r != 0 || c != 0 {
		t.Errorf("Counts after claiming everything = %d ready, %d creating", r, c)
	}
}

// TestOneWriteClaimsTwoReplicas: two replicas pick from their caches and claim with the
// lease's write (ClaimBound) at once; each pod is bound exactly once, by the replica the API
// server says won it, the losers hear ErrUnitTaken, and nothing is bound twice.
func TestOneWriteClaimsTwoReplicas(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocator(t, ns, "replica-a", nil)
	b := newAllocator(t, ns, "replica-b", nil)
	const pool, allocs = 30, 120
	createPool(t, a, "ow", pool, b)
	ctx := testenv.Context(t, 2*time.Minute)
	type result struct {
		id, by string
		lost   int
		err    error
	}
	results := make(chan result, allocs)
	startGate := make(chan struct{})
	for i := range allocs {
		r := []*kubealloc.Allocator{a, b}[i%2]
		by := []string{"replica-a", "replica-b"}[i%2]
		go func() {
			<-startGate
			lost := 0
			for {
				u, err := r.Pick(manager.DefaultTemplate, func(string) bool { return false })
				if err != nil {
					results <- result{"", by, lost, err}
					return
				}
				err = r.ClaimBound(ctx, u, map[string]string{"fusebox.dev/owner": by})
				if errors.Is(err, manager.ErrUnitTaken) {
					lost++
					continue
				}
				results <- result{u.ID, by, lost, err}
				return
			}
		}()
	}
	close(startGate)
	byPod := map[string][]string{}
	noReady, lost := 0, 0
	for range allocs {
		r := <-results
		lost += r.lost
		switch {
		case errors.Is(r.err, kubealloc.ErrNoReady):
			noReady++
		case r.err != nil:
			t.Fatalf("pick and claim: %v", r.err)
		default:
			byPod[r.id] = append(byPod[r.id], r.by)
		}
	}
	t.Logf("%d allocations, %d pods bound, %d claims lost", allocs, len(byPod), lost)
	for id, by := range byPod {
		if len(by) != 1 {
			t.Errorf("pod %s bound %d times: %v", id, len(by), by)
		}
	}
	if len(byPod) != pool || noReady != allocs-pool {
		t.Errorf("bound %d pods, %d ErrNoReady; want %d and %d", len(byPod), noReady, pool, allocs-pool)
	}
	if lost == 0 {
		t.Errorf("no claim lost: the race was not exercised")
	}
	pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		by := byPod[p.Name]
		if p.Annotations[kubealloc.AnnotationState] != kubealloc.StateBound || len(by) != 1 ||
			p.Annotations[kubealloc.AnnotationClaimedBy] != by[0] || p.Annotations["fusebox.dev/owner"] != by[0] {
			t.Errorf("pod %s: state %q claimed-by %q owner %q, allocations %v", p.Name, p.Annotations[kubealloc.AnnotationState],
				p.Annotations[kubealloc.AnnotationClaimedBy], p.Annotations["fusebox.dev/owner"], by)
		}
	}
}

func TestBindEgressOnePolicyPerSandbox(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocator(t, ns, "replica-a", nil)
	ctx := testenv.Context(t, 2*time.Minute)
	ids := createPool(t, a, "eg", 2)
	allow := map[string][]string{
		ids[0]: {"api.github.com:443", "*.pypi.org:443", "192.0.2.10:8080", "[2001:db8::1]:443"},
		ids[1]: {"example.com:80"},
	}
	for _, id := range ids {
		if err := a.BindEgress(ctx, id, allow[id]); err != nil {
			t.Fatal(err)
		}
	}
	// Rebinding replaces, never adds a second object.
	allow[ids[1]] = []string{"example.org:443"}
	if err := a.BindEgress(ctx, ids[1], allow[ids[1]]); err != nil {
		t.Fatal(err)
	}
	pols, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pols.Items) != len(ids) {
		t.Fatalf("%d policies, want %d", len(pols.Items), len(ids))
	}
	for _, id := range ids {
		got, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Get(ctx, kubealloc.PolicyName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := ciliumPolicy(t, ns, id, allow[id])
		if !equality.Semantic.DeepEqual(got.Object["spec"], want.Object["spec"]) {
			t.Errorf("policy %s spec\n got %v\nwant %v", id, got.Object["spec"], want.Object["spec"])
		}
		if refs := got.GetOwnerReferences(); len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].Name != id {
			t.Errorf("policy %s owner references %v", id, refs)
		}
	}
	// Spot-check the first policy's shape as read back from the API server.
	got, _ := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Get(ctx, kubealloc.PolicyName(ids[0]), metav1.GetOptions{})
	spec := got.Object["spec"].(map[string]any)
	if sel := spec["endpointSelector"].(map[string]any)["matchLabels"].(map[string]any); sel[kubealloc.LabelSandboxID] != ids[0] || len(sel) != 1 {
		t.Errorf("endpointSelector %v", sel)
	}
	want := fmt.Sprint([]any{
		map[string]any{"toEndpoints": []any{map[string]any{"matchLabels": map[string]any{"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}},
			"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "53", "protocol": "UDP"}, map[string]any{"port": "53", "protocol": "TCP"}},
				// Only the allowlisted names can be looked up.
				"rules": map[string]any{"dns": []any{map[string]any{"matchName": "api.github.com"}, map[string]any{"matchPattern": "*.pypi.org"}}}}}},
		map[string]any{"toFQDNs": []any{map[string]any{"matchName": "api.github.com"}, map[string]any{"matchPattern": "*.pypi.org"}},
			"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "443", "protocol": "TCP"}}}}},
		map[string]any{"toCIDR": []any{"2001:db8::1/128"},
			"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "443", "protocol": "TCP"}}}}},
		map[string]any{"toCIDR": []any{"192.0.2.10/32"},
			"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "8080", "protocol": "TCP"}}}}},
	})
	if g := fmt.Sprint(spec["egress"]); g != want {
		t.Errorf("egress\n got %s\nwant %s", g, want)
	}
	if err := a.BindEgress(ctx, "missing", nil); !errors.Is(err, manager.ErrUnitNotFound) {
		t.Errorf("BindEgress on a missing pod: %v", err)
	}
	if err := a.BindEgress(ctx, ids[0], []string{"no-port"}); !errors.Is(err, manager.ErrInvalid) {
		t.Errorf("BindEgress with a bad entry: %v", err)
	}
}

func TestDestroyDeletesPodAndPolicy(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocator(t, ns, "replica-a", nil)
	ctx := testenv.Context(t, 2*time.Minute)
	ids := createPool(t, a, "ds", 1)
	if err := a.BindEgress(ctx, ids[0], []string{"example.com:443"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Destroy(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	_, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Get(ctx, kubealloc.PolicyName(ids[0]), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("policy after Destroy: %v", err)
	}
	waitFor(t, func() bool {
		_, err := env.Client.CoreV1().Pods(ns).Get(ctx, ids[0], metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := a.Destroy(ctx, ids[0]); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	waitFor(t, func() bool { l, _ := a.List(ctx); return len(l) == 0 })
}

func TestNewReplicaListsExistingPods(t *testing.T) {
	ns := env.Namespace(t)
	a := newAllocator(t, ns, "replica-a", nil)
	ctx := testenv.Context(t, 2*time.Minute)
	ids := createPool(t, a, "ad", 2)
	info, err := a.Claim(ctx, manager.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	lease := map[string]string{"fusebox.dev/state": "bound", "fusebox.dev/lease-expires": "2030-01-01T00:00:00Z"}
	waitFor(t, func() bool {
		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, info.ID, metav1.GetOptions{})
		return err == nil && p.Annotations[kubealloc.AnnotationState] == kubealloc.StateClaimed
	})
	waitFor(t, func() bool { l, _ := a.List(ctx); return len(l) == 2 })
	// Annotate needs the claim in a's cache (it refuses pods claimed elsewhere).
	if err := a.Annotate(ctx, info.ID, lease); err != nil {
		t.Fatal(err)
	}
	// A new replica (a restarted manager) sees both pods, the bound one with its lease.
	c := newAllocator(t, ns, "replica-c", nil)
	units, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(units) != len(ids) {
		t.Fatalf("List = %d units, want %d", len(units), len(ids))
	}
	for _, u := range units {
		if u.Template != manager.DefaultTemplate || u.InitAddr == "" || u.Created.IsZero() {
			t.Errorf("unit %+v", u)
		}
		if u.ID == info.ID {
			if !equality.Semantic.DeepEqual(u.Annotations, lease) {
				t.Errorf("annotations of %s = %v, want %v", u.ID, u.Annotations, lease)
			}
		} else if len(u.Annotations) != 0 {
			t.Errorf("annotations of unbound %s = %v", u.ID, u.Annotations)
		}
	}
	p, _ := env.Client.CoreV1().Pods(ns).Get(ctx, info.ID, metav1.GetOptions{})
	if p.Annotations[kubealloc.AnnotationState] != kubealloc.StateBound || p.Annotations[kubealloc.AnnotationClaimedBy] != "replica-a" {
		t.Errorf("bound pod labels %v annotations %v", p.Labels, p.Annotations)
	}
	// Replica c may rewrite the bound pod's lease (a renewal reaching another replica)...
	if err := c.Annotate(ctx, info.ID, lease); err != nil {
		t.Errorf("renewing another replica's bound pod: %v", err)
	}
	// ...but not bind a pod that replica a claimed and has not bound yet (whether or not c's
	// cache has seen the claim: a stale view fails the resourceVersion precondition).
	claimed, err := a.Claim(ctx, manager.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Annotate(ctx, claimed.ID, lease); !errors.Is(err, manager.ErrBadTransition) {
		t.Errorf("binding a pod another replica claimed: %v, want ErrBadTransition", err)
	}
	if err := c.Annotate(ctx, "missing", lease); !errors.Is(err, manager.ErrUnitNotFound) {
		t.Errorf("Annotate of a missing pod: %v", err)
	}
}

func TestCheckDefaultDeny(t *testing.T) {
	ns := env.Namespace(t)
	ctx := testenv.Context(t, 2*time.Minute)
	if err := kubealloc.CheckDefaultDeny(ctx, env.Dynamic, ns, sandboxnet.Cilium); !errors.Is(err, kubealloc.ErrNoDefaultDeny) {
		t.Fatalf("without the policy: %v", err)
	}
	// A policy under the right name that does not deny is refused too.
	weak, err := ciliumPolicy(t, ns, "x", []string{"example.com:443"}), error(nil)
	if err != nil {
		t.Fatal(err)
	}
	weak.SetName(kubealloc.DefaultDenyName)
	if _, err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Create(ctx, weak, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kubealloc.CheckDefaultDeny(ctx, env.Dynamic, ns, sandboxnet.Cilium); !errors.Is(err, kubealloc.ErrNoDefaultDeny) {
		t.Fatalf("with a different policy: %v", err)
	}
	if err := env.Dynamic.Resource(kubealloc.CiliumNetworkPolicyGVR).Namespace(ns).Delete(ctx, kubealloc.DefaultDenyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createDefaultDeny(t, ctx, ns)
	if err := kubealloc.CheckDefaultDeny(ctx, env.Dynamic, ns, sandboxnet.Cilium); err != nil {
		t.Fatalf("with the policy: %v", err)
	}
}

func TestAPIRequestsPerAllocationConstant(t *testing.T) {
	ns := env.Namespace(t)
	var counts kubealloc.RequestCounts
	a := newAllocator(t, ns, "replica-a", &counts)
	ctx := testenv.Context(t, 2*time.Minute)
	const n = 8
	createPool(t, a, "rq", n)
	before := counts.Snapshot()
	for i := range n / 2 {
		info, err := a.Claim(ctx, manager.DefaultTemplate)
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if err := a.BindEgress(ctx, info.ID, []string{"example.com:443"}); err != nil {
			t.Fatal(err)
		}
		if err := a.Annotate(ctx, info.ID, map[string]string{"fusebox.dev/state": "bound"}); err != nil {
			t.Fatal(err)
		}
	}
	d := kubealloc.Diff(before, counts.Snapshot())
	delete(d, "watch") // informer watches may be re-established at any time
	t.Logf("requests for %d allocations claimed separately: %v", n/2, d)
	want := map[string]int{"update": n / 2, "patch": n}
	if !equality.Semantic.DeepEqual(d, want) {
		t.Errorf("requests for %d allocations = %v, want %v (1 claim update, 1 policy apply, 1 annotate patch each; no get or list)", n/2, d, want)
	}
	before = counts.Snapshot()
	for i := range n / 2 {
		info, err := a.Pick(manager.DefaultTemplate, func(string) bool { return false })
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if err := a.ClaimBound(ctx, info, map[string]string{"fusebox.dev/owner": "x"}); err != nil {
			t.Fatal(err)
		}
		if err := a.BindEgress(ctx, info.ID, []string{"example.com:443"}); err != nil {
			t.Fatal(err)
		}
	}
	d = kubealloc.Diff(before, counts.Snapshot())
	delete(d, "watch")
	t.Logf("requests for %d allocations claimed by the lease's write: %v", n/2, d)
	if want := map[string]int{"patch": n}; !equality.Semantic.DeepEqual(d, want) {
		t.Errorf("requests for %d allocations = %v, want %v (1 claim-and-lease patch, 1 policy apply each; no get or list)", n/2, d, want)
	}
}
