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
		keep     bool
		out      string
		sealFile string
		leaseTTL time.Duration
		it       interactive
	)
	it.in, it.out, it.errOut = os.Stdin, os.Stdout, os.Stderr
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Run one command in a fresh sandbox and exit with its exit code",
		Long: `Allocates a fresh sandbox from the manager, uploads --upload DIR into its workspace,
runs the command there streaming its output, releases the sandbox (it is destroyed, never
reused) and exits with the command's exit code. Each --port LOCAL:REMOTE forwards
127.0.0.1:LOCAL to port REMOTE on the sandbox's loopback while the command runs (LOCAL 0: a
free port, printed).

--keep leaves the sandbox running after the command (or, with no command, at once) until its
lease ends, and --session-out FILE writes its session file, with which fusebox exec, cp, ls,
ps, attach, kill, port-forward and session (renew, release) reach it from any process: the
file holds the agent key, in the clear (mode 0600) unless --session-key seals it, and grants
whoever reads it what this command had.

-i streams this terminal's standard input to the command (its end closes the command's);
-t runs the command on a terminal in the sandbox, of this terminal's size and resized with it.
Together, -it, they make an interactive shell: this terminal goes into raw mode, and keys,
Ctrl-C and Ctrl-D included, reach the sandbox's terminal as they are. On a signal's death the
exit code is 128+signal, as shells say.`,
		Example: `  fusebox run -- uname -a
  fusebox run --upload ./repo -- sh -c 'cd repo && make test'
  fusebox run --template python -- python3 -c 'import sys; print(sys.version)'
  fusebox run --env DEBUG=1 --cwd src -- make test
  fusebox run --egress pypi.org:443,files.pythonhosted.org:443 -- pip download requests
  fusebox run --port 8000:3000 -- python3 -m http.server 3000
  fusebox run -it -- bash
  fusebox run --keep --session-out sb.json --lease-ttl 1h
  tar c . | fusebox run -i -- tar x
  fusebox run --manager tcp://fusebox-manager.fusebox.svc:9090 --ca-file ca.crt --token-file /var/run/secrets/fusebox/token -- uname -a`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && !keep {
				return errors.New("no command: give one after --, e.g. fusebox run -- uname -a (or --keep to only allocate)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if keep != (out != "") {
				return errors.New("--keep and --session-out FILE go together: a kept sandbox is reached through its session file")
			}
			start := time.Now()
			status := func(format string, a ...any) {
				if !quiet {
					fmt.Fprintf(os.Stderr, "fusebox: "+format+"\n", a...)
				}
			}
			env, err := parseEnv(envs)
			if err != nil {
				return err
			}
			it.status = status
			if err := it.checkTerminal(); err != nil {
				return err
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
				Labels: map[string]string{"via": "fusebox run"}, LeaseTTL: leaseTTL, TokenFile: mgr.TokenFile, CAFile: mgr.CAFile, ServerName: mgr.ServerName})
			if err != nil {
				return mgr.explain(err)
			}
			// finish ends this command's hold on the sandbox: it is released, or with --keep
			// left running for the session file's holders.
			finish := alloc.Close
			if keep {
				finish = alloc.Detach
			}
			defer finish()
			status("sandbox %s ready in %v", alloc.ID, time.Since(start).Round(time.Millisecond))
			if keep {
				how, err := writeSession(alloc, out, sealFile)
				if err != nil {
					alloc.Close()
					return fmt.Errorf("--session-out %s: %w", out, err)
				}
				status("session written to %s (%s); the sandbox runs until its lease ends or fusebox session release --session %s", out, how, out)
			}
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
			if (it.stdin || it.tty) && len(args) > 0 {
				spec := client.ProcessSpec{Argv: args, Tag: "fusebox run"}
				if shell {
					spec = client.ProcessSpec{Script: strings.Join(args, " "), Tag: "fusebox run"}
				}
				code, err := it.run(ctx, alloc.Sandbox, spec, timeout)
				closeForwards()
				if err != nil {
					return err
				}
				if err := finish(); err != nil {
					status("warning: %v", err)
				}
				if code != 0 {
					return exitError{code}
				}
				return nil
			}
			if len(args) == 0 {
				return nil
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
			if err := finish(); err != nil {
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
	f.BoolVarP(&it.stdin, "interactive", "i", false, "stream this terminal's standard input to the command (its end closes the command's)")
	f.BoolVarP(&it.tty, "tty", "t", false, "run the command on a terminal in the sandbox (needs a terminal on stdin; with -i this one goes raw: an interactive shell)")
	f.BoolVar(&keep, "keep", false, "leave the sandbox running after the command, until its lease ends (needs --session-out)")
	f.StringVar(&out, "session-out", "", "with --keep: write the sandbox's session file here (mode 0600)")
	f.StringVar(&sealFile, "session-key", os.Getenv("FUSEBOX_SESSION_KEY_FILE"), "with --session-out: seal the agent key with the 32-byte key in this file ($FUSEBOX_SESSION_KEY_FILE)")
	f.DurationVar(&leaseTTL, "lease-ttl", 0, "the lease's length (0: the manager's default); with --keep, how long the sandbox outlives the last renewal")
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
