// Package kubetest runs a real Kubernetes control plane for integration tests: etcd,
// kube-apiserver (loopback, free ports, RBAC, --endpoint-reconciler-type=none, no
// ServiceAccount admission), kube-controller-manager with only the namespace and
// garbage-collector controllers (so deleted namespaces finish terminating and owned objects
// follow their owners) and kwok with one fake node, started by control-plane.sh in a
// temporary directory, with the CRDs in crds/ installed and Established and a RuntimeClass
// gvisor (handler runsc).
//
// Binaries come from $FUSEBOX_K8S_BIN or /var/cache/fusebox/k8s-v1.37.2 (make k8s-bins).
// With FUSEBOX_SKIP_KUBE=1 and no binaries, Main skips the package's tests.
//
// kwok moves pods bound to the fake node to Running with invented IPs: never dial them.
package kubetest

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

//go:embed crds/*.yaml
var crds embed.FS

//go:embed control-plane.sh
var controlPlaneScript []byte

// DefaultBinDir is where make k8s-bins puts the binaries.
const DefaultBinDir = "/var/cache/fusebox/k8s-v1.37.2"

// NodeName is the kwok fake node; it carries fusebox.dev/pool=sandbox and the
// fusebox.dev/sandbox:NoSchedule taint, like the production sandbox node pool.
const NodeName = "kwok-node-0"

// Env is a running control plane.
type Env struct {
	// Config is an admin (system:masters) client config with generous client-side rate
	// limits; copy it (rest.CopyConfig) before changing it.
	Config  *rest.Config
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Dir holds the state: kubeconfig, logs, etcd data.
	Dir    string
	script string
	env    []string
	opts   Options
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// BinDir returns $FUSEBOX_K8S_BIN or DefaultBinDir.
func BinDir() string {
	if d := os.Getenv("FUSEBOX_K8S_BIN"); d != "" {
		return d
	}
	return DefaultBinDir
}

// ErrNoBinaries means the control plane's binaries are missing.
var ErrNoBinaries = errors.New("kubernetes test binaries missing: run make k8s-bins")

// Main starts the control plane, stores it in *env, runs m, stops everything and returns the
// exit code:
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env)) }
func Main(m *testing.M, env **Env) int {
	e, err := Start(context.Background())
	if errors.Is(err, ErrNoBinaries) && os.Getenv("FUSEBOX_SKIP_KUBE") == "1" {
		fmt.Fprintln(os.Stderr, "kubetest: skipping:", err)
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubetest:", err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "kubetest: stopping:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Options change what Start runs. The zero value is what Start runs.
type Options struct {
	// NoKwok leaves kwok and its fake node out (a real kubelet joins instead: test/nodetest).
	NoKwok bool
	// Controllers is kube-controller-manager's --controllers (default: the namespace and
	// garbage-collector controllers).
	Controllers string
	// Scheduler, if set, is a kube-scheduler binary to run too.
	Scheduler string
	// ServiceAccounts turns the ServiceAccount admission plugin on: pods get their
	// ServiceAccount's token volume (run the serviceaccount and
	// root-ca-certificate-publisher controllers too, for the default ServiceAccounts and the
	// kube-root-ca.crt ConfigMaps the volumes need).
	ServiceAccounts bool
}

// Start starts etcd, kube-apiserver and kwok, labels and taints the fake node, installs the
// CRDs, waits until they are Established and starts kube-controller-manager.
func Start(ctx context.Context) (*Env, error) { return StartWith(ctx, Options{}) }

// StartWith is Start with options.
func StartWith(ctx context.Context, o Options) (_ *Env, err error) {
	bin := BinDir()
	need := []string{"etcd", "kube-apiserver", "kube-controller-manager"}
	if !o.NoKwok {
		need = append(need, "kwok", "kwok-stages.yaml")
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%w (%s: %v)", ErrNoBinaries, bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return nil, err
	}
	// The script is embedded, so that binaries (fusebox-bench) can start a control plane too.
	script := filepath.Join(dir, "control-plane.sh")
	if err := os.WriteFile(script, controlPlaneScript, 0o755); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, script: script, opts: o}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	// A start that fails (a port taken after all, a process that died) is retried on fresh
	// ports; the failure is printed, so that a flaky machine shows in the test's output.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		out, err := e.start(ctx, bin)
		if err == nil {
			break
		}
		err = fmt.Errorf("starting the control plane: %w\n%s", err, out)
		if attempt == attempts || ctx.Err() != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "kubetest: attempt %d of %d: %v\n", attempt, attempts, err)
		if out, err := e.run(ctx, "stop"); err != nil {
			return nil, fmt.Errorf("stopping after a failed start: %w\n%s", err, out)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 5000, 10000
	e.Config = cfg
	if e.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if e.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if !o.NoKwok {
		if err := e.prepareNode(ctx); err != nil {
			return nil, err
		}
		if err := e.waitKwok(ctx); err != nil {
			return nil, err
		}
	}
	if err := e.installCRDs(ctx); err != nil {
		return nil, err
	}
	// Only now: the garbage collector discovers resource types at start and then every 30s,
	// and a custom resource deleted in the foreground waits for it.
	if out, err := e.run(ctx, "start-kcm"); err != nil {
		return nil, fmt.Errorf("starting kube-controller-manager: %w\n%s", err, out)
	}
	// The gVisor RuntimeClass a sandbox cluster has (kwok ignores the handler).
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}
	if _, err := e.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating RuntimeClass gvisor: %w", err)
	}
	return e, nil
}

// Stop stops kwok, kube-controller-manager and kube-apiserver, then etcd, and removes Dir (kept if KUBETEST_KEEP=1).
func (e *Env) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := e.run(ctx, "stop")
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	if os.Getenv("KUBETEST_KEEP") != "1" {
		return os.RemoveAll(e.Dir)
	}
	return nil
}

// start picks free ports and runs the script's start: etcd, kube-apiserver and kwok.
func (e *Env) start(ctx context.Context, bin string) ([]byte, error) {
	apiPort, err := freePort(1)
	if err != nil {
		return nil, err
	}
	etcdPort, err := freePort(2) // etcd uses the port and the next one (peer)
	if err != nil {
		return nil, err
	}
	kcmPort, err := freePort(1)
	if err != nil {
		return nil, err
	}
	kwok, sched, sa := "1", "0", "0"
	if e.opts.ServiceAccounts {
		sa = "1"
	}
	if e.opts.NoKwok {
		kwok = "0"
	}
	if e.opts.Scheduler != "" {
		sched = "1"
	}
	e.env = append(os.Environ(),
		"BIN="+bin, "PORT="+strconv.Itoa(apiPort), "ETCD_PORT="+strconv.Itoa(etcdPort),
		"KCM_PORT="+strconv.Itoa(kcmPort), "KWOK="+kwok, "SCHEDULER="+sched, "KCM=0",
		"SCHEDULER_BIN="+e.opts.Scheduler, "KCM_CONTROLLERS="+e.opts.Controllers, "SA_ADMISSION="+sa)
	return e.run(ctx, "start")
}

func (e *Env) run(ctx context.Context, verb string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "bash", e.script, verb, e.Dir)
	cmd.Env = e.env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.Bytes(), err
}

// prepareNode waits for the fake node and gives it the sandbox pool's label and taint.
func (e *Env) prepareNode(ctx context.Context) error {
	patch := []byte(`{"metadata":{"labels":{"fusebox.dev/pool":"sandbox"}},` +
		`"spec":{"taints":[{"key":"fusebox.dev/sandbox","value":"true","effect":"NoSchedule"}]}}`)
	return until(ctx, 30*time.Second, func() (bool, error) {
		_, err := e.Client.CoreV1().Nodes().Patch(ctx, NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// waitKwok waits until kwok has initialised the node and moves a canary pod to Running:
// pods created before kwok has taken the node over are otherwise ignored until their next
// change.
func (e *Env) waitKwok(ctx context.Context) error {
	err := until(ctx, 30*time.Second, func() (bool, error) {
		n, err := e.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kwok to make node %s Ready: %w", NodeName, err)
	}
	pods := e.Client.CoreV1().Pods("default")
	for attempt := 0; ; attempt++ {
		name := "kubetest-canary-" + strconv.Itoa(attempt)
		canary := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: NodeName, Containers: []corev1.Container{{Name: "c", Image: "canary"}}},
		}
		if _, err := pods.Create(ctx, canary, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the kwok canary pod: %w", err)
		}
		err := until(ctx, 5*time.Second, func() (bool, error) {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, err
		})
		zero := int64(0)
		pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err == nil {
			return nil
		}
		if attempt == 5 {
			return fmt.Errorf("kwok did not run the canary pod: %w", err)
		}
	}
}

func (e *Env) installCRDs(ctx context.Context) error {
	files, err := fs.Glob(crds, "crds/*.yaml")
	if err != nil {
		return err
	}
	// The vendored Cilium CRDs use the "idn-hostname" format, which the API server does not
	// know and warns about on every install.
	cfg := rest.CopyConfig(e.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		b, err := crds.ReadFile(f)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return fmt.Errorf("parsing %s: %w", f, err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating CRD from %s: %w", f, err)
		}
		names = append(names, u.GetName())
	}
	for _, n := range names {
		err := until(ctx, 30*time.Second, func() (bool, error) {
			u, err := e.Dynamic.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s to be Established: %w", n, err)
		}
	}
	return nil
}

// Namespace creates a namespace with a unique name for t. Namespaces are not deleted; the
// whole control plane goes at the end.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := "t-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.TrimRight(name, "-") + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	_, err := e.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	return name
}

// until calls f every 50ms until it reports done, fails, or timeout passes (harness setup
// only: the code under test never polls).
func until(ctx context.Context, timeout time.Duration, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		done, err := f()
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePort returns a loopback port p such that p..p+n-1 were free when checked. It picks
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no outgoing
// connection of another process can take the port between the check and the server's bind:
// on a busy CI machine one did, and etcd or the apiserver failed to start.
func freePort(n int) (int, error) {
	lo, hi := 20000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if first, err := strconv.Atoi(f[0]); err == nil && first > 2048 {
				hi = first
				lo = min(lo, hi/2)
			}
		}
	}
	for range 200 {
		p := lo + rand.IntN(hi-lo-n)
		ok := true
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no %d free loopback ports in %d-%d", n, lo, hi-1)
}
