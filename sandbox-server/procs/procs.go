// Package procs starts commands in their own process groups and reaps every child of the
// sandbox server, including orphans that the server inherits as PID 1 (or as a child
// subreaper when it runs outside a sandbox).
//
// Each started command has a waiter goroutine blocked in waitid(WNOWAIT) on its pid: when the
// leader exits, the waiter kills the rest of its process group while the leader's pid (and so
// the group id) cannot yet be reused, and only then reaps it; then it kills the group again
// until nothing is left in it (a member forked while the first kill was delivered escapes
// it), so that a command that has ended has nothing left running. Waking the waiter straight from
// the exit, rather than through SIGCHLD delivery and a dispatcher goroutine, keeps a command's
// end off several goroutine handoffs. A sweeper reaps orphans on SIGCHLD. Other code never
// calls wait: a Process reports its end through Done.
package procs

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Status is how a process ended.
type Status struct {
	ExitCode int            // exit status, or 128+signal when signalled
	Signal   syscall.Signal // zero unless a signal ended it
	Started  time.Time
	Exited   time.Time
}

// Spec describes a command. Files are the descriptors that become the child's 0, 1, 2, 3, ...
// in order; -1 leaves that descriptor closed. They should be in blocking mode: the child
// inherits the open file description, flags included.
type Spec struct {
	Path  string
	Argv  []string
	Env   []string
	Dir   string
	Files []int
	// User, if set, is who the child runs as: its real, effective and saved user and group
	// ids all become these, with no supplementary groups (which needs CAP_SETUID and
	// CAP_SETGID in this process; a switch away from root also clears the child's
	// capabilities). Its working directory is entered as that user.
	User *User
	// Terminal starts the child as the leader of a new session (setsid) with Files[0], a
	// terminal, as its controlling terminal (TIOCSCTTY). Its process group is its own then
	// too, so KillGroup and the reaper's group kills work as without it.
	Terminal bool
}

// User is a user and group id.
type User struct {
	UID, GID uint32
}

// Process is a started command, the leader of its own process group.
type Process struct {
	Pid int

	mu     sync.Mutex // guards reaped, status; held by the reaper while it kills and reaps
	reaped bool
	status Status
	done   chan struct{}
}

// Done is closed when the process has exited, its group has been killed and it was reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Status returns how the process ended; valid after Done is closed.
func (p *Process) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// KillGroup sends SIGKILL to the process's whole group. It is a no-op once the leader has been
// reaped (the group was killed then, and the id may belong to someone else by now).
func (p *Process) KillGroup() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
}

// Signal sends sig to the process, or with group to its whole process group. It fails with
// os.ErrProcessDone once the leader has been reaped (its id may belong to someone else by
// now).
func (p *Process) Signal(sig syscall.Signal, group bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return os.ErrProcessDone
	}
	pid := p.Pid
	if group {
		pid = -pid
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signalling %d: %w", pid, err)
	}
	return nil
}

// Reaper starts processes and waits for all children of this process.
type Reaper struct {
	// gate orders spawning against reaping: starters hold it shared from fork until the new
	// process is registered, the reaper holds it exclusively while it reaps. A child the
	// reaper finds unregistered is therefore an orphan, never a command still being started.
	gate sync.RWMutex

	mu    sync.Mutex // guards procs
	procs map[int]*Process

	sigs chan os.Signal
	stop chan struct{}
	wg   sync.WaitGroup
}

// NewReaper starts reaping. Outside PID 1 it makes this process a child subreaper so that
// orphaned descendants are reparented here rather than to the host's init.
func NewReaper() (*Reaper, error) {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("becoming child subreaper: %w", err)
		}
	}
	r := &Reaper{
		procs: map[int]*Process{},
		sigs:  make(chan os.Signal, 1),
		stop:  make(chan struct{}),
	}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	r.wg.Add(1)
	go r.loop()
	return r, nil
}

// Close stops the reaper goroutine. Processes still running are not killed.
func (r *Reaper) Close() {
	signal.Stop(r.sigs)
	close(r.stop)
	r.wg.Wait()
}

// Start starts spec as the leader of a new process group.
func (r *Reaper) Start(spec Spec) (*Process, error) {
	fds := make([]uintptr, len(spec.Files))
	for i, fd := range spec.Files {
		fds[i] = uintptr(fd) // -1 becomes ^0, which ForkExec closes in the child
	}
	attr := &syscall.ProcAttr{
		Dir:   spec.Dir,
		Env:   spec.Env,
		Files: fds,
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	if spec.Terminal {
		// setsid makes the child its own group's leader; a setpgid after it would fail.
		attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	if u := spec.User; u != nil {
		// With CAP_SETUID, setuid sets all three user ids (the child runs setgroups, setgid,
		// setuid, in that order, before it changes directory).
		attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	}
	r.gate.RLock()
	defer r.gate.RUnlock()
	started := time.Now()
	pid, err := syscall.ForkExec(spec.Path, spec.Argv, attr)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Path, err)
	}
	p := &Process{Pid: pid, done: make(chan struct{}), status: Status{Started: started}}
	r.mu.Lock()
	r.procs[pid] = p
	r.mu.Unlock()
	go r.wait(p)
	return p, nil
}

// wait blocks until p's leader exits, kills its group, reaps it and closes Done.
func (r *Reaper) wait(p *Process) {
	var info siginfo
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, unix.P_PID, uintptr(p.Pid), uintptr(unsafe.Pointer(&info)),
			unix.WEXITED|unix.WNOWAIT, 0, 0)
		if e != syscall.EINTR {
			break // 0, or ECHILD if someone reaped it anyway: reap below returns at once
		}
	}
	p.mu.Lock()
	// The leader is a zombie, so its pid and group id cannot have been reused: kill what is
	// left of the group before the reap below frees the id.
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	ws := reap(p.Pid)
	p.reaped = true
	p.status.Exited = time.Now()
	switch {
	case ws.Signaled():
		p.status.Signal = ws.Signal()
		p.status.ExitCode = 128 + int(ws.Signal())
	default:
		p.status.ExitCode = ws.ExitStatus()
	}
	p.mu.Unlock()
	r.mu.Lock()
	delete(r.procs, p.Pid)
	r.mu.Unlock()
	sweep(p.Pid)
	close(p.done)
}

// sweepFor bounds how long a waiter keeps killing what is left of its group.
const sweepFor = 5 * time.Second

// sweep kills process group pgid until kill finds no member left (its dead members reaped by
// the orphan sweeper), or for sweepFor. A member forked while a kill of the group was being
// delivered (a fork bomb's) escapes that kill, and one surviving member can fork again: one
// kill is not enough. The group's id stays its members' until the last is reaped, so kill
// finds nobody else under it. Usually the group is empty and this is one failed kill.
func sweep(pgid int) {
	deadline := time.Now().Add(sweepFor)
	for wait := 100 * time.Microsecond; syscall.Kill(-pgid, syscall.SIGKILL) == nil && time.Now().Before(deadline); wait = min(2*wait, 20*time.Millisecond) {
		time.Sleep(wait)
	}
}

func (r *Reaper) loop() {
	defer r.wg.Done()
	tick := time.NewTicker(time.Second) // a backstop in case a SIGCHLD is coalesced away
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigs:
		case <-tick.C:
		}
		r.reapAll()
	}
}

// siginfo is the prefix of the kernel's siginfo_t for SIGCHLD on 64-bit Linux.
type siginfo struct {
	Signo  int32
	Errno  int32
	Code   int32
	_      int32
	Pid    int32
	UID    uint32
	Status int32
	_      [100]byte
}

// peek returns the pid of an exited child without reaping it, or 0 when there is none.
func peek() (int, error) {
	var info siginfo
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info)),
			unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return int(info.Pid), nil
		case syscall.EINTR:
			continue
		default:
			return 0, e
		}
	}
}

// reapAll reaps every exited orphan, however many (a killed fork bomb leaves hundreds at
// once, and their SIGCHLDs coalesce into a few). Exited commands are left to their waiters;
// while one of them is the first zombie waitid reports, this waits for its waiter, for up to
// about 100 ms, and the orphans behind it wait for the next round if it is still there.
func (r *Reaper) reapAll() {
	for waits := 0; waits < 100; {
		r.gate.Lock()
		pid, err := peek()
		if err != nil || pid == 0 {
			r.gate.Unlock()
			return // ECHILD: no children at all
		}
		r.mu.Lock()
		_, tracked := r.procs[pid]
		r.mu.Unlock()
		if !tracked {
			reap(pid)
		}
		r.gate.Unlock()
		if tracked {
			waits++
			time.Sleep(time.Millisecond) // its waiter is reaping it right now
		}
	}
}

func reap(pid int) syscall.WaitStatus {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			return ws
		}
	}
}
