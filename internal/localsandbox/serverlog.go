package localsandbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// DefaultLogLimit bounds each of a sandbox server's two log files (LogName, and LogName+".1"
// before it), unless Options.LogLimit says otherwise.
const DefaultLogLimit = 1 << 20

// minLogLimit is the least Options.LogLimit: at least one read from the pipe.
const minLogLimit = 64 << 10

// serverLog writes what the sandbox server writes to its standard output and error into
// LogName in the sandbox's directory, rotated once (to LogName+".1") whenever it would pass
// its limit, so that the two files never hold more than twice the limit together, whatever
// the sandbox writes and for however long.
//
// Why a pipe and a goroutine: runsc hands the container's stdio to the sandbox for its whole
// life, and a file handed over would be written by the sandbox directly, without bound (a
// sandbox outlives a stopped manager, and a server can log a line per connection its
// commands open). Through a pipe, only this reader writes the host file. Why the host and
// not only the server caps: the server's standard error is the sandbox's to write, and the
// host file's bound must not rest on what runs inside. Why rotated rather than stopped at
// the limit: the last lines say why a server ended (the local allocator's exit reports quote
// them), and they are the ones kept.
//
// The reader lives in the process that started the sandbox. If that process ends (a manager
// stopped or restarted while sandboxes live on), nothing reads the pipe: the server's writes
// fail with EPIPE and are lost, the file stays as it was, and the server carries on
// (fusebox-sandbox does not die of SIGPIPE on its standard error, and its logger drops
// failed writes). They never block: a pipe without a reader refuses writes rather than
// filling. An adopted sandbox's log therefore ends where the earlier manager stopped.
type serverLog struct {
	dir   string
	limit int64
	r     *os.File // the pipe's read end
	done  chan struct{}

	mu      sync.Mutex // guards f, size, carry and flushes
	f       *os.File   // LogName; nil when it could not be created (writes are dropped)
	size    int64
	carry   []byte          // the end of a line not yet written (see write)
	flushes []chan struct{} // flush calls waiting for the pipe to be drained
}

// startServerLog creates LogName in dir (empty) and a pipe, and copies what is written to the
// pipe's write end, returned, into the file, until every copy of the write end is closed.
func startServerLog(dir string, limit int64) (*serverLog, *os.File, error) {
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	limit = max(limit, minLogLimit)
	os.Remove(filepath.Join(dir, LogName+".1")) // an earlier sandbox's in this directory
	f, err := os.Create(filepath.Join(dir, LogName))
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	l := &serverLog{dir: dir, limit: limit, r: r, f: f, done: make(chan struct{})}
	go l.run()
	return l, w, nil
}

// run copies the pipe into the file until the pipe's end (or its read end is closed).
func (l *serverLog) run() {
	defer close(l.done)
	defer l.r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.r.Read(buf)
		l.write(buf[:n], false)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			l.drain(buf) // asked by flush
		case err != nil:
			l.write(nil, true)
			l.mu.Lock()
			if l.f != nil {
				l.f.Close()
				l.f = nil
			}
			l.release()
			l.mu.Unlock()
			return
		}
	}
}

// drain writes what is in the pipe now, without waiting for more, then releases the flush
// calls that were waiting.
func (l *serverLog) drain(buf []byte) {
	l.mu.Lock()
	waiting := l.flushes
	l.flushes = nil
	// A flush from now on sets the deadline again, after this.
	l.r.SetReadDeadline(time.Time{})
	l.mu.Unlock()
	// Control, not Read: it ignores deadlines, which a later flush may have set again.
	if rc, err := l.r.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			for {
				// The read end is non-blocking (os.Pipe): EAGAIN once the pipe is empty.
				n, err := syscall.Read(int(fd), buf)
				if n <= 0 || err != nil {
					return
				}
				l.write(buf[:n], false)
			}
		})
	}
	l.write(nil, true)
	for _, c := range waiting {
		close(c)
	}
}

// release ends every waiting flush. Called with l.mu held.
func (l *serverLog) release() {
	for _, c := range l.flushes {
		close(c)
	}
	l.flushes = nil
}

// flush returns once what was written to the pipe before it was called is in the file (or
// after timeout, or at once if the reader has ended).
func (l *serverLog) flush(timeout time.Duration) {
	c := make(chan struct{})
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		return
	default:
	}
	l.flushes = append(l.flushes, c)
	l.r.SetReadDeadline(time.Unix(1, 0)) // interrupts the reader's Read
	l.mu.Unlock()
	select {
	case <-c:
	case <-l.done:
	case <-time.After(timeout):
	}
}

// maxCarry bounds the end of a line held back until the rest of the line comes.
const maxCarry = 32 << 10

// write appends p to the file, rotating it first where it would pass the limit, between
// lines: the end of p after its last newline is held back until the line is whole (or long,
// or flush says so). Errors drop the data: the pipe is drained whatever the disk does.
func (l *serverLog) write(p []byte, whole bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.carry = append(l.carry, p...)
	end := len(l.carry)
	if !whole {
		if e := bytes.LastIndexByte(l.carry, '\n') + 1; len(l.carry)-e <= maxCarry {
			end = e
		}
	}
	l.lines(l.carry[:end])
	l.carry = l.carry[:copy(l.carry, l.carry[end:])]
}

// lines appends p to the file, rotating it first where it would pass the limit: at the last
// line's end that fits, or, for a line longer than the limit, where the limit falls. Called
// with l.mu held.
func (l *serverLog) lines(p []byte) {
	for len(p) > 0 {
		room := l.limit - l.size
		if int64(len(p)) <= room {
			l.put(p)
			return
		}
		cut := int64(0)
		if i := bytes.LastIndexByte(p[:room], '\n'); i >= 0 {
			cut = int64(i) + 1
		} else if l.size == 0 {
			cut = room
		}
		l.put(p[:cut])
		p = p[cut:]
		l.rotate()
	}
}

// put writes p to the file. Called with l.mu held.
func (l *serverLog) put(p []byte) {
	if l.f != nil {
		l.f.Write(p)
	}
	l.size += int64(len(p))
}

// rotate moves LogName to LogName+".1" (replacing it) and starts LogName afresh. Called with
// l.mu held.
func (l *serverLog) rotate() {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	path := filepath.Join(l.dir, LogName)
	os.Rename(path, path+".1")
	// O_EXCL: a file put in its place meanwhile (not by the server, which cannot reach the
	// host) is not followed; its writes are then dropped.
	l.f, _ = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	l.size = 0
}

// stopReading closes the pipe's read end, as the end of the process holding it would (tests).
func (l *serverLog) stopReading() {
	l.r.Close()
	<-l.done
}

// wait waits up to timeout for the reader to end (the sandbox's end closes the pipe).
func (l *serverLog) wait(timeout time.Duration) {
	select {
	case <-l.done:
	case <-time.After(timeout):
	}
}

// readLog returns the server's log in dir: LogName+".1" then LogName.
func readLog(dir string) string {
	var b []byte
	for _, name := range []string{LogName + ".1", LogName} {
		p, _ := os.ReadFile(filepath.Join(dir, name))
		b = append(b, p...)
	}
	return string(b)
}
