// Package schedtrace records the Linux scheduler's context switches through tracefs and says,
// for marked stretches of time, which tasks had the CPUs: what a benchmark needs to tell its
// own slowness from another process's (fusebox-bench allocate --sched).
//
// A Recorder uses its own tracefs instance (instances/fusebox-PID-N), so it neither reads
// nor disturbs the global trace buffer or another tracer's; it needs root and a mounted
// tracefs (/sys/kernel/tracing, or /sys/kernel/debug/tracing).
package schedtrace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// tracefsRoots are where tracefs is looked for, in order.
var tracefsRoots = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// ErrNoTracefs reports that no tracefs is mounted (or this process may not use it).
var ErrNoTracefs = errors.New("no tracefs: mount it (mount -t tracefs nodev /sys/kernel/tracing) and run as root")

var instances atomic.Int64

// Recorder records context switches into its own tracefs instance until Stop. The kernel's
// buffer holds a few seconds of a busy machine's switches: a long recording calls Drain now
// and then, off the time it measures (a drain is work for a CPU).
type Recorder struct {
	dir    string
	mu     sync.Mutex // guards the rest
	marker *os.File
	pipe   int    // trace_pipe, non-blocking: reading consumes the buffer
	buf    []byte // what each read of it fills
	p      parser
}

// Start creates a tracefs instance with a buffer of bufferKB per CPU (0: 8 MiB; a busy
// two-CPU machine writes some 1 MiB a second per CPU), enables sched_switch in it and starts
// recording. Its times are on perf's clock (trace_clock "perf", which perf record's samples
// carry; the default "local" clock was 27.5 ms off it on this project's VMs).
func Start(bufferKB int) (*Recorder, error) {
	root := findTracefs()
	if root == "" {
		return nil, ErrNoTracefs
	}
	if bufferKB <= 0 {
		bufferKB = 8 << 10
	}
	removeStale(filepath.Join(root, "instances"))
	dir := filepath.Join(root, "instances", fmt.Sprintf("fusebox-%d-%d", os.Getpid(), instances.Add(1)))
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsPermission(err) {
			return nil, fmt.Errorf("%w: %v", ErrNoTracefs, err)
		}
		return nil, fmt.Errorf("creating tracefs instance: %w", err)
	}
	r := &Recorder{dir: dir, pipe: -1, buf: make([]byte, 256<<10), p: newParser()}
	for _, w := range []struct{ file, value string }{
		{"tracing_on", "0"},
		{"buffer_size_kb", strconv.Itoa(bufferKB)},
		{"trace_clock", "perf"}, // perf's clock: a recording lines up with perf record's
		{"events/sched/sched_switch/enable", "1"},
		{"tracing_on", "1"},
	} {
		if err := r.write(w.file, w.value); err != nil {
			r.remove()
			return nil, err
		}
	}
	var err error
	if r.marker, err = os.OpenFile(filepath.Join(dir, "trace_marker"), os.O_WRONLY, 0); err != nil {
		r.remove()
		return nil, fmt.Errorf("opening the trace marker: %w", err)
	}
	// Read with plain system calls: an os.File would wait in the poller instead of
	// returning EAGAIN once the buffer is empty.
	if r.pipe, err = syscall.Open(filepath.Join(dir, "trace_pipe"), syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0); err != nil {
		r.marker.Close()
		r.remove()
		return nil, fmt.Errorf("opening the trace pipe: %w", err)
	}
	return r, nil
}

// removeStale removes the instances of recorders whose process is gone (killed before
// Stop): each would go on recording into its buffer.
func removeStale(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "fusebox-")
		if !ok {
			continue
		}
		pid, _, _ := strings.Cut(rest, "-")
		if n, err := strconv.Atoi(pid); err != nil || n == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", pid)); os.IsNotExist(err) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Available reports whether a Recorder can start here: ErrNoTracefs if not.
func Available() error {
	if findTracefs() == "" {
		return ErrNoTracefs
	}
	return nil
}

// findTracefs returns where tracefs is mounted, mounting it at its usual place if the
// kernel has it but nobody mounted it (as perf does); "" if there is none.
func findTracefs() string {
	for _, r := range tracefsRoots {
		if _, err := os.Stat(filepath.Join(r, "instances")); err == nil {
			return r
		}
	}
	if err := syscall.Mount("nodev", tracefsRoots[0], "tracefs", 0, ""); err == nil {
		if _, err := os.Stat(filepath.Join(tracefsRoots[0], "instances")); err == nil {
			return tracefsRoots[0]
		}
	}
	return ""
}

func (r *Recorder) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(r.dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("tracefs %s: %w", file, err)
	}
	return nil
}

// remove deletes the instance (and its buffer), retrying while the kernel reports it busy.
func (r *Recorder) remove() error {
	var err error
	for range 50 {
		if err = os.Remove(r.dir); err == nil || os.IsNotExist(err) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("removing tracefs instance %s: %w", r.dir, err)
}

// Mark writes label into the trace at this moment (one write system call). Labels must not
// contain a newline.
func (r *Recorder) Mark(label string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.marker == nil {
		return errors.New("schedtrace: recorder stopped")
	}
	if _, err := r.marker.WriteString(label); err != nil {
		return fmt.Errorf("writing trace marker: %w", err)
	}
	return nil
}

// Drain moves what the kernel has recorded so far into the recorder's memory, freeing its
// buffer, and returns the trace recorded so far. The trace is the recorder's own: it changes
// with the next Drain or Stop, and a caller that is done with a stretch of it frees it with
// Trace.Forget.
func (r *Recorder) Drain() (*Trace, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pipe < 0 {
		return nil, errors.New("schedtrace: recorder stopped")
	}
	return r.p.t, r.drain()
}

func (r *Recorder) drain() error {
	for {
		n, err := syscall.Read(r.pipe, r.buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN || n == 0:
			return nil
		case err != nil:
			return fmt.Errorf("reading the trace pipe: %w", err)
		}
		if err := r.p.write(r.buf[:n]); err != nil {
			return err
		}
	}
}

// Stop stops recording, reads what is left and removes the instance.
func (r *Recorder) Stop() (*Trace, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pipe < 0 {
		return nil, errors.New("schedtrace: recorder stopped twice")
	}
	r.marker.Close()
	r.marker = nil
	err := errors.Join(r.write("tracing_on", "0"), r.drain(), r.p.flush())
	syscall.Close(r.pipe)
	r.pipe = -1
	if err := errors.Join(err, r.remove()); err != nil {
		return nil, err
	}
	return r.p.t, nil
}

// Task is a thread as the scheduler names it.
type Task struct {
	PID  int // the thread id; 0 is the idle task
	Comm string
}

// Mark is a label written with Recorder.Mark, at its trace-clock time.
type Mark struct {
	At    time.Duration
	Label string
}

// Trace is what was recorded: the marks, and per CPU which task ran from when.
type Trace struct {
	Marks []Mark
	// runs, per CPU, in time order: each task ran from its start until the next one's.
	runs map[int][]run
	// Lost reports that the buffer overflowed: some switches are missing (the kernel
	// overwrote the oldest before they were drained).
	Lost bool
}

type run struct {
	start time.Duration
	task  Task
}

// Parse reads a tracefs trace (the trace file, or what trace_pipe gave) of sched_switch
// events and trace marks.
func Parse(rd io.Reader) (*Trace, error) {
	p := newParser()
	buf := make([]byte, 64<<10)
	for {
		n, err := rd.Read(buf)
		if n > 0 {
			if err := p.write(buf[:n]); err != nil {
				return nil, err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the trace: %w", err)
		}
	}
	if err := p.flush(); err != nil {
		return nil, err
	}
	return p.t, nil
}

// parser reads a trace in pieces that may end within a line.
type parser struct {
	t       *Trace
	partial []byte
	// comms holds one copy of each task name: a run's Task must not keep the line it was
	// read from alive (a recording holds hundreds of thousands of runs).
	comms map[string]string
}

func newParser() parser {
	return parser{t: &Trace{runs: map[int][]run{}}, comms: map[string]string{}}
}

func (p *parser) intern(comm string) string {
	if c, ok := p.comms[comm]; ok {
		return c
	}
	c := strings.Clone(comm)
	p.comms[c] = c
	return c
}

func (p *parser) write(b []byte) error {
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.partial = append(p.partial, b...)
			return nil
		}
		line := b[:i]
		if len(p.partial) > 0 {
			line = append(p.partial, line...)
			p.partial = p.partial[:0]
		}
		if err := p.line(string(line)); err != nil {
			return err
		}
		b = b[i+1:]
	}
}

func (p *parser) flush() error {
	if len(p.partial) == 0 {
		return nil
	}
	line := string(p.partial)
	p.partial = nil
	return p.line(line)
}

func (p *parser) line(line string) error {
	t := p.t
	if strings.HasPrefix(line, "#") {
		if strings.Contains(line, "entries-in-buffer/entries-written") && lost(line) {
			t.Lost = true
		}
		return nil
	}
	cpu, at, event, rest, ok := fields(line)
	if !ok {
		if strings.Contains(line, "LOST") {
			t.Lost = true // trace_pipe's "CPU:1 [LOST 42 EVENTS]"
		}
		return nil
	}
	switch event {
	case "tracing_mark_write":
		t.Marks = append(t.Marks, Mark{At: at, Label: strings.Clone(strings.TrimSpace(rest))})
	case "sched_switch":
		next, err := nextTask(rest)
		if err != nil {
			return fmt.Errorf("trace line %q: %w", line, err)
		}
		next.Comm = p.intern(next.Comm)
		t.runs[cpu] = append(t.runs[cpu], run{start: at, task: next})
	}
	return nil
}

// lost reads "# entries-in-buffer/entries-written: 12/34   #P:2": fewer in the buffer than
// written means the ring buffer overwrote the oldest.
func lost(line string) bool {
	_, after, ok := strings.Cut(line, ":")
	if !ok {
		return false
	}
	f := strings.Fields(after)
	if len(f) == 0 {
		return false
	}
	in, written, ok := strings.Cut(f[0], "/")
	return ok && in != written
}

// fields splits a trace line, "COMM-PID [CPU] FLAGS SECONDS: EVENT: REST" (with "(TGID)"
// after PID when record-tgid is set): COMM may hold spaces and dashes, so the line is read
// from the "[CPU]" field.
func fields(line string) (cpu int, at time.Duration, event, rest string, ok bool) {
	open := strings.Index(line, "] ")
	if open < 0 {
		return 0, 0, "", "", false
	}
	lb := strings.LastIndex(line[:open], "[")
	if lb < 0 {
		return 0, 0, "", "", false
	}
	c, err := strconv.Atoi(line[lb+1 : open])
	if err != nil {
		return 0, 0, "", "", false
	}
	var f [4]string // FLAGS SECONDS: EVENT: REST
	rest = line[open+2:]
	for i := range 3 {
		f[i], rest, _ = strings.Cut(strings.TrimLeft(rest, " "), " ")
	}
	f[3] = rest
	if !strings.HasSuffix(f[1], ":") || !strings.HasSuffix(f[2], ":") {
		return 0, 0, "", "", false
	}
	secs := strings.TrimSuffix(f[1], ":")
	whole, frac, _ := strings.Cut(secs, ".")
	s, err1 := strconv.ParseInt(whole, 10, 64)
	us, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", "", false
	}
	return c, time.Duration(s)*time.Second + time.Duration(us)*time.Microsecond, strings.TrimSuffix(f[2], ":"), rest, true
}

// nextTask reads the task switched to from a sched_switch event's fields:
// "prev_comm=A prev_pid=1 prev_prio=120 prev_state=S ==> next_comm=B next_pid=2 next_prio=120".
func nextTask(rest string) (Task, error) {
	_, next, ok := strings.Cut(rest, "==> next_comm=")
	if !ok {
		return Task{}, errors.New("no next_comm")
	}
	i := strings.LastIndex(next, " next_pid=")
	if i < 0 {
		return Task{}, errors.New("no next_pid")
	}
	pidField := strings.Fields(next[i+len(" next_pid="):])
	if len(pidField) == 0 {
		return Task{}, errors.New("empty next_pid")
	}
	pid, err := strconv.Atoi(pidField[0])
	if err != nil {
		return Task{}, fmt.Errorf("next_pid: %w", err)
	}
	return Task{PID: pid, Comm: next[:i]}, nil
}

// Usage returns how long each task ran on any CPU within [from, to) of the trace clock.
// Time before a CPU's first recorded switch is not counted (it is unknown who ran).
func (t *Trace) Usage(from, to time.Duration) map[Task]time.Duration {
	u := map[Task]time.Duration{}
	for _, runs := range t.runs {
		// The first run that ends after from: the one before the first start after from.
		i := sort.Search(len(runs), func(i int) bool { return runs[i].start > from })
		if i > 0 {
			i--
		}
		for ; i < len(runs) && runs[i].start < to; i++ {
			end := to
			if i+1 < len(runs) && runs[i+1].start < to {
				end = runs[i+1].start
			}
			if d := end - max(runs[i].start, from); d > 0 {
				u[runs[i].task] += d
			}
		}
	}
	return u
}

// Forget drops what the trace holds from before t: the marks before it, and on each CPU the
// runs that ended by then (the one running at t stays). Usage and Windows over later times
// are unchanged.
func (t *Trace) Forget(before time.Duration) {
	for cpu, runs := range t.runs {
		i := sort.Search(len(runs), func(i int) bool { return runs[i].start > before })
		if i > 1 {
			t.runs[cpu] = slices.Delete(runs, 0, i-1)
		}
	}
	t.Marks = slices.DeleteFunc(t.Marks, func(m Mark) bool { return m.At < before })
}

// CPUs is how many CPUs the trace saw switches on.
func (t *Trace) CPUs() int { return len(t.runs) }

// Window is a stretch of the trace between two marks.
type Window struct {
	From, To time.Duration
}

// Windows pairs marks "<prefix>start <key>" with the next "<prefix>end <key>" and returns
// the windows by key. A start without an end is dropped.
func (t *Trace) Windows(prefix string) map[string]Window {
	open := map[string]time.Duration{}
	w := map[string]Window{}
	for _, m := range t.Marks {
		rest, ok := strings.CutPrefix(m.Label, prefix)
		if !ok {
			continue
		}
		if key, ok := strings.CutPrefix(rest, "start "); ok {
			open[key] = m.At
		} else if key, ok := strings.CutPrefix(rest, "end "); ok {
			if from, ok := open[key]; ok {
				w[key] = Window{From: from, To: m.At}
				delete(open, key)
			}
		}
	}
	return w
}

// SelfThreads returns this process's thread ids. Go keeps its threads, so those read at the
// end of a recording are those of this process that ran during it.
func SelfThreads() (map[int]bool, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("listing this process's threads: %w", err)
	}
	m := map[int]bool{}
	for _, e := range ents {
		if id, err := strconv.Atoi(e.Name()); err == nil {
			m[id] = true
		}
	}
	return m, nil
}
