package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"

	"github.com/fusebox-dev/fusebox/internal/endpoint"
	"github.com/fusebox-dev/fusebox/sandbox-server/privsep"
	"github.com/fusebox-dev/fusebox/sandbox-server/procs"
	"github.com/fusebox-dev/fusebox/sandbox-server/seed"
	"github.com/fusebox-dev/fusebox/sandbox-server/workspace"
)

// Config is what the fusebox-sandbox binary is started with.
type Config struct {
	InitAddr, DataAddr string // unix:///path or tcp://host:port
	WorkspaceDir       string
	Workspace          workspace.Options // Dir and MountPath default to WorkspaceDir
	Server             Options           // Workspace, Reaper and WorkspaceDir are filled in
	// CommandUser, if set, separates the server from its commands (package privsep): Run
	// starts as root, works as this user from the start (its workspace is theirs), binds its
	// listeners as root, and runs every command as this user. Server.CommandUser is filled
	// in.
	CommandUser *privsep.User
	// WorkspaceSeed, if set, is a directory (a template image's /workspace, bound read-only
	// into the sandbox) whose tree Run copies into the workspace first, as root and so with
	// the image's owners, before it works as CommandUser and before it listens (package seed).
	// A copy that fails (a full workspace, a device in the image) fails Run.
	WorkspaceSeed string
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
	if cfg.WorkspaceSeed != "" {
		if err := seedWorkspace(cfg, log); err != nil {
			return err
		}
	}
	opts := cfg.Server
	// Bound as root: the socket directory is root's, so that commands can write nothing there.
	listen := endpoint.Listen
	if u := cfg.CommandUser; u != nil {
		if err := privsep.Become(*u); err != nil {
			return fmt.Errorf("separating the server from its commands: %w", err)
		}
		opts.CommandUser = &procs.User{UID: u.UID, GID: u.GID}
		listen = func(a endpoint.Addr) (net.Listener, error) {
			var ln net.Listener
			err := privsep.AsRoot(func() (err error) { ln, err = endpoint.Listen(a); return err })
			if err != nil {
				return nil, err
			}
			return rootCloser{ln}, nil
		}
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

	opts.Workspace, opts.Reaper, opts.WorkspaceDir, opts.Logger = ws, reaper, cfg.WorkspaceDir, log
	srv, err := New(opts)
	if err != nil {
		return err
	}
	// A self-test of the data plane on a private socket with throwaway keys, which also
	// warms its code paths before the sandbox waits in the pool; then the template's warm-up
	// commands.
	if err := srv.WarmUp(ctx); err != nil {
		return err
	}
	// The data socket is bound first (binding one is a round trip to the host under gVisor,
	// kept off the allocation path) and serves nothing until the fuse blows.
	dataLn, err := listen(dataAddr)
	if err != nil {
		return fmt.Errorf("binding data listener: %w", err)
	}
	initLn, err := listen(initAddr)
	if err != nil {
		dataLn.Close()
		return err
	}
	log.Info("sandbox server waiting for InitializeTLS", "init", initAddr.String(), "data", dataAddr.String(),
		"workspace", cfg.WorkspaceDir, "idle_ttl", opts.IdleTTL)
	return srv.Serve(ctx, initLn, dataLn)
}

// seedWorkspace copies cfg.WorkspaceSeed into the workspace.
func seedWorkspace(cfg Config, log *slog.Logger) error {
	dir := cfg.Workspace.Dir
	if dir == "" {
		dir = cfg.WorkspaceDir
	}
	st, err := seed.Copy(cfg.WorkspaceSeed, dir)
	if errors.Is(err, syscall.ENOSPC) {
		// The host checked the files' sizes; the tmpfs also counts a page per small file.
		err = fmt.Errorf("%w (the image's /workspace does not fit the workspace: raise the template's limits.workspace)", err)
	}
	if err != nil {
		return fmt.Errorf("copying the image's workspace (%s) into the workspace %s: %w", cfg.WorkspaceSeed, dir, err)
	}
	log.Info("copied the image's workspace", "from", cfg.WorkspaceSeed, "dirs", st.Dirs, "files", st.Files, "links", st.Links, "bytes", st.Bytes)
	return nil
}

// rootCloser closes its listener as root, so that a unix socket's file is removed from the
// root-owned directory it was bound in (the init socket, once the fuse blows).
type rootCloser struct{ net.Listener }

func (l rootCloser) Close() error { return privsep.AsRoot(l.Listener.Close) }
