// Package clusterup runs `fusebox up --stack local` (infra.Program through the Automation
// API, Pulumi waiting for every resource to be ready: no skipAwait) against a real
// single-node cluster (test/nodetest, with the scheduler, the workload controllers,
// ServiceAccount tokens and kube-proxy), with the images `fusebox image build` makes imported
// into the node under the digests the stack pins. The manager's two replicas run as pods and
// fill the warm pool with gVisor sandbox pods; an agent authenticated with a ServiceAccount
// token allocates through the manager's Service and works in its sandbox over the direct
// data plane; the stack's NetworkPolicy, enforced by kube-router, keeps other pods off the
// sandbox and the sandbox off the manager, the node and other sandboxes; a second `up` (a new
// sandbox image, a changed fusebox:access) rolls the manager onto the new access rule and
// replaces the warm pods while a bound sandbox keeps serving; `fusebox destroy` leaves nothing
// behind.
package clusterup

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/infra/deploy"
	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/bench"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/kubetest"
	"github.com/fusebox-dev/fusebox/test/nodetest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// The stack's namespaces, which the test makes before up (existingNamespaces, the stack's
// fusebox:namespaces).
const (
	managerNamespace   = "fusebox-system"
	sandboxNamespace   = "fusebox-sandboxes"
	existingNamespaces = "  fusebox:namespaces:\n    manager: " + managerNamespace + "\n    sandbox: " + sandboxNamespace + "\n    create: false\n"
)

// registry is the stack's registry: the images are never pulled from it, the node holds
// them under these names (Node.Tag).
const registry = "localhost/fusebox"

var node *nodetest.Node

func TestMain(m *testing.M) {
	code := nodetest.StopAtExit(node, m.Run())
	if deployed != nil {
		os.RemoveAll(deployed.dir)
	}
	imagetest.Cleanup()
	os.Exit(code)
}

// deployment is the local stack as up made it on the node, and the agent's settings.
type deployment struct {
	opts                 deploy.Options
	progress             *bytes.Buffer
	before               map[string]bool // the API server's objects before up
	managerNS, sandboxNS string
	release              infra.ReleaseImages
	built                map[string]imagetest.Built // the release images, by name
	svc                  *corev1.Service            // the manager's
	addr                 string                     // tcp://<the Service's address>:<port>
	ca                   []byte                     // the manager's CA, as it publishes it
	agent                client.AllocateOptions
	dir                  string // the token files, the CA, Pulumi's state
	destroyed            bool
}

var (
	deployOnce sync.Once
	deployed   *deployment
	deployErr  error
)

// up starts the node and runs fusebox up once per test binary (TestMain stops the node, and
// what up made with it).
func up(tb testing.TB) *deployment {
	tb.Helper()
	tools := os.Getenv("FUSEBOX_PULUMI_TOOLS")
	if tools == "" {
		tools = "/var/cache/fusebox/pulumi-v3.274.1-k8s-4.25.0"
	}
	if _, err := os.Stat(filepath.Join(tools, "bin", "pulumi")); err != nil {
		tb.Fatalf("Pulumi tools missing in %s: run make tools", tools)
	}
	built := imagetest.Release(tb)
	deployOnce.Do(func() { deployed, deployErr = deployUp(tools, built) })
	if errors.Is(deployErr, nodetest.ErrNoBinaries) && os.Getenv("FUSEBOX_SKIP_KUBE") == "1" {
		tb.Skip(deployErr)
	}
	if deployErr != nil {
		tb.Fatal(deployErr)
	}
	return deployed
}

func deployUp(tools string, built map[string]imagetest.Built) (*deployment, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	d := &deployment{release: infra.ReleaseImages{}, built: built, progress: &bytes.Buffer{}}
	var err error
	if d.dir, err = os.MkdirTemp("", "clusterup-"); err != nil {
		return nil, err
	}
	// The node, with the release's manager and sandbox images under the names the stack pins.
	node, err = nodetest.Start(ctx, nodetest.Options{Deployments: true,
		Images: []string{built[image.Manager].Tar, built[image.Sandbox].Tar}})
	if err != nil {
		return nil, err
	}
	for _, name := range []string{image.Manager, image.Sandbox, image.GVisorInstaller} {
		b := built[name]
		d.release[name] = registry + "/" + name + "@" + b.Digest
		if name != image.GVisorInstaller {
			// containerd's CRI finds an image by the normalized form of its names, and the
			// archive's name (fusebox/<name>:latest) has no domain: without its normalized
			// name too, the kubelet's CreateContainer fails ("docker.io/fusebox/manager:latest":
			// not found) though the pinned name resolves.
			refs := []string{d.release[name]}
			if first, _, _ := strings.Cut(b.ImportName, "/"); !strings.ContainsAny(first, ".:") && first != "localhost" {
				refs = append(refs, "docker.io/"+b.ImportName)
			}
			for _, ref := range refs {
				if err := node.Tag(ctx, b.ImportName, ref); err != nil {
					return nil, err
				}
			}
		}
	}
	env := node.Env
	// The harness made a gvisor RuntimeClass; the program makes its own.
	env.Client.NodeV1().RuntimeClasses().Delete(ctx, "gvisor", metav1.DeleteOptions{})

	// The agents: ServiceAccount default/agent (the stack's dataClientNamespaces, which its
	// default access rule lets allocate) on this host (dataClientCIDRs names the node's
	// address, so that its connections reach the sandboxes' data port); namespace elsewhere
	// holds nobody's agent. Made before the snapshot: destroy must not remove them.
	core := env.Client.CoreV1()
	// The stack's namespaces are made beforehand (namespaces.create: false, as where they
	// hold image pull secrets): destroy leaves them, and no namespace deletion takes the
	// sandboxes with it. Each is settled (its default ServiceAccount made) before the snapshot.
	for _, ns := range []string{"elsewhere", managerNamespace, sandboxNamespace} {
		if err := node.Namespace(ctx, ns); err != nil {
			return nil, err
		}
	}
	for _, sa := range [][2]string{{"default", "agent"}, {"elsewhere", "stranger"}} {
		if _, err := core.ServiceAccounts(sa[0]).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa[1]}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	stack, err := stackFile(d.release, existingNamespaces)
	if err != nil {
		return nil, err
	}
	project, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "infra", "Pulumi.yaml"))
	if err != nil {
		return nil, err
	}
	repo := filepath.Join(d.dir, "repo")
	for path, b := range map[string][]byte{"infra/Pulumi.yaml": project, "stacks/Pulumi.local.yaml": stack} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, path)), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(repo, path), b, 0o644); err != nil {
			return nil, err
		}
	}
	if d.before, err = env.Snapshot(ctx); err != nil {
		return nil, err
	}
	d.opts = deploy.Options{Stack: "local", RepoDir: repo, Tools: tools,
		Backend: "file://" + filepath.Join(d.dir, "state"), Env: map[string]string{"KUBECONFIG": filepath.Join(env.Dir, "kubeconfig")},
		Progress: d.progress}
	if err := os.MkdirAll(filepath.Join(d.dir, "state"), 0o700); err != nil {
		return nil, err
	}
	start := time.Now()
	res, err := deploy.Run(ctx, deploy.Up, d.opts)
	if err != nil {
		return nil, fmt.Errorf("up: %w\n%s\n%s", err, d.progress.String(), clusterState(ctx))
	}
	fmt.Fprintf(os.Stderr, "clusterup: fusebox up took %s: %v\n", time.Since(start).Round(time.Second), res.Changes)
	d.managerNS, _ = res.Outputs["namespaces"].(map[string]any)["manager"].(string)
	d.sandboxNS, _ = res.Outputs["namespaces"].(map[string]any)["sandbox"].(string)
	if d.managerNS == "" || d.sandboxNS == "" {
		return nil, fmt.Errorf("up's outputs name no namespaces: %v", res.Outputs)
	}

	// The agent: a ServiceAccount token for the manager's audience, the CA the manager
	// publishes, the manager's Service.
	tok, err := token(ctx, "default", "agent", manager.DefaultTokenAudience)
	if err != nil {
		return nil, err
	}
	cm, err := core.ConfigMaps(d.managerNS).Get(ctx, manager.CAConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the manager's CA: %w", err)
	}
	d.ca = []byte(cm.Data["ca.crt"])
	d.agent = client.AllocateOptions{TokenFile: filepath.Join(d.dir, "token"), CAFile: filepath.Join(d.dir, "ca.crt"),
		ServerName: fmt.Sprintf("fusebox-manager.%s.svc", d.managerNS)}
	if err := os.WriteFile(d.agent.TokenFile, []byte(tok), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(d.agent.CAFile, d.ca, 0o600); err != nil {
		return nil, err
	}
	if d.svc, err = core.Services(d.managerNS).Get(ctx, "fusebox-manager", metav1.GetOptions{}); err != nil {
		return nil, err
	}
	d.addr = fmt.Sprintf("tcp://%s:%d", d.svc.Spec.ClusterIP, manager.DefaultGRPCPort)
	return d, nil
}

func TestUpOnARealNode(t *testing.T) {
	d := up(t)
	if d.destroyed {
		t.Fatal("the deployment was destroyed already")
	}
	env := node.Env
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	defer func() {
		if t.Failed() {
			t.Log(clusterState(context.Background()))
		}
	}()
	managerNS, sandboxNS, addr, agent, svc, release := d.managerNS, d.sandboxNS, d.addr, d.agent, d.svc, d.release

	// Pulumi waited for the manager's rollout, and a replica is ready only once the warm
	// pool has held a ready sandbox: both hold now, with no waiting here.
	dep, err := env.Client.AppsV1().Deployments(managerNS).Get(ctx, "fusebox-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Status.ReadyReplicas < 2 {
		t.Fatalf("up returned with %d ready manager replicas, want 2", dep.Status.ReadyReplicas)
	}
	warm := readySandboxPods(ctx, t, sandboxNS)
	if len(warm) == 0 {
		t.Fatal("up returned with no ready warm sandbox pod")
	}
	dir := t.TempDir()

	a, err := client.Allocate(ctx, addr, agent)
	if err != nil {
		t.Fatalf("Allocate through the manager's Service %s: %v", addr, err)
	}
	defer a.Close()
	if !strings.HasPrefix(a.Endpoint, "tcp://"+nodetest.Net+".") {
		t.Fatalf("endpoint %q is not a pod address on the node's bridge", a.Endpoint)
	}
	run, err := a.Sandbox.Run(ctx, "cat", "/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.ToLower(string(run.Stdout)), "gvisor") {
		t.Fatalf("/proc/version = %q, want gVisor's", run.Stdout)
	}
	files := make([]client.File, 100)
	for i := range files {
		files[i] = client.File{Path: fmt.Sprintf("d%d/f%03d.txt", i%10, i), Data: bytes.Repeat([]byte{byte(i)}, 1000+i), Mode: 0o644}
	}
	if _, err := a.Sandbox.WriteFiles(ctx, files, nil, nil); err != nil {
		t.Fatal(err)
	}
	got, _, err := a.Sandbox.ReadFiles(ctx, "d*/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !bytes.Equal(got[f.Path], f.Data) {
			t.Fatalf("%s differs after the round trip (%d files read back)", f.Path, len(got))
		}
	}

	// Refusals at the manager: plaintext, no token, an egress destination above the ceiling
	// (the default access rule allows none).
	plain, err := grpc.NewClient(strings.TrimPrefix(addr, "tcp://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, err = managerv1.NewManagerClient(plain).List(ctx, &managerv1.ListRequest{})
	refused(t, "a plaintext client", err, codes.Unauthenticated, "TLS")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(d.ca)
	tlsOnly, err := grpc.NewClient(strings.TrimPrefix(addr, "tcp://"), grpc.WithTransportCredentials(
		credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: agent.ServerName, MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	defer tlsOnly.Close()
	_, err = managerv1.NewManagerClient(tlsOnly).List(ctx, &managerv1.ListRequest{})
	refused(t, "a client without a token", err, codes.Unauthenticated, "no bearer token")
	wrongAudience := agent
	wrongAudience.TokenFile = filepath.Join(dir, "api-token")
	writeFile(t, wrongAudience.TokenFile, mustToken(ctx, t, "default", "agent", "https://kubernetes.default.svc"))
	_, err = client.Allocate(ctx, addr, wrongAudience)
	refused(t, "a token for the API server", err, codes.Unauthenticated, "audience")
	stranger := agent
	stranger.TokenFile = filepath.Join(dir, "stranger-token")
	writeFile(t, stranger.TokenFile, mustToken(ctx, t, "elsewhere", "stranger", manager.DefaultTokenAudience))
	_, err = client.Allocate(ctx, addr, stranger)
	refused(t, "a ServiceAccount outside the policy", err, codes.PermissionDenied, "elsewhere/stranger")
	outside := agent
	outside.Egress = []string{nodetest.NodeIP + ":443"}
	_, err = client.Allocate(ctx, addr, outside)
	refused(t, "egress outside the ceiling", err, codes.PermissionDenied, nodetest.NodeIP+":443")

	// The network: a pod that is nobody's agent reaches neither of the sandbox's ports; the
	// sandbox reaches neither the manager (pod or Service), the node (kubelet, API server)
	// nor another sandbox.
	host := strings.TrimSuffix(strings.TrimPrefix(a.Endpoint, "tcp://"), fmt.Sprintf(":%d", kubealloc.DataPort))
	initPort, dataPort := fmt.Sprintf("%s:%d", host, kubealloc.InitPort), fmt.Sprintf("%s:%d", host, kubealloc.DataPort)
	probed, err := node.Probe(ctx, "elsewhere", map[string]string{"app": "curious"}, release[image.Sandbox], initPort, dataPort)
	if err != nil {
		t.Fatal(err)
	}
	if probed[initPort] != "blocked" || probed[dataPort] != "blocked" {
		t.Fatalf("from a pod outside the agents: %v, want both of the sandbox's ports blocked", probed)
	}
	mgrPods, err := managerPods(ctx, managerNS)
	if err != nil || len(mgrPods) == 0 {
		t.Fatalf("manager pods: %v", err)
	}
	targets := []string{fmt.Sprintf("%s:%d", mgrPods[0].Status.PodIP, manager.DefaultGRPCPort),
		fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, manager.DefaultGRPCPort), nodetest.NodeIP + ":20250",
		fmt.Sprintf("%s:%d", nodetest.NodeIP, nodetest.APIServerPort)}
	for _, p := range readySandboxPods(ctx, t, sandboxNS) {
		if p.Status.PodIP != host {
			targets = append(targets, fmt.Sprintf("%s:%d", p.Status.PodIP, kubealloc.DataPort))
			break
		}
	}
	inside, err := a.Sandbox.Run(ctx, append([]string{"python3", "-c", nodetest.ProbeScript}, targets...)...)
	if err != nil {
		t.Fatal(err)
	}
	probed = nodetest.ProbeResults(string(inside.Stdout))
	for _, target := range targets {
		if probed[target] != "blocked" {
			t.Errorf("from inside the sandbox, %s is %q, want blocked (all: %v, stderr %q)", target, probed[target], probed, inside.Stderr)
		}
	}
	if len(targets) < 5 {
		t.Errorf("no second sandbox to probe: the pool holds %v", warm)
	}

	// A second up, an upgrade, while the agent keeps its sandbox.
	upgrade(ctx, t, d, a)
	if err := a.Close(); err != nil {
		t.Fatalf("releasing the sandbox: %v", err)
	}

	// destroy removes everything up made, every sandbox before any policy (the namespaces,
	// made beforehand, stay: no namespace deletion takes the sandboxes with it), and nothing
	// else is left.
	d.destroyed = true
	destroyConfined(ctx, t, d)
	for _, ns := range []string{sandboxNS, managerNS} {
		if _, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace %s, made before up, after destroy: %v", ns, err)
		}
	}
	after, err := env.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The leader election's Lease, which the managers made for themselves (client-go's
	// election sets no owner), stays with namespaces.create: false, where no namespace
	// deletion takes it; docs/deploy.md names it. Their TLS Secret and CA ConfigMap are
	// owned by the Deployment, and gone with it.
	managersOwn := map[string]bool{"leases.coordination.k8s.io/" + managerNS + "/fusebox-manager": true}
	var left []string
	for _, k := range kubetest.Diff(after, d.before) {
		// The cluster's own records of the node and of leader elections are not the stack's.
		if !strings.HasPrefix(k, "leases.coordination.k8s.io/kube-node-lease/") && !managersOwn[k] {
			left = append(left, k)
		}
	}
	if len(left) > 0 {
		t.Errorf("destroy left behind %d objects:\n%s", len(left), strings.Join(left, "\n"))
	}
}

// stackFile is stacks/Pulumi.local.yaml with release written in as `fusebox release` writes
// it, the sandboxes sized for this 2-CPU node, this host as an agent (dataClientCIDRs), and
// extra (YAML lines under config:, indented two spaces) at the end of its config.
func stackFile(release infra.ReleaseImages, extra string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "stacks", "Pulumi.local.yaml"))
	if err != nil {
		return nil, err
	}
	local := string(b)
	for _, r := range [][2]string{
		{"    sandboxCPU: 500m\n", "    sandboxCPU: 100m\n"},
		{"    dataClientNamespaces: [default]", "    dataClientNamespaces: [default]\n    dataClientCIDRs: [" + nodetest.NodeIP + "/32]"},
	} {
		if !strings.Contains(local, r[0]) {
			return nil, fmt.Errorf("stacks/Pulumi.local.yaml has no %q to change", r[0])
		}
		local = strings.Replace(local, r[0], r[1], 1)
	}
	out, _, err := infra.ReleaseStackFile([]byte(local), "stacks/Pulumi.local.yaml", registry, release)
	if err != nil || extra == "" {
		return out, err
	}
	if !strings.HasPrefix(string(out), "config:\n") && !strings.Contains(string(out), "\nconfig:\n") {
		return nil, errors.New("stacks/Pulumi.local.yaml has no config: to extend")
	}
	return append(out, extra...), nil
}

// token is a token of ServiceAccount ns/name for audience aud, from TokenRequest (what the
// kubelet projects into an agent pod).
func token(ctx context.Context, ns, name, aud string) (string, error) {
	tr, err := node.Env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

func mustToken(ctx context.Context, t *testing.T, ns, name, aud string) string {
	t.Helper()
	tok, err := token(ctx, ns, name, aud)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// readySandboxPods lists the Ready pods of namespace ns.
func readySandboxPods(ctx context.Context, t testing.TB, ns string) []corev1.Pod {
	t.Helper()
	pods, err := node.Env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// refused fails the test unless err is a gRPC error with code whose message holds want.
func refused(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	s, _ := status.FromError(err) // the status err wraps, if any
	if err == nil || s.Code() != code || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %v, want %v naming %q", what, err, code, want)
	}
}

// clusterState describes the cluster's pods and the managers' logs, for a failing test.
func clusterState(ctx context.Context) string {
	var b strings.Builder
	pods, err := node.Env.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s: %s %s ip=%s", p.Namespace, p.Name, p.Status.Phase, p.Status.Reason, p.Status.PodIP)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, " [%s=%s %s]", c.Type, c.Status, c.Message)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " [%s waiting: %s %s]", cs.Name, w.Reason, w.Message)
			}
		}
		b.WriteString("\n")
		if strings.HasPrefix(p.Name, "fusebox-manager-") {
			log := node.PodLog(p.Namespace, p.Name, "manager")
			lines := strings.Split(strings.TrimSpace(log), "\n")
			fmt.Fprintf(&b, "--- last lines of its log:\n%s\n", strings.Join(lines[max(0, len(lines)-25):], "\n"))
		}
	}
	b.WriteString(node.Logs())
	return b.String()
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAllocateThroughTheService measures warm allocations as an agent on the node makes
// them, with fusebox-bench allocate --manager's loop (bench.AllocateRemote): Allocate through
// the manager's Service (TLS, token), the sandbox's sFuse, and the first data-plane call to
// the pod (Stat), each from a pool holding its target of ready sandboxes (the wait for the
// refill is not timed). It reports the p50 and p99 of the whole, and of its two steps: until
// the manager's answer, and from it to the first call's end. Run it alone (TestUpOnARealNode
// destroys the deployment):
//
//	go test -run '^$' -bench AllocateThroughTheService -benchtime 50x ./test/clusterup
func BenchmarkAllocateThroughTheService(b *testing.B) {
	d := up(b)
	if d.destroyed {
		b.Skip("TestUpOnARealNode destroyed the deployment: run the benchmark alone (-run '^$')")
	}
	ctx := context.Background()
	metrics, err := managerMetrics(ctx, d.managerNS)
	if err != nil {
		b.Fatal(err)
	}
	before, err := bench.ScrapeManagerSteps(ctx, metrics)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	r, err := bench.AllocateRemote(ctx, bench.RemoteOptions{Manager: d.addr, Runs: b.N,
		ManagerOptions: []client.ManagerOption{client.WithTokenFile(d.agent.TokenFile), client.WithCAFile(d.agent.CAFile),
			client.WithServerName(d.agent.ServerName)},
		// Each from a full and quiet pool, as the local figures: the pod of the sandbox
		// released before is gone and its replacement made.
		Wait: 3 * time.Minute})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.AllocateP50Ms, "p50-ms")
	b.ReportMetric(r.AllocateP99Ms, "p99-ms")
	b.ReportMetric(r.AnswerP50Ms, "answer-p50-ms")
	b.ReportMetric(r.AnswerP99Ms, "answer-p99-ms")
	b.ReportMetric(r.FirstCallP50Ms, "first-call-p50-ms")
	b.ReportMetric(r.FirstCallP99Ms, "first-call-p99-ms")
	b.ReportMetric(r.ConnectP50Ms, "first-call-connect-p50-ms")
	b.ReportMetric(r.ConnectP99Ms, "first-call-connect-p99-ms")
	b.ReportMetric(r.ReplyP50Ms, "first-call-reply-p50-ms")
	b.ReportMetric(r.ReplyP99Ms, "first-call-reply-p99-ms")
	b.ReportMetric(float64(r.ColdWaits), "cold-waits")
	after, err := bench.ScrapeManagerSteps(ctx, metrics)
	if err != nil {
		b.Fatal(err)
	}
	// The manager's side of the answer: each step's mean over the run, both replicas'
	// allocations together (egress, annotate and init run concurrently).
	steps := after.Sub(before)
	for _, name := range steps.Names() {
		b.ReportMetric(steps[name].MeanMs(), name+"-mean-ms")
	}
}

// managerMetrics are the /metrics addresses of the manager's pods in namespace ns, by pod IP
// on the node's bridge.
func managerMetrics(ctx context.Context, ns string) ([]string, error) {
	pods, err := managerPods(ctx, ns)
	if err != nil {
		return nil, err
	}
	var urls []string
	for _, p := range pods {
		if p.Status.PodIP != "" {
			urls = append(urls, fmt.Sprintf("http://%s/metrics", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(manager.DefaultMetricsPort))))
		}
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("no manager pod with an IP in namespace %s", ns)
	}
	return urls, nil
}

// managerPods are the manager's pods in namespace ns.
func managerPods(ctx context.Context, ns string) ([]corev1.Pod, error) {
	pods, err := node.Env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=fusebox-manager"})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}
