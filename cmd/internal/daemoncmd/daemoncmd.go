// Package daemoncmd holds the command line of the manager daemon, shared by the binaries that
// run one: fusebox-manager (the service, in a cluster by default), fusebox local up (a manager
// for this machine) and the benchmarks, which take the same defaults. It links the manager
// daemon and cobra, nothing of the CLI's deployment code (Pulumi) or of the benchmarks.
package daemoncmd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
)

// DefaultManager is where `fusebox local up` listens and where fusebox run and status look first.
const DefaultManager = "unix:///run/fusebox/manager.sock"

// DefaultRunsc is where `make runsc` puts the pinned gVisor.
const DefaultRunsc = "/var/cache/fusebox/runsc-v0.0.0-20260905035102-160fafc42237/runsc"

// DefaultPoolPing is the --pool-ping default: how often the manager checks that the pool's
// next sandbox lives (more often makes allocations no faster; see manager.pingHead).
const DefaultPoolPing = time.Second

// DefaultKeepAwake is --keep-sandboxes-awake's default wherever the flag is (localsandbox.KeepAwakeGODEBUG).
const DefaultKeepAwake = true

// KeepAwakeHelp describes --keep-sandboxes-awake.
const KeepAwakeHelp = "keep each sandbox server's Go runtime monitor waking every 10 ms instead of deep-sleeping (=false to turn it off): faster warm allocations for a little idle CPU per sandbox (docs/performance.md)"

// Defaults are the defaults in which fusebox local up (a manager for this machine) and
// fusebox-manager (a service, by default in a cluster) differ.
type Defaults struct {
	listen, metricsListen, allocator, allocators, estimator string
	poolMax                                                 int
}

var (
	// Local are fusebox local up's defaults.
	Local = Defaults{listen: DefaultManager, allocator: "runsc", estimator: "fixed", poolMax: 16,
		allocators: "runsc (gVisor) or process (no isolation; needs --insecure-process-runtime)"}
	// Service are fusebox-manager's defaults.
	Service = Defaults{listen: "tcp://0.0.0.0:9090", metricsListen: "0.0.0.0:9464", allocator: "kube", estimator: "ewma", poolMax: 32,
		allocators: "kube, runsc (gVisor on this host), or process (no isolation; needs --insecure-process-runtime)"}
)

// Flags registers on f the flags every daemon command takes, filling c, with d's defaults.
func Flags(f *pflag.FlagSet, c *daemon.Config, d Defaults) {
	f.StringVar(&c.Listen, "listen", d.listen, "where the manager API listens (unix:///path or tcp://host:port)")
	f.StringVar(&c.MetricsListen, "metrics-listen", d.metricsListen, "host:port serving Prometheus /metrics (empty: off)")
	f.StringVar(&c.Allocator, "allocator", d.allocator, d.allocators)
	f.BoolVar(&c.Insecure, "insecure-process-runtime", false, "allow the process allocator, which runs generated code on this host without gVisor")
	f.StringVar(&c.StateDir, "state-dir", "/var/lib/fusebox", "state directory: the lock file; the runsc and process allocators' sandboxes, bundles and leases")
	f.StringVar(&c.Runsc, "runsc", EnvOr("FUSEBOX_RUNSC", DefaultRunsc), "path of the pinned runsc (runsc allocator)")
	f.StringVar(&c.SandboxBinary, "sandbox-binary", SiblingBinary("fusebox-sandbox"), "path of the static fusebox-sandbox (runsc and process allocators)")
	f.StringVar(&c.Estimator, "estimator", d.estimator, "pool sizing: fixed, ewma or pid")
	f.IntVar(&c.PoolSize, "pool-size", 2, "ready sandboxes to keep (the floor for ewma and pid)")
	f.IntVar(&c.PoolMax, "pool-max", d.poolMax, "most ready sandboxes ewma and pid may ask for")
	f.DurationVar(&c.LeaseTTL, "lease-ttl", 10*time.Minute, "default lease length")
	f.DurationVar(&c.MaxLeaseTTL, "max-lease-ttl", 24*time.Hour, "longest lease")
	f.DurationVar(&c.PoolPing, "pool-ping", DefaultPoolPing, "how often the next sandbox to hand out is checked for liveness; a dead one is replaced (0: never; runsc and process allocators)")
	f.BoolVar(&c.KeepSandboxesAwake, "keep-sandboxes-awake", DefaultKeepAwake, KeepAwakeHelp+" (runsc allocator)")
	LimitFlags(f, &c.Limits)
	f.Var(templatesFlag{&c.Templates}, "templates", "a templates file (YAML): sandbox templates besides the default, each with its own image (pinned by digest), limits, env, working directory, user and warm pool (runsc and kube allocators; see docs/templates.md)")
	daemon.AuthFlags(f, &c.Auth)
	fast := fastpath.All()
	c.FastPath = &fast
	f.Var(fastFlag{&fast}, "fast-path", fastpath.FlagHelp+"; none is part of the trust path (runsc allocator: keep-awake also needs --keep-sandboxes-awake; kube allocator: none)")
}

// templatesFlag reads and validates a templates file when the flag is set.
type templatesFlag struct{ specs *[]templates.Spec }

func (f templatesFlag) String() string { return "" }

func (f templatesFlag) Set(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	specs, err := templates.Parse(b)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	*f.specs = specs
	return nil
}

func (templatesFlag) Type() string { return "file" }

// LimitFlags registers the sandbox limit flags (runsc allocator) on f, filling l with
// runscalloc.DefaultLimits as the defaults. A malformed value is refused by the flag's own
// parser, naming the flag; a value out of bounds by runscalloc.Limits.Template when the
// manager starts, naming it too.
func LimitFlags(f *pflag.FlagSet, l *runscalloc.Limits) {
	d := runscalloc.DefaultLimits
	*l = d
	f.Float64Var(&l.CPUs, "sandbox-cpus", d.CPUs, "each sandbox's CPU weight in cores (cpu.shares = 1024 x this): not a cap, a sandbox uses any idle CPU and gets this share when all are busy (runsc allocator)")
	f.Float64Var(&l.CPUQuota, "sandbox-cpu-quota", d.CPUQuota, "hard CPU cap per sandbox in cores, a CFS quota (0: none; a quota throttles short commands' tail latency: docs/performance.md) (runsc allocator)")
	f.Var((*bytesValue)(&l.MemoryBytes), "sandbox-memory", "each sandbox's memory limit (e.g. 1Gi, 768Mi): gVisor's kernel, the commands, /workspace and /tmp count in it; reaching it kills the sandbox (runsc allocator)")
	f.Int64Var(&l.Processes, "sandbox-pids", d.Processes, "tasks (processes and threads) the commands of a sandbox may have at once; a fork beyond fails with EAGAIN inside (runsc allocator)")
	f.Var((*bytesValue)(&l.WorkspaceBytes), "sandbox-workspace", "size of each sandbox's /workspace, in its memory (e.g. 512Mi); a write beyond fails with ENOSPC inside (runsc allocator)")
}

// bytesValue is a pflag.Value of a byte count written as a Kubernetes quantity (1Gi, 512Mi,
// 1G, 1048576).
type bytesValue int64

func (b *bytesValue) String() string {
	return resource.NewQuantity(int64(*b), resource.BinarySI).String()
}

func (b *bytesValue) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("want a size such as 1Gi or 512Mi: %w", err)
	}
	v, ok := q.AsInt64()
	if !ok || v <= 0 {
		return fmt.Errorf("want a positive whole number of bytes such as 1Gi or 512Mi, not %s", s)
	}
	*b = bytesValue(v)
	return nil
}

func (b *bytesValue) Type() string { return "bytes" }

// fastFlag is --fast-path, a fastpath.Switches as a pflag.Value.
type fastFlag struct{ *fastpath.Switches }

func (fastFlag) Type() string { return "accelerators" }

// ServiceCommand returns the command that runs the manager as a service, named use:
// fusebox-manager's root command, and fusebox manager in the CLI.
func ServiceCommand(use string) *cobra.Command {
	c := daemon.Config{}
	var verbose bool
	cmd := &cobra.Command{
		Use:   use,
		Short: "Run the manager as a service (in a cluster with --allocator kube)",
		Long: `Runs the fusebox manager as a long-lived service. With --allocator kube (the default) it
keeps a warm pool of gVisor sandbox pods in --sandbox-namespace, shared by every replica:
each replica serves Allocate, Renew and Release, and the replica holding the leader-election
Lease sizes the pool and expires leases. It refuses to start when the sandbox namespace lacks
the default-deny policy of its --network-policy flavour (fusebox-sandbox-default-deny: a
CiliumNetworkPolicy with cilium, a NetworkPolicy with gke and kubernetes). With kubernetes,
egress allowlists take IP addresses only: an allocation naming a host is refused. It logs
JSON to standard error.

A tcp:// --listen serves TLS only (--tls-secret, or --tls-cert-file and --tls-key-file) and
authenticates agents by projected ServiceAccount tokens with --token-audience, checked by
TokenReview; --auth-policy says which ServiceAccounts or namespaces may allocate, which
templates they may use and their egress ceiling. A plaintext caller is told to use TLS.`,
		Example: `  ` + use + ` --sandbox-namespace fusebox-sandboxes --manager-namespace fusebox \
    --sandbox-image registry.example.com/fusebox/sandbox@sha256:... \
    --agent-namespaces agents --agent-selector fusebox.dev/agent=true \
    --manager-selector app.kubernetes.io/name=fusebox-manager --network-policy cilium \
    --tls-secret fusebox-manager-tls --tls-secret-create --tls-dns-names fusebox-manager.fusebox.svc \
    --ca-configmap fusebox-manager-ca --token-audience fusebox-manager --auth-policy /etc/fusebox/policy/policy.yaml`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lvl := slog.LevelInfo
			if verbose {
				lvl = slog.LevelDebug
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			c.Ready = func(addr string) { log.Info("ready", "listen", addr) }
			log.Debug("garbage collector", "gogc", daemon.TuneGC())
			return daemon.Run(cmd.Context(), c, log)
		},
	}
	f := cmd.Flags()
	Flags(f, &c, Service)
	f.StringVar(&c.Kube.Kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster configuration)")
	f.StringVar(&c.Kube.SandboxNamespace, "sandbox-namespace", "fusebox-sandboxes", "namespace of the sandbox pods")
	f.StringVar(&c.Kube.ManagerNamespace, "manager-namespace", "fusebox", "namespace of the leader-election Lease")
	f.StringVar(&c.Kube.Identity, "identity", os.Getenv("POD_NAME"), "this replica's name (default $POD_NAME)")
	f.StringVar(&c.Kube.SandboxImage, "sandbox-image", "", "sandbox image, repository@sha256:... (optional with --sandbox-template; must then match it)")
	f.StringVar(&c.Kube.SandboxTemplate, "sandbox-template", "", "sandbox pod template (YAML v1 Pod, as the manager component mounts it): image, resources, placement, labels; security settings are enforced")
	f.StringToStringVar(&c.Kube.AgentSelector, "agent-selector", nil, "labels of the agents' pods in --agent-namespaces (default: every pod there)")
	f.StringToStringVar(&c.Kube.ManagerSelector, "manager-selector", nil, "labels of the manager pods (the only ones that may reach the init port)")
	f.StringSliceVar(&c.Kube.AgentNamespaces, "agent-namespaces", nil, "namespaces of the agents' pods (with --agent-selector's labels) that may reach a bound sandbox's data port")
	f.StringSliceVar(&c.Kube.AgentCIDRs, "agent-cidrs", nil, "CIDRs outside the cluster that may reach a bound sandbox's data port")
	f.StringVar(&c.Kube.NetworkPolicy, "network-policy", "cilium", "network policy flavour of the cluster: cilium, gke (NetworkPolicy + FQDNNetworkPolicy) or kubernetes (NetworkPolicy; allowlists take IP addresses only)")
	f.StringVar(&c.Kube.ClusterDNS, "cluster-dns", "kube-dns", "where the cluster's pods send DNS queries, which a sandbox allowed names may reach on port 53: kube-dns, nodelocaldns (NodeLocal DNSCache), gke-clouddns (GKE Cloud DNS) or aks-localdns (AKS LocalDNS)")
	f.StringSliceVar(&c.Kube.ImagePullSecrets, "image-pull-secrets", nil, "Secrets in the sandbox namespace for pulling the sandbox image")
	f.StringVar(&c.Kube.Deployment, "deployment", "", "the manager's own Deployment in --manager-namespace: once it is being deleted, remove every sandbox pod, then its finalizer "+kubealloc.RemovalFinalizer)
	f.BoolVar(&c.Kube.LeaderElect, "leader-elect", true, "elect one replica to size the pool and expire leases")
	f.BoolVar(&c.Kube.SeparateClaim, "separate-claim", false, "claim each sandbox pod with an API write of its own before binding it (default: the lease's write claims it, one write fewer per allocation)")
	f.Float32Var(&c.Kube.QPS, "kube-api-qps", kubealloc.DefaultQPS, "API requests per second this replica may make (client-go's default of 5 would throttle allocations)")
	f.IntVar(&c.Kube.Burst, "kube-api-burst", kubealloc.DefaultBurst, "API requests this replica may make in a burst")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}

// SiblingBinary returns the path of name next to the running binary (bin/ after make build).
func SiblingBinary(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return name
	}
	return filepath.Join(filepath.Dir(exe), name)
}

// EnvOr returns the environment variable k, or def when it is unset or empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
