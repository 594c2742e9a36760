package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fusebox-dev/fusebox/sandbox-server/relay"
)

// relayExecMode is the first argument that selects relayExec instead of the server.
const relayExecMode = "relay-exec"

// relayExec is `fusebox-sandbox relay-exec -socket PATH [-listen ADDR] [-allow HOST:PORT ...]
// -- ARGV...`, the init process of a template build's RUN step that has an egress allowlist:
// it relays a loopback port to the host's egress proxy at PATH (as the server does for an
// allocation with an allowlist), runs ARGV with HTTP_PROXY and HTTPS_PROXY pointing at the
// relay, and exits as ARGV does (128+n if a signal n killed it). It returns the exit code.
//
// It runs as the step's user, with the step's capabilities, as ARGV does: the relay decides
// nothing (the proxy on the host checks every destination against the allowlist), so the
// step gains nothing by stopping or replacing it. -allow only keeps the allowlisted loopback
// hosts out of NO_PROXY; it enforces nothing.
//
// As the sandbox's first process it also reaps the orphans the step leaves, as a shell as
// init would; the step's other processes die with the sandbox once ARGV has exited.
func relayExec(args []string) int {
	fs := flag.NewFlagSet(relayExecMode, flag.ContinueOnError)
	socket := fs.String("socket", "", "unix socket of the host's egress proxy (required)")
	listen := fs.String("listen", "127.0.0.1:3128", "loopback IP:port of the relay, where HTTP_PROXY and HTTPS_PROXY point")
	var allow []string
	fs.Func("allow", "an egress allowlist entry HOST:PORT (repeatable): a loopback host named here is left out of NO_PROXY", func(s string) error {
		allow = append(allow, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	argv := fs.Args()
	if *socket == "" || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "fusebox-sandbox %s: want -socket PATH and a command after --\n", relayExecMode)
		return 2
	}
	ln, err := relay.Listen(*listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fusebox-sandbox %s: %v\n", relayExecMode, err)
		return 125
	}
	// The relay's own warnings (the proxy's socket unreachable) belong to the step's output.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go relay.Serve(ctx, ln, *socket, log)

	// Signals for the step go to ARGV; registered before it starts, so none is lost.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	// The proxy variables replace any the image or the Dockerfile set: the relay is the
	// step's only way out, so another proxy could not be reached anyway.
	env := os.Environ()
	for k, v := range relay.ProxyEnv(ln.Addr(), allow) {
		env = setEnvVar(env, k, v)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "fusebox-sandbox %s: %v\n", relayExecMode, err)
		return 127
	}
	child, err := os.StartProcess(path, argv, &os.ProcAttr{Env: env, Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintf(os.Stderr, "fusebox-sandbox %s: %v\n", relayExecMode, err)
		return 126
	}
	done := make(chan int, 1)
	go func() { done <- reap(child.Pid) }()
	for {
		select {
		case sig := <-sigs:
			child.Signal(sig)
		case code := <-done:
			return code
		}
	}
}

// reap waits for every child process until pid exits, and returns pid's exit code (128+n if
// signal n killed it). Orphans of the step are this process's children too (it is the
// sandbox's first process): they are reaped as they exit, so they leave no zombies that count
// against the step's task limit.
func reap(pid int) int {
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "fusebox-sandbox %s: waiting for the command: %v\n", relayExecMode, err)
			return 125
		}
		if got != pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}

// setEnvVar sets k=v in env, in place of an earlier value of k.
func setEnvVar(env []string, k, v string) []string {
	for i, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}
