// Package clusterup runs `fusebox up --stack local` (infra.Program through the Automation
// API, Pulumi waiting for every resource to be ready: no skipAwait) against a real
// single-node cluster (test/nodetest, with the scheduler, the workload controllers,
// ServiceAccount tokens and kube-proxy), with the images `fusebox image build` makes imported
// into the node under the digests the stack pins. The manager's two replicas run as pods and
// fill the warm pool with gVisor sandbox pods; an agent authenticated with a ServiceAccount
// token allocates through the manager's Service and works in its sandbox over the direct
// data plane; the stack's NetworkPolicy, enforced by kube-router, keeps other pods off the
// sandbox and the sandbox off the manager, the node and other sandboxes; `fusebox destroy`
// leaves nothing behind.
package clusterup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/components/manager"
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/infra/deploy"
	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/kubetest"
	"github.com/fusebox-dev/fusebox/test/nodetest"
)

// registry is the stack's registry: the images are never pulled from it, the node holds
// them under these names (Node.Tag).
const registry = "localhost/fusebox"

var node *nodetest.Node

func TestMain(m *testing.M) {
	code := m.Run()
	if node != nil {
		if err := node.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the node:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	imagetest.Cleanup()
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestUpOnARealNode(t *testing.T) {
	tools := os.Getenv("FUSEBOX_PULUMI_TOOLS")
	if tools == "" {
		tools = "/var/cache/fusebox/pulumi-v3.274.1-k8s-4.25.0"
	}
	if _, err := os.Stat(filepath.Join(tools, "bin", "pulumi")); err != nil {
		t.Fatalf("Pulumi tools missing in %s: run make tools", tools)
	}
	built := imagetest.Release(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	// The node, with the release's manager and sandbox images under the names the stack pins.
	var err error
	node, err = nodetest.Start(ctx, nodetest.Options{Deployments: true,
		Images: []string{built[image.Manager].Tar, built[image.Sandbox].Tar}})
	if errors.Is(err, nodetest.ErrNoBinaries) && os.Getenv("FUSEBOX_SKIP_KUBE") == "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	release := infra.ReleaseImages{}
	for _, name := range []string{image.Manager, image.Sandbox, image.GVisorInstaller} {
		b := built[name]
		release[name] = registry + "/" + name + "@" + b.Digest
		if name != image.GVisorInstaller {
			if err := node.Tag(ctx, b.ImportName, release[name]); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := node.Env
	// The harness made a gvisor RuntimeClass; the program makes its own.
	env.Client.NodeV1().RuntimeClasses().Delete(ctx, "gvisor", metav1.DeleteOptions{})

	// The agents: ServiceAccount default/agent (the stack's dataClientNamespaces, which its
	// default access rule lets allocate) on this host (dataClientCIDRs names the node's
	// address, so that its connections reach the sandboxes' data port); a pod elsewhere is
	// nobody's agent. Made before the snapshot: destroy must not remove them.
	sas := env.Client.CoreV1().ServiceAccounts("default")
	if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stack := stackFile(t, release)
	repo := t.TempDir()
	for dir, files := range map[string]map[string][]byte{"infra": {"Pulumi.yaml": readFile(t, filepath.Join(repoRoot(), "infra", "Pulumi.yaml"))},
		"stacks": {"Pulumi.local.yaml": stack}} {
		if err := os.MkdirAll(filepath.Join(repo, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(repo, dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	before, err := env.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}

	var progress bytes.Buffer
	opts := deploy.Options{Stack: "local", RepoDir: repo, Tools: tools,
		Backend: "file://" + t.TempDir(), Env: map[string]string{"KUBECONFIG": filepath.Join(env.Dir, "kubeconfig")},
		Progress: &progress}
	start := time.Now()
	res, err := deploy.Run(ctx, deploy.Up, opts)
	if err != nil {
		t.Fatalf("up: %v\n%s\n%s", err, progress.String(), clusterState(ctx))
	}
	t.Logf("fusebox up took %s: %v", time.Since(start).Round(time.Second), res.Changes)
	managerNS, _ := res.Outputs["namespaces"].(map[string]any)["manager"].(string)
	sandboxNS, _ := res.Outputs["namespaces"].(map[string]any)["sandbox"].(string)
	if managerNS == "" || sandboxNS == "" {
		t.Fatalf("outputs %v", res.Outputs)
	}
	defer func() {
		if t.Failed() {
			t.Log(clusterState(context.Background()))
		}
	}()

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

	// The agent: a ServiceAccount token for the manager's audience, the CA the manager
	// publishes, the manager's Service.
	dir := t.TempDir()
	tokenFile, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	writeFile(t, tokenFile, token(ctx, t, manager.DefaultTokenAudience))
	cm, err := env.Client.CoreV1().ConfigMaps(managerNS).Get(ctx, manager.CAConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the manager's CA: %v", err)
	}
	writeFile(t, caFile, cm.Data["ca.crt"])
	svc, err := env.Client.CoreV1().Services(managerNS).Get(ctx, "fusebox-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("tcp://%s:%d", svc.Spec.ClusterIP, manager.DefaultGRPCPort)
	agent := client.AllocateOptions{TokenFile: tokenFile, CAFile: caFile,
		ServerName: fmt.Sprintf("fusebox-manager.%s.svc", managerNS)}
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
	_, err = client.Allocate(ctx, addr, client.AllocateOptions{CAFile: caFile, ServerName: agent.ServerName, TokenFile: filepath.Join(dir, "none")})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "none")) {
		t.Fatalf("an agent without a token: %v, want an error naming the missing token file", err)
	}
	noToken := agent
	noToken.TokenFile = filepath.Join(dir, "empty")
	writeFile(t, noToken.TokenFile, "")
	_, err = client.Allocate(ctx, addr, noToken)
	refused(t, "an empty token", err, codes.Unauthenticated, "")
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
	mgrPods, err := env.Client.CoreV1().Pods(managerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=fusebox-manager"})
	if err != nil || len(mgrPods.Items) == 0 {
		t.Fatalf("manager pods: %v", err)
	}
	targets := []string{fmt.Sprintf("%s:%d", mgrPods.Items[0].Status.PodIP, manager.DefaultGRPCPort),
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
	if err := a.Close(); err != nil {
		t.Fatalf("releasing the sandbox: %v", err)
	}

	// destroy removes everything up made (the manager's own sandbox pods and policies go with
	// its namespaces), and nothing else is left.
	progress.Reset()
	if _, err := deploy.Run(ctx, deploy.Destroy, opts); err != nil {
		t.Fatalf("destroy: %v\n%s", err, progress.String())
	}
	for _, ns := range []string{sandboxNS, managerNS} {
		if _, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s after destroy: %v", ns, err)
		}
	}
	after, err := env.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, k := range kubetest.Diff(after, before) {
		// The cluster's own records of the node and of leader elections are not the stack's.
		if !strings.HasPrefix(k, "leases.coordination.k8s.io/kube-node-lease/") {
			left = append(left, k)
		}
	}
	if len(left) > 0 {
		t.Errorf("destroy left behind %d objects:\n%s", len(left), strings.Join(left, "\n"))
	}
}

// stackFile is stacks/Pulumi.local.yaml with release written in as `fusebox release` writes
// it, the sandboxes sized for this 2-CPU node, and this host as an agent (dataClientCIDRs).
func stackFile(t *testing.T, release infra.ReleaseImages) []byte {
	t.Helper()
	local := string(readFile(t, filepath.Join(repoRoot(), "stacks", "Pulumi.local.yaml")))
	for _, r := range [][2]string{
		{"    sandboxCPU: 500m\n", "    sandboxCPU: 100m\n"},
		{"    dataClientNamespaces: [default]", "    dataClientNamespaces: [default]\n    dataClientCIDRs: [" + nodetest.NodeIP + "/32]"},
	} {
		if !strings.Contains(local, r[0]) {
			t.Fatalf("stacks/Pulumi.local.yaml has no %q to change", r[0])
		}
		local = strings.Replace(local, r[0], r[1], 1)
	}
	out, _, err := infra.ReleaseStackFile([]byte(local), "stacks/Pulumi.local.yaml", registry, release)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// token is a token of ServiceAccount default/agent for audience aud, from TokenRequest (what
// the kubelet projects into an agent pod).
func token(ctx context.Context, t *testing.T, aud string) string {
	t.Helper()
	tr, err := node.Env.Client.CoreV1().ServiceAccounts("default").CreateToken(ctx, "agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// readySandboxPods lists the Ready pods of namespace ns.
func readySandboxPods(ctx context.Context, t *testing.T, ns string) []corev1.Pod {
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
	s, _ := status.FromError(errors.Unwrap(err))
	if s == nil || s.Code() != code {
		s, _ = status.FromError(err)
	}
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

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
