package main

import (
	"log/slog"
	"os"

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
the default-deny policy of its --network-policy flavour (fusebox-sandbox-default-deny: a
CiliumNetworkPolicy with cilium, a NetworkPolicy with gke and kubernetes). With kubernetes,
egress allowlists take IP addresses only: an allocation naming a host is refused.`,
		Example: `  fusebox manager --sandbox-namespace fusebox-sandboxes --manager-namespace fusebox \
    --sandbox-image registry.example.com/fusebox/sandbox@sha256:... \
    --agent-namespaces agents --agent-selector fusebox.dev/agent=true \
    --manager-selector app.kubernetes.io/name=fusebox-manager --network-policy cilium`,
		Args: cobra.NoArgs,
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
	daemonFlags(f, &c, serviceDefaults)
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
	f.StringSliceVar(&c.Kube.ImagePullSecrets, "image-pull-secrets", nil, "Secrets in the sandbox namespace for pulling the sandbox image")
	f.BoolVar(&c.Kube.LeaderElect, "leader-elect", true, "elect one replica to size the pool and expire leases")
	f.Float32Var(&c.Kube.QPS, "kube-api-qps", kubealloc.DefaultQPS, "API requests per second this replica may make (client-go's default of 5 would throttle allocations)")
	f.IntVar(&c.Kube.Burst, "kube-api-burst", kubealloc.DefaultBurst, "API requests this replica may make in a burst")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}
