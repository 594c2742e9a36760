package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
)

// fusebox run -i and -t: the command runs as a long-lived process of the sandbox (StartProcess)
// instead of a one-shot Exec, so that this terminal's input can reach it while it runs. With -t
// it runs on a terminal in the sandbox of this terminal's size, and this terminal is put in raw
// mode: every key, Ctrl-C included, reaches the sandbox's terminal as the byte it is (0x03),
// whose line discipline turns it into the signal for the process's foreground group there.

// errNoTerminal is -t with a standard input that is no terminal.
var errNoTerminal = errors.New("-t needs a terminal on stdin; use -i alone to pipe stdin")

// interactive is how fusebox run -i/-t runs its command.
type interactive struct {
	stdin bool // -i: stream standard input to the process
	tty   bool // -t: a terminal in the sandbox, this terminal in raw mode
	// in, out and errOut are the CLI's standard streams; in's descriptor is the terminal
	// with tty.
	in          *os.File
	out, errOut io.Writer
	status      func(format string, a ...any)
}

// checkTerminal returns errNoTerminal for -t without a terminal on stdin; it is checked before
// a sandbox is allocated.
func (it *interactive) checkTerminal() error {
	if it.tty && !term.IsTerminal(int(it.in.Fd())) {
		return errNoTerminal
	}
	return nil
}

// run starts spec in sb, connects this terminal's streams to it until it exits, and returns
// its exit code (128+signal for a signal's death, as shells say). timeout, if positive, kills
// the process's group after that long. SIGINT, SIGTERM and SIGHUP the CLI gets (without raw
// mode, Ctrl-C's) are passed on to the process's group, and the calls to the sandbox go on
// after ctx ends, until the process exits.
func (it *interactive) run(ctx context.Context, sb *client.Sandbox, spec client.ProcessSpec, timeout time.Duration) (int, error) {
	exit, err := it.session(ctx, sb, spec, timeout)
	if err != nil {
		return 0, err
	}
	// Said once the terminal is out of raw mode.
	if exit.Signal != "" {
		it.status("command killed by %s", exit.Signal)
	}
	return exit.ExitCode, nil
}

// session is run until the process has exited, with this terminal in raw mode for -it.
func (it *interactive) session(ctx context.Context, sb *client.Sandbox, spec client.ProcessSpec, timeout time.Duration) (*client.ProcessInfo, error) {
	// The session outlives ctx: an interrupt becomes a signal to the process, whose exit the
	// CLI still waits for.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	fd := int(it.in.Fd())
	if it.tty {
		if err := it.checkTerminal(); err != nil {
			return nil, err
		}
		cols, rows, err := term.GetSize(fd)
		if err != nil {
			return nil, fmt.Errorf("reading the terminal's size: %w", err)
		}
		spec.PTY = &client.TerminalSize{Rows: uint32(max(rows, 1)), Cols: uint32(max(cols, 1))}
	}
	// Signals are caught before the process starts, so that none is lost to the default
	// action between the start and the forwarding.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGWINCH)
	defer signal.Stop(sigs)

	p, err := sb.StartProcess(sctx, spec)
	if err != nil {
		return nil, err
	}
	out, err := p.Attach(sctx, 0)
	if err != nil {
		p.Signal(sctx, syscall.SIGKILL, true)
		return nil, err
	}
	defer out.Close()
	if it.tty && it.stdin {
		old, err := term.MakeRaw(fd)
		if err != nil {
			p.Signal(sctx, syscall.SIGKILL, true)
			return nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		// Restored on every way out of session, a panic's included, before the CLI prints anything
		// more.
		defer term.Restore(fd, old)
	}
	if it.stdin {
		go it.copyStdin(sctx, p)
	}
	if timeout > 0 {
		t := time.AfterFunc(timeout, func() {
			it.status("command timed out after %v; killing it", timeout)
			p.Signal(sctx, syscall.SIGKILL, true)
		})
		defer t.Stop()
	}
	go func() {
		for {
			select {
			case <-sctx.Done():
				return
			case s := <-sigs:
				sig := s.(syscall.Signal)
				if sig == syscall.SIGWINCH {
					if it.tty {
						if cols, rows, err := term.GetSize(fd); err == nil && rows > 0 && cols > 0 {
							p.Resize(sctx, client.TerminalSize{Rows: uint32(rows), Cols: uint32(cols)})
						}
					}
					continue
				}
				// Raw mode makes Ctrl-C a byte; a signal here came from elsewhere (kill, a
				// closed terminal), or Ctrl-C without raw mode: the process group gets it.
				p.Signal(sctx, sig, true)
			}
		}
	}()
	return follow(out, it.out, it.errOut, func(n, _ uint64) {
		it.status("%d bytes of output were lost (the sandbox's buffer overflowed)", n)
	})
}

// follow copies an attached process's output to stdout and stderr until its exit event, which
// it returns; output the sandbox no longer held is reported to dropped (its byte count and
// the offset it ended at).
func follow(out *client.OutputStream, stdout, stderr io.Writer, dropped func(n, at uint64)) (*client.ProcessInfo, error) {
	for {
		ev, err := out.Recv()
		if err != nil {
			return nil, err
		}
		switch {
		case ev.Exit != nil:
			return ev.Exit, nil
		case ev.Dropped > 0:
			dropped(ev.Dropped, ev.Offset)
		case ev.Stderr:
			stderr.Write(ev.Data)
		default:
			stdout.Write(ev.Data)
		}
	}
}

// copyStdin writes what it reads from standard input to p's, until the input ends (then it
// closes p's: on a terminal, its end-of-file character), the process's input is closed, or ctx
// ends. A read in progress when the process exits is left behind: the CLI exits.
func (it *interactive) copyStdin(ctx context.Context, p *client.Process) {
	buf := make([]byte, 32<<10)
	for {
		n, err := it.in.Read(buf)
		if n > 0 {
			if werr := p.WriteStdin(ctx, buf[:n]); werr != nil {
				if status.Code(werr) != codes.FailedPrecondition && ctx.Err() == nil {
					it.status("stdin: %s", describe(werr))
				}
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && !it.tty {
				p.CloseStdin(ctx)
			}
			return
		}
	}
}
