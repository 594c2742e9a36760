package main

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	)
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Run one command in a fresh sandbox and exit with its exit code",
		Long: `Allocates a fresh sandbox from the manager, uploads --upload DIR into its workspace,
runs the command there streaming its output, releases the sandbox (it is destroyed, never
reused) and exits with the command's exit code.`,
		Example: `  fusebox run -- uname -a
  fusebox run --upload ./repo -- sh -c 'cd repo && make test'
  fusebox run --template python -- python3 -c 'import sys; print(sys.version)'
  fusebox run --env DEBUG=1 --cwd src -- make test
  fusebox run --egress pypi.org:443,files.pythonhosted.org:443 -- pip download requests
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
			c := client.Command{Argv: args, Timeout: timeout, Stdout: os.Stdout, Stderr: os.Stderr}
			if shell {
				c = client.Command{Script: strings.Join(args, " "), Timeout: timeout, Stdout: os.Stdout, Stderr: os.Stderr}
			}
			res, err := alloc.Exec(ctx, c)
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
	return cmd
}
