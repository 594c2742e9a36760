package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// hangGuard bounds a wait that only a broken CLI would make last.
const hangGuard = 2 * time.Minute

// openPTY opens a pseudo-terminal pair: the master, which the test reads and writes as a
// terminal emulator does, and the terminal, which becomes the CLI's.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening /dev/ptmx: %v", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("the terminal's number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the terminal: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return master, tty
}

// setSize sets the terminal's size from the master's side, as a terminal emulator does: the
// terminal's foreground process group (the CLI) gets SIGWINCH.
func setSize(t *testing.T, master *os.File, rows, cols uint16) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatalf("setting the terminal's size: %v", err)
	}
}

// terminalOutput is what the CLI has written to its terminal, read from the master.
type terminalOutput struct {
	mu      sync.Mutex // guards buf and changed
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced at each read
	done    chan struct{} // closed when the master reads no more (every copy of the terminal closed)
}

func readTerminal(master *os.File) *terminalOutput {
	o := &terminalOutput{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			close(o.changed)
			o.changed = make(chan struct{})
			o.mu.Unlock()
			if err != nil {
				return // EIO once the CLI, the terminal's last holder, has exited
			}
		}
	}()
	return o
}

func (o *terminalOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitFor waits until the output contains s.
func (o *terminalOutput) waitFor(t *testing.T, s string) {
	t.Helper()
	guard := time.After(hangGuard)
	for {
		o.mu.Lock()
		has, changed := strings.Contains(o.buf.String(), s), o.changed
		o.mu.Unlock()
		if has {
			return
		}
		select {
		case <-changed:
		case <-o.done:
			t.Fatalf("the terminal closed without %q; it showed:\n%q", s, o.String())
		case <-guard:
			t.Fatalf("no %q on the terminal; it showed:\n%q", s, o.String())
		}
	}
}

// cliProcess is the CLI started on a terminal; exited is closed once it has exited.
type cliProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// startOnTerminal starts the CLI (bin) with args on a new terminal of rows×cols, as its
// controlling terminal, stdin, stdout and stderr, and returns the master and what it reads.
func startOnTerminal(t *testing.T, bin string, rows, cols uint16, args ...string) (*cliProcess, *os.File, *terminalOutput) {
	t.Helper()
	master, tty := openPTY(t)
	setSize(t, master, rows, cols)
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &cliProcess{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	// The CLI holds the terminal now; the master reads until the CLI has exited.
	tty.Close()
	return p, master, readTerminal(master)
}

// exitCode waits for the CLI and returns its exit code.
func exitCode(t *testing.T, p *cliProcess, out *terminalOutput) int {
	t.Helper()
	select {
	case <-p.exited:
		var ee *exec.ExitError
		if p.err != nil && !errors.As(p.err, &ee) {
			t.Fatal(p.err)
		}
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(hangGuard):
		t.Fatalf("fusebox run did not exit; the terminal showed:\n%q", out.String())
		return 0
	}
}

// TestRunInteractiveTerminal: fusebox run -it gives a shell in a real sandbox on this
// terminal: typed lines reach it (with Enter as the \r a terminal sends), its output comes
// back, its exit code is the CLI's, Ctrl-C reaches the sandbox's foreground process as the
// byte it is, and the sandbox's terminal has the local one's size, before and after a resize.
func TestRunInteractiveTerminal(t *testing.T) {
	m := sandboxtest.StartManager(t, sandboxtest.ManagerOptions{PoolSize: 1})
	bin := sandboxtest.StaticBinary(t, "fusebox")
	run := []string{"run", "-q", "--manager", m.Addr, "-it", "--", "bash", "--norc", "--noprofile"}

	t.Run("shell", func(t *testing.T) {
		cmd, master, out := startOnTerminal(t, bin, 24, 80, run...)
		out.waitFor(t, "$ ") // the prompt: the CLI's terminal is raw by now
		if _, err := master.WriteString("echo hi; exit 3\r"); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd, out); code != 3 {
			t.Fatalf("exit code %d, want 3; the terminal showed:\n%q", code, out.String())
		}
		<-out.done
		// "hi" alone on a line: the command's output, not the echo of what was typed.
		if s := out.String(); !strings.Contains(s, "\r\nhi\r\n") {
			t.Fatalf("no line \"hi\" on the terminal:\n%q", s)
		}
	})

	t.Run("ctrl-c", func(t *testing.T) {
		cmd, master, out := startOnTerminal(t, bin, 24, 80, run...)
		out.waitFor(t, "$ ")
		// The program says it runs once it is the terminal's foreground process.
		if _, err := master.WriteString(`python3 -c "import time; print('sleep' + 'ing', flush=True); time.sleep(600)"` + "\r"); err != nil {
			t.Fatal(err)
		}
		out.waitFor(t, "sleeping")
		if _, err := master.Write([]byte{0x03}); err != nil {
			t.Fatal(err)
		}
		// bash abandons the rest of a line whose program SIGINT ended; $? is 128+2.
		out.waitFor(t, "KeyboardInterrupt")
		if _, err := master.WriteString("exit $?\r"); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd, out); code != 130 {
			t.Fatalf("exit code %d, want 130; the terminal showed:\n%q", code, out.String())
		}
	})

	t.Run("size", func(t *testing.T) {
		cmd, master, out := startOnTerminal(t, bin, 37, 101, run...)
		out.waitFor(t, "$ ")
		if _, err := master.WriteString("stty size\r"); err != nil {
			t.Fatal(err)
		}
		out.waitFor(t, "\r\n37 101\r\n")
		// A resize reaches the sandbox's terminal through SIGWINCH and Resize, independently
		// of the input: ask until the new size shows.
		setSize(t, master, 50, 132)
		guard := time.After(hangGuard)
		for !strings.Contains(out.String(), "\r\n50 132\r\n") {
			if _, err := master.WriteString("stty size\r"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-guard:
				t.Fatalf("the sandbox's terminal never showed the new size; the terminal showed:\n%q", out.String())
			case <-time.After(200 * time.Millisecond):
			}
		}
		if _, err := master.WriteString("exit\r"); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd, out); code != 0 {
			t.Fatalf("exit code %d, want 0; the terminal showed:\n%q", code, out.String())
		}
	})

	t.Run("stdin without terminal", func(t *testing.T) {
		cmd := exec.Command(bin, "run", "-q", "--manager", m.Addr, "-i", "--", "sh", "-c", "tr a-z A-Z; exit 4")
		cmd.Stdin = strings.NewReader("piped input\n")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 4 {
			t.Fatalf("fusebox run -i: %v, want exit code 4; stderr:\n%s", err, stderr.String())
		}
		if stdout.String() != "PIPED INPUT\n" {
			t.Fatalf("stdout %q, want the piped input through tr (its end closed the command's input)", stdout.String())
		}
	})
}

// TestRunTTYWithoutTerminal: -t with a standard input that is no terminal is refused, before
// any sandbox is allocated, saying what to use instead.
func TestRunTTYWithoutTerminal(t *testing.T) {
	bin := sandboxtest.StaticBinary(t, "fusebox")
	for _, flags := range [][]string{{"-it"}, {"-t"}} {
		cmd := exec.Command(bin, append(append([]string{"run", "--manager", "unix:///nonexistent/m.sock"}, flags...), "--", "bash")...)
		cmd.Stdin = strings.NewReader("echo hi\n")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("%v: %v, want exit code 1; stderr:\n%s", flags, err, stderr.String())
		}
		if s := stderr.String(); !strings.Contains(s, "-t needs a terminal on stdin; use -i alone to pipe stdin") || strings.Contains(s, "allocating") {
			t.Fatalf("%v: stderr:\n%s\nwant the terminal refused before allocating", flags, s)
		}
	}
}
