// Command fusebox-bench measures fusebox against real gVisor sandboxes and prints its figures
// (as JSON with --json): fusebox-bench dataplane, allocate, manager, cpu-limits, sdk, unpack and
// templates; make bench runs the first four. It is the only binary that links the benchmark harness (test/bench); the product
// binaries (fusebox, fusebox-manager, fusebox-sandbox) link none of it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "fusebox-bench",
		Short:         "Measure fusebox against real gVisor sandboxes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(benchDataplaneCmd(), benchAllocateCmd(), benchManagerCmd(), benchCPULimitsCmd(), benchSDKCmd(), benchUnpackCmd(), benchTemplatesCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fusebox-bench:", err)
		os.Exit(1)
	}
}
