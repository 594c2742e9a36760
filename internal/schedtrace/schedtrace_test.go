package schedtrace

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"golang.org/x/sys/unix"
)

const sample = `# tracer: nop
#
# entries-in-buffer/entries-written: 9/9   #P:2
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
            bash-10      [000] d..2.   100.000000: sched_switch: prev_comm=bash prev_pid=10 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [001] d..2.   100.000100: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=my prog next_pid=21 next_prio=120
         my prog-21      [001] ...1.   100.000200: tracing_mark_write: w:start 1
          <idle>-0       [000] d..2.   100.000500: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=exe next_pid=30 next_prio=120
             exe-30      [000] d..2.   100.001500: sched_switch: prev_comm=exe prev_pid=30 prev_prio=120 prev_state=S ==> next_comm=kworker/u8:1 next_pid=40 next_prio=120
         my prog-21      [001] d..2.   100.002000: sched_switch: prev_comm=my prog prev_pid=21 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
    kworker/u8:1-40      [000] d..2.   100.002200: sched_switch: prev_comm=kworker/u8:1 prev_pid=40 prev_prio=120 prev_state=I ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [001] ...1.   100.003200: tracing_mark_write: w:end 1
          <idle>-0       [001] ...1.   100.003300: tracing_mark_write: w:start 2
`

func TestParseUsageWindows(t *testing.T) {
	t.Run("whole", func(t *testing.T) { testParseUsageWindows(t, strings.NewReader(sample)) })
	// As trace_pipe gives it: in pieces that end within lines.
	t.Run("bytewise", func(t *testing.T) { testParseUsageWindows(t, iotest.OneByteReader(strings.NewReader(sample))) })
}

func testParseUsageWindows(t *testing.T, rd io.Reader) {
	tr, err := Parse(rd)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Lost || tr.CPUs() != 2 {
		t.Fatalf("lost %v, CPUs %d", tr.Lost, tr.CPUs())
	}
	w := tr.Windows("w:")
	if len(w) != 1 {
		t.Fatalf("windows %v: want only key 1 (2 never ends)", w)
	}
	one := w["1"]
	if one.From != 100*time.Second+200*time.Microsecond || one.To != 100*time.Second+3200*time.Microsecond {
		t.Fatalf("window %+v", one)
	}
	got := tr.Usage(one.From, one.To)
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	want := map[Task]time.Duration{
		{21, "my prog"}:      us(1800), // 200 -> 2000 on CPU 1
		{0, "swapper/1"}:     us(1200), // 2000 -> 3200
		{0, "swapper/0"}:     us(300 + 1000),
		{30, "exe"}:          us(1000),
		{40, "kworker/u8:1"}: us(700),
	}
	if len(got) != len(want) {
		t.Fatalf("usage %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%+v ran %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// TestForget: forgetting what came before a time leaves the usage after it as it was, and
// frees the runs that ended before it and the earlier marks.
func TestForget(t *testing.T) {
	tr, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	w := tr.Windows("w:")["1"]
	at := w.From + 1600*time.Microsecond // CPU 0 runs kworker/u8:1 then, since 1500
	before := tr.Usage(at, w.To)
	tr.Forget(at)
	if after := tr.Usage(at, w.To); !maps.Equal(after, before) {
		t.Errorf("usage after Forget %v, before %v", after, before)
	}
	if first := tr.runs[0][0].task; first.Comm != "kworker/u8:1" {
		t.Errorf("CPU 0's first run after Forget is %+v, want the one running then", first)
	}
	if len(tr.Marks) != 2 { // the window's end and the next start
		t.Errorf("marks after Forget: %v", tr.Marks)
	}
}

func TestParseLost(t *testing.T) {
	tr, err := Parse(strings.NewReader(strings.Replace(sample, "9/9", "9/4000", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Lost {
		t.Fatal("an overwritten buffer is not reported")
	}
}

func TestParseBadSwitch(t *testing.T) {
	_, err := Parse(strings.NewReader("   a-1 [000] d..2. 1.000000: sched_switch: prev_comm=a ==> next_comm=b next_pid=x next_prio=1\n"))
	if err == nil {
		t.Fatal("a malformed sched_switch parsed")
	}
}

// TestRemoveStale: an instance left by a killed recorder is removed by the next Start; one
// of a live process is not.
func TestRemoveStale(t *testing.T) {
	root := findTracefs()
	if root == "" {
		t.Skip(ErrNoTracefs)
	}
	// A pid that is not running: past the kernel's maximum.
	stale := filepath.Join(root, "instances", "fusebox-99999999-1")
	live := filepath.Join(root, "instances", "fusebox-1-1")
	for _, d := range []string{stale, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(stale); os.Remove(live) })
	r, err := Start(64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale instance left: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live process's instance was removed: %v", err)
	}
}

// TestRecorder records this process burning a CPU between two marks on the real kernel: the
// window's usage must give this process's threads at least the CPU time the kernel itself
// counted for the busy thread. On a machine busy with other work the buffer can overflow (the
// trace says so: Lost), and a thread's edges can fall a little outside the marks, so it takes
// the best of three attempts; attempts that lost switches do not count.
func TestRecorder(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lostAll := true
	var last string
	for range 3 {
		self, burned, lost, msg := recordBusyLoop(t)
		if lost {
			last = "the trace lost switches"
			continue
		}
		lostAll = false
		// The kernel's count and the recorded switches measure the same run time; allow a
		// tenth for the edges (the clock reads are not the marks).
		if self >= burned*9/10 {
			return
		}
		last = msg
	}
	if lostAll {
		t.Skip("every attempt's trace lost switches (the machine is too busy to check the accounting)")
	}
	t.Fatal(last)
}

// recordBusyLoop records a thread that burns 30 ms of CPU between two marks and returns the
// CPU time the trace gives this process in the marks' window, the CPU time the thread used,
// whether the trace lost switches, and a description for a failure. The loop runs on the
// caller's locked thread until that thread has used 30 ms of CPU, so a busy machine (other
// test packages, gVisor) stretches the window but changes nothing the test asserts.
func recordBusyLoop(t *testing.T) (self, burned time.Duration, lost bool, msg string) {
	r, err := Start(1024)
	if errors.Is(err, ErrNoTracefs) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Mark("t:start x"); err != nil {
		t.Fatal(err)
	}
	start := threadCPU(t)
	n := 0
	for threadCPU(t)-start < 30*time.Millisecond {
		n++
	}
	burned = threadCPU(t) - start
	if _, err := r.Drain(); err != nil {
		t.Fatal(err)
	}
	if err := r.Mark("t:end x"); err != nil {
		t.Fatal(err)
	}
	tr, err := r.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Stop(); err == nil {
		t.Error("a second Stop did not fail")
	}
	if _, err := os.Stat(r.dir); !os.IsNotExist(err) {
		t.Errorf("instance %s not removed: %v", r.dir, err)
	}
	w, ok := tr.Windows("t:")["x"]
	if !ok {
		t.Fatalf("no window in %d marks", len(tr.Marks))
	}
	if d := w.To - w.From; d < burned {
		t.Fatalf("window %v shorter than the %v of CPU the loop used between its marks", d, burned)
	}
	mine, err := SelfThreads()
	if err != nil {
		t.Fatal(err)
	}
	for task, d := range tr.Usage(w.From, w.To) {
		if mine[task.PID] {
			self += d
		}
	}
	return self, burned, tr.Lost, fmt.Sprintf("the recorder gives this process %v of the %v window; the loop's thread alone used %v of CPU (%d iterations)", self, w.To-w.From, burned, n)
}

// threadCPU returns the calling thread's CPU time so far.
func threadCPU(t *testing.T) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ts.Nano())
}
