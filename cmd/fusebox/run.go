package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/client"
)

// exitError carries a command's exit code out of cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func runCmd() *cobra.Command {
	var (
		mgr      managerFlags
		egress   []string
		upload   string
		template string
		envs     []string
		cwd      string
		timeout  time.Duration
		shell    bool
		quiet    bool
		ports    []string
	)
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Run one command in a fresh sandbox and exit with its exit code",
		Long: `Allocates a fresh sandbox from the manager, uploads --upload DIR into its workspace,
runs the command there streaming its output, releases the sandbox (it is destroyed, never
reused) and exits with the command's exit code. Each --port LOCAL:REMOTE forwards
127.0.0.1:LOCAL to port REMOTE on the sandbox's loopback while the command runs (LOCAL 0: a
free port, printed).`,
		Example: `  fusebox run -- uname -a
  fusebox run --upload ./repo -- sh -c 'cd repo && make test'
  fusebox run --template python -- python3 -c 'import sys; print(sys.version)'
  fusebox run --env DEBUG=1 --cwd src -- make test
  fusebox run --egress pypi.org:443,files.pythonhosted.org:443 -- pip download requests
  fusebox run --port 8000:3000 -- python3 -m http.server 3000
  fusebox run --manager tcp://fusebox-manager.fusebox.svc:9090 --ca-file ca.crt --token-file /var/run/secrets/fusebox/token -- uname -a`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			start := time.Now()
			status := func(format string, a ...any) {
				if !quiet {
					fmt.Fprintf(os.Stderr, "fusebox: "+format+"\n", a...)
				}
			}
			env := map[string]string{}
			for _, kv := range envs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--env %q: want KEY=VALUE", kv)
				}
				env[k] = v
			}
			fwds := make([]portForward, len(ports))
			for i, p := range ports {
				pf, err := parsePortForward(p)
				if err != nil {
					return err
				}
				fwds[i] = pf
			}
			alloc, err := client.Allocate(ctx, mgr.addr, client.AllocateOptions{Egress: egress, Template: template, Env: env, Cwd: cwd,
				Labels: map[string]string{"via": "fusebox run"}, TokenFile: mgr.TokenFile, CAFile: mgr.CAFile, ServerName: mgr.ServerName})
			if err != nil {
				return mgr.explain(err)
			}
			defer alloc.Close()
			status("sandbox %s ready in %v", alloc.ID, time.Since(start).Round(time.Millisecond))
			if upload != "" {
				t0 := time.Now()
				st, err := alloc.WriteTree(ctx, upload, "")
				if err != nil {
					return fmt.Errorf("uploading %s: %w", upload, err)
				}
				status("uploaded %d files (%d KiB) in %d batches + %d streams, %v", st.Files, st.Bytes>>10,
					st.Batches, st.Streamed, time.Since(t0).Round(time.Millisecond))
			}
			// The forwards last while the command runs: they end before the sandbox is released.
			var forwards []net.Listener
			closeForwards := func() {
				for _, ln := range forwards {
					ln.Close()
				}
				forwards = nil
			}
			defer closeForwards()
			for _, pf := range fwds {
				ln, err := alloc.ForwardPort(ctx, pf.remote, pf.local, client.ForwardOptions{OnError: func(err error) {
					status("port %d: %s", pf.remote, describe(err))
				}})
				if err != nil {
					return fmt.Errorf("--port %s: %w", pf.spec, err)
				}
				forwards = append(forwards, ln)
				status("forwarding %s to port %d in the sandbox", ln.Addr(), pf.remote)
			}
			c := client.Command{Argv: args, Timeout: timeout, Stdout: os.Stdout, Stderr: os.Stderr}
			if shell {
				c = client.Command{Script: strings.Join(args, " "), Timeout: timeout, Stdout: os.Stdout, Stderr: os.Stderr}
			}
			res, err := alloc.Exec(ctx, c)
			closeForwards()
			if err != nil {
				if errors.Is(ctx.Err(), context.Canceled) {
					return errors.New("interrupted")
				}
				return err
			}
			switch {
			case res.TimedOut:
				status("command timed out after %v and was killed", timeout)
			case res.Signal != "":
				status("command killed by %s", res.Signal)
			}
			if res.Truncated {
				status("output was truncated by the sandbox's limit")
			}
			if err := alloc.Close(); err != nil {
				status("warning: %v", err)
			}
			if res.ExitCode != 0 {
				return exitError{res.ExitCode}
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if strings.HasPrefix(err.Error(), "unknown ") { // unknown flag, unknown shorthand flag
			return missingDashes{err: err, cmd: c}
		}
		return err
	})
	f := cmd.Flags()
	mgr.register(f)
	f.StringSliceVar(&egress, "egress", nil, "allowed destinations, HOST:PORT (HOST may be *.domain), comma-separated")
	f.StringVar(&upload, "upload", "", "local directory to copy into the workspace first")
	f.StringArrayVar(&envs, "env", nil, "KEY=VALUE every command starts with, over the template's (repeatable)")
	f.StringVar(&cwd, "cwd", "", "the commands' working directory: absolute, or relative to the workspace")
	f.StringVar(&template, "template", "", "the sandbox template: one the manager was started with (fusebox status lists each with its pool; empty: the default)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command (and everything it started) after this long")
	f.BoolVar(&shell, "shell", false, "run the arguments as one bash script (exported variables are kept)")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the command's output")
	f.StringArrayVar(&ports, "port", nil, "LOCAL:REMOTE: forward 127.0.0.1:LOCAL to port REMOTE on the sandbox's loopback while the command runs (LOCAL 0: a free port; repeatable)")
	return cmd
}

// portForward is one --port: the local address to listen on and the port in the sandbox.
type portForward struct {
	spec, local string
	remote      int
}

// parsePortForward parses a --port value, LOCAL:REMOTE.
func parsePortForward(spec string) (portForward, error) {
	l, r, ok := strings.Cut(spec, ":")
	if !ok {
		return portForward{}, fmt.Errorf("--port %q: want LOCAL:REMOTE, e.g. 8000:3000", spec)
	}
	local, err := strconv.Atoi(l)
	if err != nil || local < 0 || local > 65535 {
		return portForward{}, fmt.Errorf("--port %q: local port %q: want 0-65535 (0: a free port)", spec, l)
	}
	remote, err := strconv.Atoi(r)
	if err != nil || remote < 1 || remote > 65535 {
		return portForward{}, fmt.Errorf("--port %q: port %q in the sandbox: want 1-65535", spec, r)
	}
	return portForward{spec: spec, local: net.JoinHostPort("127.0.0.1", l), remote: remote}, nil
}
