// Command fusebox is the fusebox command-line interface. It links no test or benchmark code
// (cmd/fusebox/deps.txt lists its packages; make verify checks it): the benchmarks are
// fusebox-bench, and the in-cluster manager is fusebox-manager.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/cmd/internal/daemoncmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := cliMain(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// cliMain runs the command line args and returns the process's exit code; errors are printed
// on stderr.
func cliMain(ctx context.Context, args []string, stderr io.Writer) int {
	root := rootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintln(stderr, "fusebox:", describe(err))
	var md missingDashes
	if errors.As(err, &md) {
		fmt.Fprintln(stderr, "fusebox:", md.hint(args))
	}
	return 1
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "fusebox",
		Short:         "Run AI agents' generated code in single-use gVisor sandboxes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// fusebox manager is fusebox-manager's command under the CLI, for a service on one host.
	root.AddCommand(localCmd(), runCmd(), statusCmd(), templateCmd(), daemoncmd.ServiceCommand("manager"))
	root.AddCommand(sessionCmds()...)
	root.AddCommand(deployCmds()...)
	root.AddCommand(promoteCmd())
	root.AddCommand(imageCmd(), releaseCmd())
	return root
}
