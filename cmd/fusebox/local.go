package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/cmd/internal/daemoncmd"
	"github.com/fusebox-dev/fusebox/manager/daemon"
)

// defaultManager is where `fusebox local up` listens and where run and status look first.
const defaultManager = daemoncmd.DefaultManager

// envOr returns the environment variable k, or def when it is unset or empty.
func envOr(k, def string) string { return daemoncmd.EnvOr(k, def) }

func localCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "local", Short: "Run fusebox on this machine with gVisor sandboxes"}
	cmd.AddCommand(localUpCmd())
	return cmd
}

func localUpCmd() *cobra.Command {
	c := daemon.Config{}
	var verbose bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the manager in the foreground with a warm pool of gVisor sandboxes",
		Long: `Runs the fusebox manager in the foreground: it keeps a warm pool of single-use gVisor
sandboxes (the pinned runsc), binds one to each agent that calls Allocate, and destroys it on
release or lease expiry. Sandboxes bound when the manager stops keep serving their agents and
are adopted by the next 'fusebox local up' on the same state directory. Needs root.`,
		Example: `  sudo fusebox local up --pool-size 4
  sudo fusebox local up --image bin/images/sandbox
  sudo fusebox local up --sandbox-memory 4Gi --sandbox-workspace 2Gi --sandbox-pids 2048 --sandbox-cpus 2
  sudo fusebox local up --estimator ewma --pool-size 2 --pool-max 32 --metrics-listen 127.0.0.1:9464`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lvl := slog.LevelInfo
			if verbose {
				lvl = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			if c.Allocator == "runsc" {
				if _, err := os.Stat(c.Runsc); err != nil {
					return fmt.Errorf("runsc not found at %s: build the pinned one with `make runsc` or pass --runsc", c.Runsc)
				}
			}
			if c.Image != "" && c.Allocator != "runsc" {
				return fmt.Errorf("--image is for the runsc allocator, not %s", c.Allocator)
			}
			if _, err := os.Stat(c.SandboxBinary); err != nil && c.Image == "" {
				return fmt.Errorf("fusebox-sandbox not found at %s: build it with `make build` or pass --sandbox-binary", c.SandboxBinary)
			}
			c.Ready = func(addr string) {
				fmt.Fprintf(os.Stderr, "\nfusebox manager listening on %s\n  try:   fusebox run -- uname -a\n  pool:  fusebox status\n\n", addr)
			}
			log.Debug("garbage collector", "gogc", daemon.TuneGC())
			return daemon.Run(cmd.Context(), c, log)
		},
	}
	f := cmd.Flags()
	daemoncmd.Flags(f, &c, daemoncmd.Local)
	f.StringVar(&c.Image, "image", "", "sandbox image as the sandboxes' root filesystem: an OCI image layout directory (fusebox image build writes bin/images/sandbox) or a registry reference HOST[:PORT]/PATH@sha256:DIGEST (or :TAG), unpacked once into --state-dir/rootfs; empty: a root assembled from this host")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}
