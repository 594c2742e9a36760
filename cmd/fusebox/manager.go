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
the default-deny CiliumNetworkPolicy.

A tcp:// --listen serves TLS only (--tls-secret, or --tls-cert-file and --tls-key-file) and
authenticates agents by projected ServiceAccount tokens with --token-audience, checked by
TokenReview; --auth-policy says which ServiceAccounts or namespaces may allocate, which
templates they may use and their egress ceiling. A plaintext caller is told to use TLS.`,
		Example: `  fusebox manager --sandbox-namespace fusebox-sandboxes --manager-namespace fusebox \
    --sandbox-image registry.example.com/fusebox/sandbox@sha256:... \
    --agent-selector app=agent --manager-selector app.kubernetes.io/name=fusebox-manager \
    --tls-secret fusebox-manager-tls --tls-secret-create --tls-dns-names fusebox-manager.fusebox.svc \
    --ca-configmap fusebox-manager-ca --token-audience fusebox-manager --auth-policy /etc/fusebox/policy/policy.yaml`,
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
	f.StringToStringVar(&c.Kube.AgentSelector, "agent-selector", nil, "labels of the pods that may reach sandboxes' data port")
	f.StringToStringVar(&c.Kube.ManagerSelector, "manager-selector", nil, "labels of the manager pods (the only ones that may reach the init port)")
	f.BoolVar(&c.Kube.LeaderElect, "leader-elect", true, "elect one replica to size the pool and expire leases")
	f.Float32Var(&c.Kube.QPS, "kube-api-qps", kubealloc.DefaultQPS, "API requests per second this replica may make (client-go's default of 5 would throttle allocations)")
	f.IntVar(&c.Kube.Burst, "kube-api-burst", kubealloc.DefaultBurst, "API requests this replica may make in a burst")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}
