package server

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
)

// Config is what the fusebox-sandbox binary is started with.
type Config struct {
	InitAddr, DataAddr string // unix:///path or tcp://host:port
	WorkspaceDir       string
	Workspace          workspace.Options // Dir and MountPath default to WorkspaceDir
	Server             Options           // Workspace, Reaper and WorkspaceDir are filled in
}

// Run starts a sandbox server from cfg and serves until ctx ends, the idle TTL passes without
// initialisation, or serving fails.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	initAddr, err := endpoint.Parse(cfg.InitAddr)
	if err != nil {
		return fmt.Errorf("init address: %w", err)
	}
	dataAddr, err := endpoint.Parse(cfg.DataAddr)
	if err != nil {
		return fmt.Errorf("data address: %w", err)
	}
	if initAddr == dataAddr {
		return fmt.Errorf("init and data addresses must differ (both %s)", initAddr)
	}
	wo := cfg.Workspace
	if wo.Dir == "" {
		wo.Dir = cfg.WorkspaceDir
	}
	if wo.MountPath == "" {
		wo.MountPath = cfg.WorkspaceDir
	}
	// Refuse to serve when the kernel would let a path leave the workspace (it must resolve
	// with openat2 beneath the root and never follow a link under O_NOFOLLOW).
	if err := workspace.CheckJail(wo.Dir); err != nil {
		return fmt.Errorf("workspace jail self-check: %w", err)
	}
	ws, err := workspace.Open(wo)
	if err != nil {
		return fmt.Errorf("opening workspace: %w", err)
	}
	defer ws.Close()
	reaper, err := procs.NewReaper()
	if err != nil {
		return err
	}
	defer reaper.Close()

	opts := cfg.Server
	opts.Workspace, opts.Reaper, opts.WorkspaceDir, opts.Logger = ws, reaper, cfg.WorkspaceDir, log
	srv, err := New(opts)
	if err != nil {
		return err
	}
	// A self-test of the data plane on a private socket with throwaway keys, which also
	// warms its code paths before the sandbox waits in the pool.
	if err := srv.WarmUp(ctx); err != nil {
		return fmt.Errorf("data-plane self-test: %w", err)
	}
	// The data socket is bound first (binding one is a round trip to the host under gVisor,
	// kept off the allocation path) and serves nothing until the fuse blows.
	dataLn, err := endpoint.Listen(dataAddr)
	if err != nil {
		return fmt.Errorf("binding data listener: %w", err)
	}
	initLn, err := endpoint.Listen(initAddr)
	if err != nil {
		dataLn.Close()
		return err
	}
	log.Info("sandbox server waiting for InitializeTLS", "init", initAddr.String(), "data", dataAddr.String(),
		"workspace", cfg.WorkspaceDir, "idle_ttl", opts.IdleTTL)
	return srv.Serve(ctx, initLn, dataLn)
}
