// Command fusebox-manager is the fusebox manager as a service: the in-cluster manager
// (--allocator kube, the default), or a service on one host (--allocator runsc). Its flags
// are package daemoncmd's; `fusebox-manager --help` lists them.
//
// It is built static (CGO_ENABLED=0) and links neither the CLI's deployment code (the Pulumi
// SDK) nor any test or benchmark code: cmd/fusebox-manager/deps.txt lists its packages and
// make verify checks it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fusebox-dev/fusebox/cmd/internal/daemoncmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := daemoncmd.ServiceCommand("fusebox-manager").ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fusebox-manager:", err)
		os.Exit(1)
	}
}
