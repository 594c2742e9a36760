package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/manager/daemon"
)

// daemonDefaults are the defaults in which fusebox local up (a manager for this machine) and
// fusebox manager (a service, by default in a cluster) differ.
type daemonDefaults struct {
	listen, metricsListen, allocator, allocators, estimator string
	poolMax                                                 int
}

var (
	localDefaults = daemonDefaults{listen: defaultManager, allocator: "runsc", estimator: "fixed", poolMax: 16,
		allocators: "runsc (gVisor) or process (no isolation; needs --insecure-process-runtime)"}
	serviceDefaults = daemonDefaults{listen: "tcp://0.0.0.0:9090", metricsListen: "0.0.0.0:9464", allocator: "kube", estimator: "ewma", poolMax: 32,
		allocators: "kube, runsc (gVisor on this host), or process (no isolation; needs --insecure-process-runtime)"}
)

// daemonFlags registers on f the flags both daemon commands take, filling c.
func daemonFlags(f *pflag.FlagSet, c *daemon.Config, d daemonDefaults) {
	f.StringVar(&c.Listen, "listen", d.listen, "where the manager API listens (unix:///path or tcp://host:port)")
	f.StringVar(&c.MetricsListen, "metrics-listen", d.metricsListen, "host:port serving Prometheus /metrics (empty: off)")
	f.StringVar(&c.Allocator, "allocator", d.allocator, d.allocators)
	f.BoolVar(&c.Insecure, "insecure-process-runtime", false, "allow the process allocator, which runs generated code on this host without gVisor")
	f.StringVar(&c.StateDir, "state-dir", "/var/lib/fusebox", "state directory: the lock file; the runsc and process allocators' sandboxes, bundles and leases")
	f.StringVar(&c.Runsc, "runsc", envOr("FUSEBOX_RUNSC", defaultRunsc), "path of the pinned runsc (runsc allocator)")
	f.StringVar(&c.SandboxBinary, "sandbox-binary", siblingBinary("fusebox-sandbox"), "path of the static fusebox-sandbox (runsc and process allocators)")
	f.StringVar(&c.Estimator, "estimator", d.estimator, "pool sizing: fixed, ewma or pid")
	f.IntVar(&c.PoolSize, "pool-size", 2, "ready sandboxes to keep (the floor for ewma and pid)")
	f.IntVar(&c.PoolMax, "pool-max", d.poolMax, "most ready sandboxes ewma and pid may ask for")
	f.DurationVar(&c.LeaseTTL, "lease-ttl", 10*time.Minute, "default lease length")
	f.DurationVar(&c.MaxLeaseTTL, "max-lease-ttl", 24*time.Hour, "longest lease")
	f.DurationVar(&c.PoolPing, "pool-ping", DefaultPoolPing, "how often the next sandbox to hand out is checked for liveness; a dead one is replaced (0: never; runsc and process allocators)")
	f.BoolVar(&c.KeepSandboxesAwake, "keep-sandboxes-awake", defaultKeepAwake, keepAwakeHelp+" (runsc allocator)")
	daemon.AuthFlags(f, &c.Auth)
}
