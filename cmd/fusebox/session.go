package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/cmd/internal/managerflags"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// sessionHelp is the part of every session command's help that says what the file is.
const sessionHelp = `The session file (fusebox run --keep --session-out FILE, or an SDK's export_session)
holds what the allocating agent had: the sandbox's address and pinned key, the lease token and
the agent key, in the clear unless --session-key sealed it. Whoever can read it (and the seal
key) can use, renew and release the sandbox: keep it as secret as a private key.`

// sessionFlags are how a command opens a session file: the file, the key that seals its agent
// key, and the credentials for a tcp:// manager (the address is in the file).
type sessionFlags struct {
	file, keyFile string
	mgr           managerflags.TLS
}

func (s *sessionFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.file, "session", os.Getenv("FUSEBOX_SESSION"), "session file, as fusebox run --keep --session-out wrote it ($FUSEBOX_SESSION)")
	f.StringVar(&s.keyFile, "session-key", os.Getenv("FUSEBOX_SESSION_KEY_FILE"), "file holding the 32-byte key (raw, or 64 hex digits) that seals the session's agent key ($FUSEBOX_SESSION_KEY_FILE)")
	s.mgr.Register(f)
}

// sealKey reads the seal key file, if one is named.
func (s *sessionFlags) sealKey() ([]byte, error) {
	if s.keyFile == "" {
		return nil, nil
	}
	return readSealKey(s.keyFile)
}

// readSealKey reads a seal key: client.SealKeySize raw bytes, or twice as many hex digits
// (a trailing newline allowed).
func readSealKey(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--session-key: %w", err)
	}
	if len(b) == client.SealKeySize {
		return b, nil
	}
	if h := strings.TrimSpace(string(b)); len(h) == 2*client.SealKeySize {
		if k, err := hex.DecodeString(h); err == nil {
			return k, nil
		}
	}
	return nil, fmt.Errorf("--session-key %s: want %d bytes, or %d hex digits (e.g. head -c %d /dev/urandom > %s)",
		file, client.SealKeySize, 2*client.SealKeySize, client.SealKeySize, file)
}

// connect opens the session and connects to its sandbox. The caller detaches (or, to
// release, closes) the allocation.
func (s *sessionFlags) connect(ctx context.Context) (*client.Allocation, error) {
	if s.file == "" {
		return nil, errors.New("--session FILE is required (fusebox run --keep --session-out FILE writes one)")
	}
	sess, err := client.ReadSessionFile(s.file)
	if err != nil {
		return nil, err
	}
	key, err := s.sealKey()
	if err != nil {
		return nil, err
	}
	a, err := client.Connect(ctx, sess, client.ConnectOptions{SealKey: key, TokenFile: s.mgr.TokenFile, CAFile: s.mgr.CAFile, ServerName: s.mgr.ServerName})
	if err != nil {
		return nil, fmt.Errorf("--session %s: %w", s.file, err)
	}
	return a, nil
}

// withSession is a command's RunE that connects to the session's sandbox, runs do, and
// detaches: the sandbox keeps running.
func withSession(s *sessionFlags, do func(ctx context.Context, a *client.Allocation, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a, err := s.connect(cmd.Context())
		if err != nil {
			return err
		}
		defer a.Detach()
		return do(cmd.Context(), a, args)
	}
}

// sessionCmds are the commands that work on a running sandbox through a session file.
func sessionCmds() []*cobra.Command {
	return []*cobra.Command{execCmd(), cpCmd(), lsCmd(), psCmd(), attachCmd(), killCmd(), portForwardCmd(), sessionCmd()}
}

func execCmd() *cobra.Command {
	var (
		s       sessionFlags
		envs    []string
		cwd     string
		timeout time.Duration
		shell   bool
		detach  bool
		tag     string
	)
	cmd := &cobra.Command{
		Use:   "exec --session FILE [flags] -- CMD [ARG...]",
		Short: "Run a command in a running sandbox and exit with its exit code",
		Long: `Runs the command in the session's sandbox, streaming its output, and exits with its exit
code; the sandbox keeps running. With --detach the command is started as a process that
outlives this call: its id is printed, for fusebox attach, ps and kill.

` + sessionHelp,
		Example: `  fusebox run --keep --session-out sb.json
  fusebox exec --session sb.json -- python3 -c 'print(6*7)'
  fusebox exec --session sb.json --detach --tag web -- python3 -m http.server 3000`,
		Args: cobra.MinimumNArgs(1),
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, args []string) error {
			env, err := parseEnv(envs)
			if err != nil {
				return err
			}
			if detach {
				spec := client.ProcessSpec{Argv: args, Cwd: cwd, Env: env, Tag: tag}
				if shell {
					spec = client.ProcessSpec{Script: strings.Join(args, " "), Cwd: cwd, Env: env, Tag: tag}
				}
				p, err := a.StartProcess(ctx, spec)
				if err != nil {
					return err
				}
				fmt.Println(p.ID())
				return nil
			}
			c := client.Command{Argv: args, Cwd: cwd, Env: env, Timeout: timeout, Stdout: os.Stdout, Stderr: os.Stderr}
			if shell {
				c.Argv, c.Script = nil, strings.Join(args, " ")
			}
			res, err := a.Exec(ctx, c)
			if err != nil {
				return err
			}
			if res.TimedOut {
				fmt.Fprintf(os.Stderr, "fusebox: command timed out after %v and was killed\n", timeout)
			}
			if res.ExitCode != 0 {
				return exitError{res.ExitCode}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	s.register(f)
	f.StringArrayVar(&envs, "env", nil, "KEY=VALUE for this command (repeatable)")
	f.StringVar(&cwd, "cwd", "", "working directory: absolute, or relative to the workspace")
	f.DurationVar(&timeout, "timeout", 0, "kill the command (and everything it started) after this long")
	f.BoolVar(&shell, "shell", false, "run the arguments as one bash script")
	f.BoolVarP(&detach, "detach", "d", false, "start the command as a process that outlives this call, and print its id")
	f.StringVar(&tag, "tag", "", "with --detach: a label for the process, shown by fusebox ps")
	return cmd
}

// parseEnv parses --env KEY=VALUE values.
func parseEnv(envs []string) (map[string]string, error) {
	env := map[string]string{}
	for _, kv := range envs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	return env, nil
}

func cpCmd() *cobra.Command {
	var s sessionFlags
	cmd := &cobra.Command{
		Use:   "cp --session FILE SRC DST",
		Short: "Copy files or directories between this machine and a running sandbox",
		Long: `Copies SRC to DST; the one in the sandbox is written :PATH (absolute, or relative to the
workspace). A directory is copied whole; a local destination is written under a temporary
name and renamed into place, so a failed copy leaves nothing half-written.

` + sessionHelp,
		Example: `  fusebox cp --session sb.json ./repo :repo
  fusebox cp --session sb.json :repo/report.xml ./report.xml
  fusebox cp --session sb.json :out ./out`,
		Args: cobra.ExactArgs(2),
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, args []string) error {
			src, dst := args[0], args[1]
			switch rs, rd := strings.HasPrefix(src, ":"), strings.HasPrefix(dst, ":"); {
			case rs == rd:
				return fmt.Errorf("cp %s %s: exactly one of SRC and DST is in the sandbox, written :PATH", src, dst)
			case rd:
				return upload(ctx, a, src, dst[1:])
			default:
				return download(ctx, a, src[1:], dst)
			}
		}),
	}
	s.register(cmd.Flags())
	return cmd
}

// upload copies the local file or directory src to remote.
func upload(ctx context.Context, a *client.Allocation, src, remote string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_, err := a.WriteTree(ctx, src, remote)
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if remote == "" || strings.HasSuffix(remote, "/") {
		remote += filepath.Base(src)
	}
	_, err = a.WriteFileFrom(ctx, remote, fi.Mode().Perm(), f, fi.Size())
	return err
}

// download copies the sandbox's file or directory remote to local.
func download(ctx context.Context, a *client.Allocation, remote, local string) error {
	info, err := a.Stat(ctx, remote, false)
	if err != nil {
		return err
	}
	if info.GetType() != sandboxv1.FileType_FILE_TYPE_DIR {
		if fi, err := os.Stat(local); err == nil && fi.IsDir() {
			local = filepath.Join(local, path.Base(remote))
		}
		return downloadFile(ctx, a, remote, local, fs.FileMode(info.GetMode()).Perm())
	}
	list, err := a.RPC().List(ctx, &sandboxv1.ListRequest{Path: remote, Recursive: true})
	if err != nil {
		return err
	}
	if list.GetTruncated() {
		return fmt.Errorf("cp: %s holds more entries than the sandbox lists at once (%d): copy its subdirectories one by one", remote, len(list.GetEntries()))
	}
	entries := list.GetEntries()
	if err := os.MkdirAll(local, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		// The paths are the workspace's, as Stat's is.
		rel := e.GetPath()
		if base := strings.Trim(info.GetPath(), "/"); base != "" && base != "." {
			rel = strings.TrimPrefix(rel, base+"/")
		}
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("cp: the sandbox listed %q, outside %s", e.GetPath(), remote)
		}
		dst := filepath.Join(local, rel)
		switch e.GetType() {
		case sandboxv1.FileType_FILE_TYPE_DIR:
			err = os.MkdirAll(dst, 0o755)
		case sandboxv1.FileType_FILE_TYPE_SYMLINK:
			os.Remove(dst)
			err = os.Symlink(e.GetSymlinkTarget(), dst)
		case sandboxv1.FileType_FILE_TYPE_FILE:
			if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
				err = downloadFile(ctx, a, e.GetPath(), dst, fs.FileMode(e.GetMode()).Perm())
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// downloadFile reads remote into local through a temporary file renamed into place.
func downloadFile(ctx context.Context, a *client.Allocation, remote, local string, mode fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	err = a.ReadFileTo(ctx, remote, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), mode)
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), local)
}

func lsCmd() *cobra.Command {
	var (
		s         sessionFlags
		recursive bool
	)
	cmd := &cobra.Command{
		Use:   "ls --session FILE [PATH]",
		Short: "List a directory in a running sandbox",
		Long:  "Lists PATH (default: the workspace) in the session's sandbox.\n\n" + sessionHelp,
		Args:  cobra.MaximumNArgs(1),
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, args []string) error {
			p := ""
			if len(args) == 1 {
				p = args[0]
			}
			list, err := a.RPC().List(ctx, &sandboxv1.ListRequest{Path: p, Recursive: recursive})
			if err != nil {
				return err
			}
			entries := list.GetEntries()
			if list.GetTruncated() {
				defer fmt.Fprintf(os.Stderr, "fusebox: the listing stops at the sandbox's limit of %d entries\n", len(entries))
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
			for _, e := range entries {
				name := e.GetPath()
				if e.GetType() == sandboxv1.FileType_FILE_TYPE_DIR {
					name += "/"
				}
				if t := e.GetSymlinkTarget(); t != "" {
					name += " -> " + t
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t %s\n", fs.FileMode(e.GetMode()).Perm(), e.GetSize(),
					e.GetModified().AsTime().Local().Format("2006-01-02 15:04"), name)
			}
			return w.Flush()
		}),
	}
	s.register(cmd.Flags())
	cmd.Flags().BoolVarP(&recursive, "recursive", "R", false, "list subdirectories too")
	return cmd
}

func psCmd() *cobra.Command {
	var s sessionFlags
	cmd := &cobra.Command{
		Use:   "ps --session FILE",
		Short: "List the processes started in a running sandbox",
		Long:  "Lists the processes started in the session's sandbox (fusebox exec --detach, an SDK's start_process), running and exited.\n\n" + sessionHelp,
		Args:  cobra.NoArgs,
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, _ []string) error {
			ps, err := a.ListProcesses(ctx)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tSTATE\tEXIT\tPID\tSTARTED\tTAG\tCOMMAND")
			for _, p := range ps {
				state, exit := "running", "-"
				if !p.Running {
					state, exit = "exited", strconv.Itoa(p.ExitCode)
					if p.Signal != "" {
						exit += " (" + p.Signal + ")"
					}
				}
				command := p.Script
				if command == "" {
					command = strings.Join(p.Argv, " ")
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", p.ID, state, exit, p.Pid, p.Started.Local().Format(time.TimeOnly), p.Tag, command)
			}
			return w.Flush()
		}),
	}
	s.register(cmd.Flags())
	return cmd
}

func attachCmd() *cobra.Command {
	var (
		s    sessionFlags
		from uint64
	)
	cmd := &cobra.Command{
		Use:   "attach --session FILE ID",
		Short: "Follow a process's output in a running sandbox, and exit with its exit code",
		Long: `Prints the process's output from --from (0: its first byte, as far as the sandbox still holds
it), then follows it live until the process exits, and exits with its exit code. Output the
sandbox no longer held is reported on stderr with its byte count. Interrupting stops
following; the process runs on.

` + sessionHelp,
		Args: cobra.ExactArgs(1),
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, args []string) error {
			out, err := a.Process(args[0]).Attach(ctx, from)
			if err != nil {
				return err
			}
			defer out.Close()
			exit, err := follow(out, os.Stdout, os.Stderr, func(n, at uint64) {
				fmt.Fprintf(os.Stderr, "fusebox: %d bytes of output before offset %d are no longer held\n", n, at)
			})
			if err != nil {
				if errors.Is(ctx.Err(), context.Canceled) {
					return errors.New("interrupted: the process runs on")
				}
				return err
			}
			if exit.ExitCode != 0 {
				return exitError{exit.ExitCode}
			}
			return nil
		}),
	}
	s.register(cmd.Flags())
	cmd.Flags().Uint64Var(&from, "from", 0, "output offset to start from (bytes of stdout and stderr together)")
	return cmd
}

// signalNames are the signals fusebox kill takes by name.
var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "WINCH": syscall.SIGWINCH, "ALRM": syscall.SIGALRM,
}

// parseSignal parses a signal name (TERM, SIGTERM) or number.
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return syscall.Signal(n), nil // the sandbox checks the range
	}
	if sig, ok := signalNames[strings.TrimPrefix(strings.ToUpper(s), "SIG")]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("--signal %q: want a number or one of HUP INT QUIT KILL USR1 USR2 TERM CONT STOP TSTP WINCH ALRM", s)
}

func killCmd() *cobra.Command {
	var (
		s     sessionFlags
		sig   string
		group bool
	)
	cmd := &cobra.Command{
		Use:   "kill --session FILE ID",
		Short: "Send a signal to a process in a running sandbox",
		Long:  "Sends --signal (default TERM) to the process, or with --group to its whole process group.\n\n" + sessionHelp,
		Args:  cobra.ExactArgs(1),
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, args []string) error {
			n, err := parseSignal(sig)
			if err != nil {
				return err
			}
			return a.Process(args[0]).Signal(ctx, n, group)
		}),
	}
	s.register(cmd.Flags())
	cmd.Flags().StringVarP(&sig, "signal", "s", "TERM", "the signal, by name or number")
	cmd.Flags().BoolVar(&group, "group", false, "signal the process's whole process group")
	return cmd
}

func portForwardCmd() *cobra.Command {
	var s sessionFlags
	cmd := &cobra.Command{
		Use:   "port-forward --session FILE LOCAL:REMOTE [LOCAL:REMOTE...]",
		Short: "Forward local ports to ports on a running sandbox's loopback",
		Long: `Listens on 127.0.0.1:LOCAL (0: a free port, printed) and carries each connection to port
REMOTE on the sandbox's loopback, over a pinned connection only the agent key can open, until
interrupted.

` + sessionHelp,
		Example: `  fusebox port-forward --session sb.json 8000:3000`,
		Args:    cobra.MinimumNArgs(1),
		RunE: withSession(&s, func(ctx context.Context, a *client.Allocation, args []string) error {
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			var lns []net.Listener
			defer func() {
				for _, ln := range lns {
					ln.Close()
				}
			}()
			for _, spec := range args {
				pf, err := parsePortForward(spec)
				if err != nil {
					return err
				}
				ln, err := a.ForwardPort(ctx, pf.remote, pf.local, client.ForwardOptions{OnError: func(err error) {
					fmt.Fprintf(os.Stderr, "fusebox: port %d: %s\n", pf.remote, describe(err))
				}})
				if err != nil {
					return fmt.Errorf("%s: %w", spec, err)
				}
				lns = append(lns, ln)
				fmt.Fprintf(os.Stderr, "fusebox: forwarding %s to port %d in the sandbox\n", ln.Addr(), pf.remote)
			}
			<-ctx.Done()
			return nil
		}),
	}
	s.register(cmd.Flags())
	return cmd
}

func sessionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Show, renew or release the sandbox of a session file",
		Long:  sessionHelp,
	}
	var show sessionFlags
	showCmd := &cobra.Command{
		Use:   "show --session FILE",
		Short: "Print what a session file names, without contacting anything",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if show.file == "" {
				return errors.New("--session FILE is required")
			}
			sess, err := client.ReadSessionFile(show.file)
			if err != nil {
				return err
			}
			key := "not in the file"
			if k := sess.AgentKey; k != nil {
				key = "in the clear"
				if k.Seal == client.SealAESGCM {
					key = "sealed (" + k.Seal + ")"
				}
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "sandbox\t%s\nendpoint\t%s\nmanager\t%s\nagent key\t%s\n", sess.SandboxID, sess.Endpoint, sess.Manager, key)
			return w.Flush()
		},
	}
	show.register(showCmd.Flags())
	var renew sessionFlags
	renewCmd := &cobra.Command{
		Use:   "renew --session FILE",
		Short: "Renew the sandbox's lease by its own length, and print the new expiry",
		Args:  cobra.NoArgs,
		RunE: withSession(&renew, func(ctx context.Context, a *client.Allocation, _ []string) error {
			exp, err := a.Renew(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("lease of %s expires %s (in %v)\n", a.ID, exp.Local().Format(time.RFC3339), time.Until(exp).Round(time.Second))
			return nil
		}),
	}
	renew.register(renewCmd.Flags())
	var release sessionFlags
	releaseCmd := &cobra.Command{
		Use:   "release --session FILE",
		Short: "Release the sandbox: the manager destroys it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := release.connect(cmd.Context())
			if err != nil {
				return err
			}
			if err := a.Close(); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "fusebox: released %s\n", a.ID)
			return nil
		},
	}
	release.register(releaseCmd.Flags())
	cmd.AddCommand(showCmd, renewCmd, releaseCmd)
	return cmd
}

// writeSession writes a's session to file for --session-out: the agent key sealed with the
// key in keyFile, or in the clear without one.
func writeSession(a *client.Allocation, file, keyFile string) (string, error) {
	o := client.ExportOptions{Plain: true}
	how := "the agent key in the clear: keep the file as secret as a private key"
	if keyFile != "" {
		k, err := readSealKey(keyFile)
		if err != nil {
			return "", err
		}
		o = client.ExportOptions{SealKey: k}
		how = "the agent key sealed with --session-key"
	}
	sess, err := a.ExportSession(o)
	if err != nil {
		return "", err
	}
	if err := client.WriteSessionFile(file, sess); err != nil {
		return "", err
	}
	return how, nil
}
