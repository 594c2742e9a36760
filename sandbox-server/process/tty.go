package process

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openTerminal opens a new pseudo-terminal of the given size: its master as a non-blocking
// *os.File on Go's poller (closing it interrupts a read or write), and its slave as a raw
// blocking descriptor for a child.
func openTerminal(rows, cols uint16) (master *os.File, slave int, err error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	fail := func(what string, err error) (*os.File, int, error) {
		unix.Close(m)
		return nil, -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlocking the terminal", err)
	}
	n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN)
	if err != nil {
		return fail("finding the terminal's number", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	s, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("opening "+name, err)
	}
	if err := unix.IoctlSetWinsize(s, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		unix.Close(s)
		return fail("sizing the terminal", err)
	}
	if err := unix.SetNonblock(m, true); err != nil {
		unix.Close(s)
		return fail("opening the terminal", err)
	}
	return os.NewFile(uintptr(m), name), s, nil
}

// resize sets the size of the terminal whose master is f. Through SyscallConn, not Fd: Fd
// would put the descriptor back into blocking mode.
func resize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}

// eofChar is the terminal's end-of-file character, read from its settings (VEOF), or Ctrl-D
// if they cannot be read.
func eofChar(f *os.File) byte {
	c := byte(4)
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS); err == nil && t.Cc[unix.VEOF] != 0 {
				c = t.Cc[unix.VEOF]
			}
		})
	}
	return c
}

// OutputPipe returns a pipe whose read end is a non-blocking *os.File on Go's poller and
// whose write end is a raw blocking descriptor for a child: a child's stdout or stderr, for
// long-lived processes and one-shot commands alike.
func OutputPipe(name string) (*os.File, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, fmt.Errorf("creating %s pipe: %w", name, err)
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, fmt.Errorf("creating %s pipe: %w", name, err)
	}
	return os.NewFile(uintptr(p[0]), name), p[1], nil
}

// inputPipe returns a pipe whose read end is a raw blocking descriptor for a child and whose
// write end is a non-blocking *os.File on Go's poller (closing it interrupts a write; a
// deadline bounds one).
func inputPipe() (int, *os.File, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	if err := unix.SetNonblock(p[1], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return -1, nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	return p[0], os.NewFile(uintptr(p[1]), "stdin"), nil
}
