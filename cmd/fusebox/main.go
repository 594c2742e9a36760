// Command fusebox is the fusebox command-line interface.
package main

import (
	"context"
	"errors"
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
		Use:           "fusebox",
		Short:         "Run AI agents' generated code in single-use gVisor sandboxes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(benchCmd(), localCmd(), runCmd(), statusCmd(), managerCmd())
	root.AddCommand(deployCmds()...)
	root.AddCommand(promoteCmd())
	root.AddCommand(imageCmd(), releaseCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "fusebox:", err)
		os.Exit(1)
	}
}
