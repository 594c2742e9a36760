package main

import (
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/manager/daemon"
	"github.com/fusebox-dev/fusebox/manager/kubealloc"
)

func managerCmd() *cobra.Command {
	c := daemon.Config{}
	var verbose bool
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the manager as a service (in a cluster with --allocator kube)",
		Long: `Runs the fusebox manager as a long-lived service. With --allocator kube (the default) it
keeps a warm pool of gVisor sandbox pods in --sandbox-namespace, shared by every replica:
each replica serves Allocate, Renew and Release, and the replica holding the leader-election
Lease sizes the pool and expires leases. It refuses to start when the sandbox namespace lacks
the default-deny CiliumNetworkPolicy.`,
		Example: `  fusebox manager --sandbox-namespace fusebox-sandboxes --manager-namespace fusebox \
    --sandbox-image registry.example.com/fusebox/sandbox@sha256:... \
    --agent-selector app=agent --manager-selector app.kubernetes.io/name=fusebox-manager`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lvl := slog.LevelInfo
			if verbose {
				lvl = slog.LevelDebug
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			c.Ready = func(addr string) { log.Info("ready", "listen", addr) }
			return daemon.Run(cmd.Context(), c, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Listen, "listen", "tcp://0.0.0.0:9090", "where the manager API listens")
	f.StringVar(&c.MetricsListen, "metrics-listen", "0.0.0.0:9464", "host:port serving Prometheus /metrics (empty: off)")
	f.StringVar(&c.Allocator, "allocator", "kube", "kube, runsc, or process (needs --insecure-process-runtime)")
	f.BoolVar(&c.Insecure, "insecure-process-runtime", false, "allow the process allocator (no isolation)")
	f.StringVar(&c.StateDir, "state-dir", "/var/lib/fusebox", "state directory (lock file; runsc and process allocators)")
	f.StringVar(&c.Runsc, "runsc", envOr("FUSEBOX_RUNSC", defaultRunsc), "path of the pinned runsc (runsc allocator)")
	f.StringVar(&c.SandboxBinary, "sandbox-binary", siblingBinary("fusebox-sandbox"), "fusebox-sandbox (runsc and process allocators)")
	f.StringVar(&c.Estimator, "estimator", "ewma", "pool sizing: fixed, ewma or pid")
	f.IntVar(&c.PoolSize, "pool-size", 2, "ready sandboxes to keep (the floor for ewma and pid)")
	f.IntVar(&c.PoolMax, "pool-max", 32, "most ready sandboxes ewma and pid may ask for")
	f.DurationVar(&c.LeaseTTL, "lease-ttl", 10*time.Minute, "default lease length")
	f.DurationVar(&c.MaxLeaseTTL, "max-lease-ttl", 24*time.Hour, "longest lease")
	f.DurationVar(&c.PoolPing, "pool-ping", DefaultPoolPing, "how often the next sandbox to hand out is checked for liveness; a dead one is replaced (0: never; runsc and process allocators)")
	f.BoolVar(&c.KeepSandboxesAwake, "keep-sandboxes-awake", false, keepAwakeHelp+" (runsc allocator)")
	f.StringVar(&c.Kube.Kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster configuration)")
	f.StringVar(&c.Kube.SandboxNamespace, "sandbox-namespace", "fusebox-sandboxes", "namespace of the sandbox pods")
	f.StringVar(&c.Kube.ManagerNamespace, "manager-namespace", "fusebox", "namespace of the leader-election Lease")
	f.StringVar(&c.Kube.Identity, "identity", os.Getenv("POD_NAME"), "this replica's name (default $POD_NAME)")
	f.StringVar(&c.Kube.SandboxImage, "sandbox-image", "", "sandbox image, repository@sha256:... (optional with --sandbox-template; must then match it)")
	f.StringVar(&c.Kube.SandboxTemplate, "sandbox-template", "", "sandbox pod template (YAML v1 Pod, as the manager component mounts it): image, resources, placement, labels; security settings are enforced")
	f.StringToStringVar(&c.Kube.AgentSelector, "agent-selector", nil, "labels of the pods that may reach sandboxes' data port")
	f.StringToStringVar(&c.Kube.ManagerSelector, "manager-selector", nil, "labels of the manager pods (the only ones that may reach the init port)")
	f.BoolVar(&c.Kube.LeaderElect, "leader-elect", true, "elect one replica to size the pool and expire leases")
	f.Float32Var(&c.Kube.QPS, "kube-api-qps", kubealloc.DefaultQPS, "API requests per second this replica may make (client-go's default of 5 would throttle allocations)")
	f.IntVar(&c.Kube.Burst, "kube-api-burst", kubealloc.DefaultBurst, "API requests this replica may make in a burst")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}
