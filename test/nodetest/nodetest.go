// Package nodetest runs a real single-node Kubernetes cluster on this machine for integration
// tests: the control plane of test/kubetest (etcd, kube-apiserver, kube-controller-manager,
// without kwok) plus a real node: containerd v2 with the gVisor shim on the pinned runsc, a
// kubelet, bridge CNI on a bridge the test creates and kube-router enforcing NetworkPolicy,
// or (Options.Cilium) Cilium's agent as the pod network and policy agent instead. Pods run
// under gVisor and get addresses on that bridge (or from PodCIDR, routed by the host), which
// the test host reaches directly; nothing is routed off the machine, pods get an empty
// resolv.conf (or Options.ClusterDNS), and the API server reaches the kubelet by its
// InternalIP only (never a DNS lookup).
//
// The node's binaries come from $FUSEBOX_NODE_BIN (make node-bins), runsc from
// $FUSEBOX_RUNSC, the control plane's from $FUSEBOX_K8S_BIN, Cilium's from
// $FUSEBOX_CILIUM_BIN (make cilium). One node runs on a machine at a time (it owns a bridge,
// a cgroup and the kubelet's ports): Start takes a lock.
package nodetest

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/kubetest"
)

//go:embed node.sh
var nodeScript []byte

// DefaultBinDir is where make node-bins puts the node's binaries.
const DefaultBinDir = "/var/cache/fusebox/node-containerd-v2.4.2-k8s-v1.37.2"

// The node: its name, the pods' bridge and the node's address on it.
const (
	NodeName = "fusebox-node"
	Bridge   = "fbnode0"
	// Net is the pods' /24: the node is Net.1, pods get Net.10 to Net.250.
	Net    = "10.213.0"
	NodeIP = Net + ".1"
	// PauseImage is the pod sandbox image containerd is configured with; Start imports it.
	PauseImage = "localhost/fusebox-test/pause:v1"
)

// ErrNoBinaries means a binary the node needs is missing.
var ErrNoBinaries = errors.New("real-node binaries missing: run make node-bins (and make runsc)")

// BinDir returns $FUSEBOX_NODE_BIN or DefaultBinDir.
func BinDir() string {
	if d := os.Getenv("FUSEBOX_NODE_BIN"); d != "" {
		return d
	}
	return DefaultBinDir
}

// Node is a running single-node cluster.
type Node struct {
	// Env is the control plane (admin clients, the kubeconfig in Env.Dir).
	Env *kubetest.Env
	// Dir holds the node's state: configs, logs (Dir/logs), containerd's and the kubelet's.
	Dir         string
	bin         string
	runsc       string
	script      string
	lock        *os.File
	deployments bool
	forwarder   net.Listener
	cilium      string // Cilium's directory under Options.Cilium
	clusterDNS  string
}

// Options change what Start runs.
type Options struct {
	// Images are image archives (docker or OCI tarballs, see WriteImage) imported into the
	// node's containerd before the kubelet starts.
	Images []string
	// Controllers is kube-controller-manager's --controllers (default: namespace and
	// garbage collector only).
	Controllers string
	// Scheduler runs kube-scheduler too (pods that set no nodeName need it).
	Scheduler bool
	// Deployments makes the cluster run what a deployment (fusebox up) needs, beside the
	// scheduler: the deployment, replica-set, endpoint-slice, service-account and root-CA
	// controllers; ServiceAccount token volumes; kube-proxy, with the API server reachable
	// from pods at the kubernetes Service (through a forwarder on NodeIP:APIServerPort); and
	// the node only labelled as the sandbox pool, not tainted, so that the manager's pods
	// schedule onto it too. Controllers is ignored.
	Deployments bool
	// Cilium runs Cilium's agent (from CiliumBinDir) as the pod network and NetworkPolicy
	// agent in place of bridge CNI and kube-router: pods get addresses from PodCIDR on veths
	// of their own, the bridge stays as the network outside them, and CiliumNetworkPolicy
	// (with toFQDNs through the agent's DNS proxy) is enforced.
	Cilium bool
	// ClusterDNS, when set, is the nameserver the kubelet hands pods (dnsPolicy ClusterFirst,
	// domain cluster.local), e.g. a DNS server the test runs on the bridge.
	ClusterDNS string
}

// The Service range of the control plane (test/kubetest/control-plane.sh) and the node's
// port that forwards to the API server (Options.Deployments).
const (
	ServiceCIDR   = "10.0.0.0/24"
	APIServerPort = 6443
)

// deploymentControllers are kube-controller-manager's controllers for Options.Deployments.
// endpoints-controller keeps the v1 Endpoints that Pulumi's wait for a Service reads (it waits
// for Endpoints that target a pod, not for EndpointSlices).
const deploymentControllers = "namespace-controller,garbage-collector-controller,serviceaccount-controller," +
	"root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,endpointslice-controller," +
	"endpoints-controller"

// Start brings the cluster up: the control plane, containerd (and the images), the kubelet
// (until the node is Ready, labelled and tainted as the sandbox pool: fusebox.dev/pool=sandbox,
// fusebox.dev/sandbox=true:NoSchedule), a RuntimeClass gvisor (handler runsc) and
// kube-router (until its chains exist) or Cilium's agent (until it reports healthy).
func Start(ctx context.Context, o Options) (_ *Node, err error) {
	n := &Node{bin: BinDir(), runsc: os.Getenv("FUSEBOX_RUNSC"), clusterDNS: o.ClusterDNS}
	if o.Deployments {
		o.Scheduler, o.Controllers = true, deploymentControllers
	}
	n.deployments = o.Deployments
	need := []string{"containerd", "ctr", "containerd-shim-runsc-v1", "kubelet", "cni/loopback"}
	if o.Cilium {
		n.cilium = CiliumBinDir()
		if err := checkCilium(n.cilium); err != nil {
			return nil, err
		}
	} else {
		need = append(need, "kube-router", "cni/bridge", "cni/host-local")
	}
	if o.Scheduler {
		need = append(need, "kube-scheduler")
	}
	if o.Deployments {
		need = append(need, "kube-proxy")
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(n.bin, b)); err != nil {
			return nil, fmt.Errorf("%w (%v)", ErrNoBinaries, err)
		}
	}
	if n.runsc == "" {
		return nil, fmt.Errorf("%w (FUSEBOX_RUNSC is not set)", ErrNoBinaries)
	}
	if _, err := os.Stat(n.runsc); err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNoBinaries, err)
	}
	if !o.Cilium { // checkCilium checks what the agent runs
		for _, t := range []string{"iptables", "ipset"} {
			if _, err := exec.LookPath(t); err != nil {
				return nil, fmt.Errorf("kube-router needs %s: apt-get install iptables ipset (%w)", t, err)
			}
		}
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("a real node needs root")
	}
	if n.lock, err = lockMachine(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	ko := kubetest.Options{NoKwok: true, Controllers: o.Controllers, ServiceAccounts: o.Deployments}
	if o.Scheduler {
		ko.Scheduler = filepath.Join(n.bin, "kube-scheduler")
	}
	if n.Env, err = kubetest.StartWith(ctx, ko); err != nil {
		return nil, err
	}
	if n.Dir, err = os.MkdirTemp("", "nodetest-"); err != nil {
		return nil, err
	}
	n.script = filepath.Join(n.Dir, "node.sh")
	if err := os.WriteFile(n.script, nodeScript, 0o755); err != nil {
		return nil, err
	}
	if err := n.run(ctx, "start-runtime"); err != nil {
		return nil, err
	}
	if err := n.waitFor(ctx, "containerd", time.Minute, func() bool {
		return exec.CommandContext(ctx, n.ctr(), "-a", n.sock(), "version").Run() == nil
	}); err != nil {
		return nil, err
	}
	pause := filepath.Join(n.Dir, "pause.tar")
	if err := writePause(ctx, pause); err != nil {
		return nil, err
	}
	for _, img := range append([]string{pause}, o.Images...) {
		if err := n.Import(ctx, img); err != nil {
			return nil, err
		}
	}
	if err := n.run(ctx, "start-kubelet"); err != nil {
		return nil, err
	}
	if err := n.waitFor(ctx, "the kubelet's node to be Ready", 2*time.Minute, n.nodeReady(ctx)); err != nil {
		return nil, err
	}
	var spec []string
	if !o.Deployments {
		spec = append(spec, `"taints":[{"key":"fusebox.dev/sandbox","value":"true","effect":"NoSchedule"}]`)
	}
	if o.Cilium { // the agent's IPAM takes the Node's podCIDR (--ipam=kubernetes)
		spec = append(spec, fmt.Sprintf(`"podCIDR":%q,"podCIDRs":[%q]`, PodCIDR, PodCIDR))
	}
	patch := []byte(`{"metadata":{"labels":{"fusebox.dev/pool":"sandbox"}},"spec":{` + strings.Join(spec, ",") + `}}`)
	if _, err := n.Env.Client.CoreV1().Nodes().Patch(ctx, NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("labelling node %s: %w", NodeName, err)
	}
	if o.Cilium {
		if err := n.startCilium(ctx); err != nil {
			return nil, err
		}
	} else {
		if err := n.run(ctx, "start-kube-router"); err != nil {
			return nil, err
		}
		if err := n.waitFor(ctx, "kube-router's chains", time.Minute, func() bool {
			return exec.CommandContext(ctx, "iptables", "-S", "KUBE-ROUTER-FORWARD").Run() == nil
		}); err != nil {
			return nil, err
		}
	}
	if o.Deployments {
		if err := n.startServices(ctx); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Import imports an image archive into the node's containerd (the CRI's namespace).
func (n *Node) Import(ctx context.Context, archive string) error {
	return n.ctrRun(ctx, "images", "import", archive)
}

// ctrRun runs ctr against the node's containerd, in the CRI's namespace.
func (n *Node) ctrRun(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, n.ctr(), append([]string{"-a", n.sock(), "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Logs returns the tail of each of the node's logs (containerd, kubelet, kube-router or
// cilium-agent), for a failing test's output.
func (n *Node) Logs() string {
	var b strings.Builder
	agent := "kube-router"
	if n.cilium != "" {
		agent = "cilium-agent"
	}
	for _, l := range []string{"containerd", "kubelet", agent} {
		data, _ := os.ReadFile(filepath.Join(n.Dir, "logs", l+".log"))
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(&b, "--- last lines of %s.log:\n%s\n", l, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return b.String()
}

// Stop deletes every pod (so the kubelet tears their sandboxes down), stops the node and the
// control plane, restores what the kubelet changed on the host and removes Dir (kept with
// KUBETEST_KEEP=1).
func (n *Node) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	if n.Env != nil && n.Dir != "" {
		n.deleteAllPods(ctx)
	}
	if n.forwarder != nil {
		n.forwarder.Close()
	}
	if n.Dir != "" {
		if err := n.run(ctx, "stop"); err != nil {
			errs = append(errs, err)
		}
	}
	if n.Env != nil {
		if err := n.Env.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.Dir != "" && os.Getenv("KUBETEST_KEEP") != "1" {
		errs = append(errs, os.RemoveAll(n.Dir))
	}
	if n.lock != nil {
		n.lock.Close()
	}
	return errors.Join(errs...)
}

// StopAtExit stops n, if a node was started, after a test binary's tests ended with code
// (from TestMain's m.Run), and returns the code to exit with: 1 when stopping failed.
func StopAtExit(n *Node, code int) int {
	if n == nil {
		return code
	}
	if err := n.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the node:", err)
		if code == 0 {
			return 1
		}
	}
	return code
}

// deleteAllPods deletes every pod and waits up to a minute for them to go.
func (n *Node) deleteAllPods(ctx context.Context) {
	pods := n.Env.Client.CoreV1().Pods("")
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	zero := int64(0)
	for _, p := range list.Items {
		n.Env.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	n.waitFor(ctx, "pods to be deleted", time.Minute, func() bool {
		l, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

func (n *Node) nodeReady(ctx context.Context) func() bool {
	return func() bool {
		node, err := n.Env.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	}
}

func (n *Node) ctr() string  { return filepath.Join(n.bin, "ctr") }
func (n *Node) sock() string { return filepath.Join(n.Dir, "containerd", "containerd.sock") }

// run runs a verb of node.sh.
func (n *Node) run(ctx context.Context, verb string) error {
	cmd := exec.CommandContext(ctx, "bash", n.script, verb, n.Dir)
	cmd.Env = append(os.Environ(), "NODE_BIN="+n.bin, "RUNSC="+n.runsc, "NODE_NAME="+NodeName,
		"BRIDGE="+Bridge, "NET="+Net)
	if n.Env != nil {
		cmd.Env = append(cmd.Env, "CP="+n.Env.Dir)
	}
	if n.deployments {
		cmd.Env = append(cmd.Env, "SERVICE_CIDR="+ServiceCIDR)
	}
	if n.cilium != "" {
		cmd.Env = append(cmd.Env, "POLICY=cilium", "CILIUM_BIN="+n.cilium, "POD_CIDR="+PodCIDR)
	}
	if n.clusterDNS != "" {
		cmd.Env = append(cmd.Env, "CLUSTER_DNS="+n.clusterDNS)
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("node.sh %s: %w\n%s", verb, err, buf.Bytes())
	}
	return nil
}

// waitFor polls ok every 100 ms for up to timeout (harness setup only), failing with the
// node's logs.
func (n *Node) waitFor(ctx context.Context, what string, timeout time.Duration, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !ok() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w\n%s", what, ctx.Err(), n.Logs())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// lockMachine takes the machine-wide node lock, waiting for another test's node to stop.
func lockMachine(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile("/run/fusebox-nodetest.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking /run/fusebox-nodetest.lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("another real node runs on this machine: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// WriteImage writes img as a docker image archive named ref, which Import takes.
func WriteImage(img v1.Image, ref, path string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(path, tag, img)
}

// PodLog returns what container of pod ns/name wrote (stdout and stderr, in order), read from
// the kubelet's log files on this node (CRI format: time, stream, tag, then the line).
func (n *Node) PodLog(ns, name, container string) string {
	files, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", ns+"_"+name+"_*", container, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
			if parts := strings.SplitN(l, " ", 4); len(parts) == 4 {
				b.WriteString(parts[3])
				if parts[2] == "F" {
					b.WriteByte('\n')
				}
			}
		}
	}
	return b.String()
}

// WriteSandboxImage writes the test sandbox image (package imagetest) with sandboxBinary as
// its server as a docker image archive named ref at path, which Options.Images takes.
func WriteSandboxImage(sandboxBinary, ref, path string) error {
	img, err := imagetest.Image(sandboxBinary, os.Stderr)
	if err != nil {
		return fmt.Errorf("making the sandbox image: %w", err)
	}
	return WriteImage(img, ref, path)
}

// KillContainer sends SIGKILL to the main process of a pod's container through the node's
// containerd (as a crash or the OOM killer would end it), given the container's ID as the
// pod's status reports it ("containerd://ID").
func (n *Node) KillContainer(ctx context.Context, containerID string) error {
	id, ok := strings.CutPrefix(containerID, "containerd://")
	if !ok || id == "" {
		return fmt.Errorf("container ID %q is not containerd's", containerID)
	}
	return n.ctrRun(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
}
