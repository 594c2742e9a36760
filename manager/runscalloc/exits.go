package runscalloc

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// exits watches each unit's sandbox process (a pidfd on Go's poller: no thread and no
// polling per unit) and reports the ones that end without Destroy to the manager's
// ExitWatcher callback.
type exits struct {
	onExit  func(id, reason string) // nil until WatchExits
	watched map[string]*os.File     // the pidfd of each watched unit's sandbox process
}

// WatchExits implements manager.ExitWatcher: exited is called for each unit whose sandbox
// process exits while it is not being destroyed (its server ended: a crash, a kill, the idle
// TTL), and by List for units whose container has stopped.
func (a *Allocator) WatchExits(exited func(id, reason string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.exits.onExit = exited
}

// watch starts watching unit id's sandbox process pid. Without a WatchExits callback, or
// when pidfd_open fails (the process is gone already: reported at once), it does what it can.
func (a *Allocator) watch(id string, pid int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.exits.onExit == nil || a.exits.watched[id] != nil {
		return
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		go a.exited(id, nil, fmt.Sprintf("sandbox process %d is gone (%v)", pid, err))
		return
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd %d", pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		a.o.Logger.Warn("cannot watch a sandbox process; its end will show at the next allocation or ping", "id", id, "err", err)
		return
	}
	if a.exits.watched == nil {
		a.exits.watched = map[string]*os.File{}
	}
	a.exits.watched[id] = f
	go func() {
		// Read waits on the poller until the pidfd is readable (the process has exited) or f
		// is closed (Destroy: no report).
		err := rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		if err == nil {
			a.exited(id, f, fmt.Sprintf("sandbox process %d exited", pid))
		}
	}()
}

// unwatch stops watching unit id (it is being destroyed).
func (a *Allocator) unwatch(id string) {
	a.mu.Lock()
	f := a.exits.watched[id]
	delete(a.exits.watched, id)
	a.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

// unwatchAll stops watching every unit, and reports no more exits.
func (a *Allocator) unwatchAll() {
	a.mu.Lock()
	files := a.exits.watched
	a.exits.watched, a.exits.onExit = nil, nil
	a.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
}

// exited reports unit id's end, unless Destroy stopped watching it first (f is the pidfd the
// report is about; nil for a unit never watched).
func (a *Allocator) exited(id string, f *os.File, why string) {
	a.mu.Lock()
	if f != nil {
		if a.exits.watched[id] != f {
			a.mu.Unlock()
			return // destroyed meanwhile
		}
		delete(a.exits.watched, id)
	}
	report := a.exits.onExit
	a.mu.Unlock()
	if f != nil {
		f.Close()
	}
	if log := lastLogLine(a.ServerLog(id)); log != "" {
		why += "; server log: " + log
	}
	a.o.Logger.Warn("sandbox ended on its own", "id", id, "reason", why)
	if report != nil {
		report(id, why)
	}
}

// watchListed watches, or reports as ended, a unit List found: a running container's sandbox
// process is watched; a stopped container is reported.
func (a *Allocator) watchListed(id string, st runsc.State) {
	switch st.Status {
	case runsc.StatusStopped:
		a.mu.Lock()
		report := a.exits.onExit != nil && a.exits.watched[id] == nil
		a.mu.Unlock()
		if report {
			go a.exited(id, nil, "sandbox found stopped")
		}
	case runsc.StatusCreated, runsc.StatusRunning:
		if st.Pid > 0 {
			a.watch(id, st.Pid)
		}
	}
}

// lastLogLine returns what the server last said about a failure in its log at path: the
// last warning or error (JSON lines), or a Go runtime panic's first line; "" if none (at
// most 300 bytes of it, from the log's last 16 KiB).
func lastLogLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tail = 16 << 10
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	buf := make([]byte, tail)
	n, _ := f.ReadAt(buf, max(fi.Size()-tail, 0))
	found := ""
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		l = strings.TrimSpace(l)
		var rec struct{ Level string }
		switch {
		case strings.HasPrefix(l, "panic: "), strings.HasPrefix(l, "fatal error: "):
			found = l
		case json.Unmarshal([]byte(l), &rec) == nil && (rec.Level == "ERROR" || rec.Level == "WARN"):
			found = l
		}
	}
	if len(found) > 300 {
		found = found[:300] + "..."
	}
	return found
}
