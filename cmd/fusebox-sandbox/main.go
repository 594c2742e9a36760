// Command fusebox-sandbox is the server that runs inside every fusebox sandbox. It serves the
// one-shot Init service (sFuse) and then the key-pinned data plane; see package
// github.com/fusebox-dev/fusebox/sandbox-server/server.
//
// It is a static binary (CGO_ENABLED=0) and never imports manager code, client-go, the Pulumi
// SDK or any test or benchmark code (the benchmark's in-sandbox floor is fusebox-floor):
// cmd/fusebox-sandbox/deps.txt lists its packages and make verify checks it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fusebox-dev/fusebox/internal/userdb"
	"github.com/fusebox-dev/fusebox/sandbox-server/privsep"
	"github.com/fusebox-dev/fusebox/sandbox-server/relay"
	"github.com/fusebox-dev/fusebox/sandbox-server/server"
)

type envFlag map[string]string

func (e envFlag) String() string { return "" }
func (e envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	e[k] = v
	return nil
}

func main() {
	// A template build's RUN step with an egress allowlist runs under this mode (relayexec.go).
	if len(os.Args) > 1 && os.Args[1] == relayExecMode {
		os.Exit(relayExec(os.Args[2:]))
	}
	var cfg server.Config
	// The commands' base environment: these, or with -inherit-env the image's (these only
	// where it sets neither), then each -env.
	defaults := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG": "C.UTF-8",
	}
	env := envFlag{}
	lim := &cfg.Server.Limits
	flag.StringVar(&cfg.InitAddr, "init-listen", "unix:///run/fusebox/init.sock", "init listener (unix:///path or tcp://host:port), served until InitializeTLS succeeds once")
	flag.StringVar(&cfg.DataAddr, "data-listen", "unix:///run/fusebox/data.sock", "data-plane listener, bound at start and serving nothing until initialisation")
	flag.StringVar(&cfg.WorkspaceDir, "workspace", "/workspace", "workspace root: every file operation stays inside it")
	flag.StringVar(&cfg.WorkspaceSeed, "workspace-seed", "", "a directory (the template image's /workspace, bound read-only) whose files are copied into the workspace at start, before the server listens; a copy that fails (a full workspace) stops the server")
	flag.Int64Var(&lim.MaxOutputBytes, "max-output-bytes", 16<<20, "stdout+stderr streamed per exec; the rest is discarded and flagged")
	flag.IntVar(&lim.MaxProcesses, "max-processes", 64, "long-lived processes (StartProcess) running at once; as many exited ones are kept for replay")
	flag.IntVar(&lim.MaxWatches, "max-watches", 16, "file watches (Watch) open at once")
	flag.IntVar(&lim.ProcessBufferBytes, "process-buffer-bytes", 1<<20, "output kept per long-lived process for Attach (stdout and stderr together, the most recent)")
	flag.Int64Var(&cfg.Workspace.MaxFileBytes, "max-file-bytes", 1<<30, "largest file written or read")
	flag.Int64Var(&cfg.Workspace.MaxBatchBytes, "max-batch-bytes", 4<<20-64<<10, "largest WriteFiles/ReadFiles payload")
	flag.DurationVar(&lim.DefaultTimeout, "exec-timeout", 10*time.Minute, "timeout of an exec that sets none")
	flag.DurationVar(&lim.MaxTimeout, "max-exec-timeout", 24*time.Hour, "cap on any exec timeout")
	flag.DurationVar(&cfg.Server.IdleTTL, "idle-ttl", 10*time.Minute, "exit if not initialised within this time")
	flag.String("fast-path", "", "ignored: the sandbox server takes part in no latency accelerator (keep-awake is the host's GODEBUG); accepted for managers of earlier releases, which pass it")
	bulkOn := flag.Bool("bulk", true, "serve bulk transfers of large files (ALPN fusebox-bulk/1) after the same pinned handshake as the gRPC service; false: clients use the gRPC streams")
	flag.Var(env, "env", "KEY=VALUE added to the commands' base environment (repeatable)")
	inheritEnv := flag.Bool("inherit-env", false, "start the commands' base environment from this process's own (a template image's, as the container runtime set it from the image), without the cluster's KUBERNETES_* variables; -env is set over it")
	flag.StringVar(&cfg.Server.BaseCwd, "cwd", "", "the commands' working directory: absolute, or relative to the workspace (empty: the workspace)")
	warmUp := flag.String("warmup", "", `the template's warm-up commands, run before the sandbox waits in the pool, as JSON: [{"argv": [...]}, {"script": "..."}]; one that fails stops the server`)
	level := flag.String("log-level", "info", "debug, info, warn or error")
	egressSocket := flag.String("egress-socket", "", "unix socket of the host's egress proxy (e.g. /run/fusebox/egress.sock), relayed only once an allocation with an egress allowlist initialises the sandbox; empty, or an allocation without an allowlist: no egress at all (no relay, no proxy variables)")
	commandUser := flag.String("command-user", "", "UID:GID (or NAME, UID, NAME:GROUP, looked up in this root's /etc/passwd and /etc/group) that commands run as, apart from the server (which must start as root, keeps root as its real user and works as this user): commands then cannot signal the server or write into its socket directory; empty: commands run as the server's user")
	egressListen := flag.String("egress-listen", "127.0.0.1:3128", "loopback IP:port where the egress relay listens and where HTTP_PROXY and HTTPS_PROXY point (when the relay runs)")
	flag.Parse()
	cfg.Server.NoBulk = !*bulkOn
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "fusebox-sandbox: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *commandUser != "" {
		u, err := parseUser(*commandUser)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fusebox-sandbox: -command-user: %v\n", err)
			os.Exit(2)
		}
		cfg.CommandUser = &u
	}
	base := defaults
	if *inheritEnv {
		base = inheritedEnv()
		for k, v := range defaults {
			if _, ok := base[k]; !ok {
				base[k] = v
			}
		}
	}
	maps.Copy(base, env)
	env = base
	if _, ok := env["HOME"]; !ok {
		env["HOME"] = cfg.WorkspaceDir
	}
	if *egressSocket != "" {
		// Checked now, used only if an allocation brings an allowlist.
		if _, err := relay.CheckAddr(*egressListen); err != nil {
			fmt.Fprintf(os.Stderr, "fusebox-sandbox: -egress-listen: %v\n", err)
			os.Exit(2)
		}
	}
	if *warmUp != "" {
		dec := json.NewDecoder(strings.NewReader(*warmUp))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg.Server.WarmUpCommands); err != nil {
			fmt.Fprintf(os.Stderr, "fusebox-sandbox: -warmup: %v\n", err)
			os.Exit(2)
		}
	}
	cfg.Server.BaseEnv = env // an explicit -env wins over the proxy variables (AddBase)
	cfg.Server.Limits.MaxMessageBytes = int(cfg.Workspace.MaxBatchBytes) + 1<<20

	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "fusebox-sandbox: -log-level: %v\n", err)
		os.Exit(2)
	}
	// Standard error is a pipe the host reads while the process that started the sandbox
	// lives (see internal/localsandbox's serverLog); after that process's end, writes to it
	// fail with EPIPE. Go kills a program on EPIPE on its standard error unless SIGPIPE is
	// notified; notified, the write fails and the logger drops it. Notified rather than
	// ignored: commands start with SIGPIPE's default action, as they expect.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *egressSocket != "" {
		cfg.Server.StartEgress = egressStarter(ctx, *egressListen, *egressSocket, log)
	}
	err := server.Run(ctx, cfg, log)
	switch {
	case err == nil, errors.Is(err, context.Canceled):
	case errors.Is(err, server.ErrIdleTimeout):
		log.Warn("exiting: nobody initialised this sandbox", "idle_ttl", cfg.Server.IdleTTL)
		os.Exit(3)
	default:
		log.Error("sandbox server failed", "err", err)
		os.Exit(1)
	}
}

// egressStarter returns the server's StartEgress: the relay from listen to the host's egress
// proxy at socket runs only for an allocation with an egress allowlist, so that a sandbox
// without one has no listener and its commands no proxy variables.
func egressStarter(ctx context.Context, listen, socket string, log *slog.Logger) func(allow []string) (map[string]string, error) {
	return func(allow []string) (map[string]string, error) {
		ln, err := relay.Listen(listen)
		if err != nil {
			return nil, err
		}
		rlog := log.With("component", "egress-relay")
		go func() {
			if err := relay.Serve(ctx, ln, socket, rlog); err != nil {
				rlog.Error("egress relay stopped", "err", err)
			}
		}()
		rlog.Info("egress relay started", "listen", ln.Addr().String(), "socket", socket)
		return relay.ProxyEnv(ln.Addr(), allow), nil
	}
}

// parseUser resolves the commands' user: "UID:GID", or as an image's USER names one ("NAME",
// "UID", "NAME:GROUP"), names looked up in this root's /etc/passwd and /etc/group (the
// template image's, where the server runs in one). Root is refused.
func parseUser(s string) (privsep.User, error) {
	uid, gid, err := userdb.LookupDir("/", s)
	if err != nil {
		return privsep.User{}, err
	}
	if uid == 0 {
		return privsep.User{}, fmt.Errorf("%q is root: commands must not run as root (they could signal the server)", s)
	}
	return privsep.User{UID: uid, GID: gid}, nil
}

// inheritedEnv is this process's environment (the image's, as the container runtime set it)
// without the variables the cluster adds to every container (KUBERNETES_SERVICE_*,
// KUBERNETES_PORT*), which name the API server to commands that have no business with it.
func inheritedEnv() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.HasPrefix(k, "KUBERNETES_") {
			continue
		}
		env[k] = v
	}
	return env
}
