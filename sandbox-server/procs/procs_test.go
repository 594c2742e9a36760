package procs

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/test/procstat"
)

func fds(files ...*os.File) []int {
	out := make([]int, len(files))
	for i, f := range files {
		out[i] = -1
		if f != nil {
			out[i] = int(f.Fd())
		}
	}
	return out
}

func start(t *testing.T, r *Reaper, script string, files ...*os.File) *Process {
	t.Helper()
	if len(files) == 0 {
		files = []*os.File{nil, nil, nil}
	}
	p, err := r.Start(Spec{Path: "/bin/sh", Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/", Files: fds(files...)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func wait(t *testing.T, p *Process) Status {
	t.Helper()
	select {
	case <-p.Done():
		return p.Status()
	case <-time.After(20 * time.Second):
		t.Fatalf("process %d did not finish", p.Pid)
		return Status{}
	}
}

func TestExitCodesAndSignals(t *testing.T) {
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if st := wait(t, start(t, r, "exit 7")); st.ExitCode != 7 || st.Signal != 0 {
		t.Fatalf("exit 7: %+v", st)
	}
	if st := wait(t, start(t, r, "kill -TERM $$")); st.Signal != syscall.SIGTERM || st.ExitCode != 128+15 {
		t.Fatalf("SIGTERM: %+v", st)
	}
}

func TestKillGroupKillsTheTreeAndLeavesNoZombies(t *testing.T) {
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rd, wr, _ := os.Pipe()
	defer rd.Close()
	// A tree: the shell, two background sleeps and a nested shell with its own sleep.
	p := start(t, r, `sleep 100 & echo $!; sleep 100 & echo $!; sh -c 'sleep 100 & echo $!; wait' & wait`, nil, wr, nil)
	wr.Close()
	buf := make([]byte, 256)
	var pids []int
	deadline := time.Now().Add(10 * time.Second)
	var out string
	for len(pids) < 3 && time.Now().Before(deadline) {
		n, _ := rd.Read(buf)
		out += string(buf[:n])
		pids = pids[:0]
		for _, f := range strings.Fields(out) {
			n, _ := strconv.Atoi(f)
			pids = append(pids, n)
		}
	}
	if len(pids) < 3 {
		t.Fatalf("tree did not start: %q", out)
	}
	p.KillGroup()
	if st := wait(t, p); st.Signal != syscall.SIGKILL {
		t.Fatalf("leader status %+v", st)
	}
	for _, pid := range pids {
		deadline := time.Now().Add(5 * time.Second)
		for procstat.Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if procstat.Alive(pid) {
			t.Errorf("descendant %d survived", pid)
		}
	}
	// Orphans were reparented to us and must be reaped, not left as zombies.
	deadline = time.Now().Add(5 * time.Second)
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.ECHILD {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("children remain unreaped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// After the reap KillGroup must not signal anything (the id may be reused).
	p.KillGroup()
}

func TestLeaderExitKillsBackgroundMembers(t *testing.T) {
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rd, wr, _ := os.Pipe()
	defer rd.Close()
	p := start(t, r, `sleep 100 & echo $!`, nil, wr, nil)
	wr.Close()
	if st := wait(t, p); st.ExitCode != 0 {
		t.Fatalf("leader %+v", st)
	}
	buf := make([]byte, 64)
	n, _ := rd.Read(buf)
	bg, _ := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	deadline := time.Now().Add(5 * time.Second)
	for procstat.Alive(bg) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if procstat.Alive(bg) {
		t.Fatalf("background member %d outlived its leader", bg)
	}
}

func TestConcurrentStarts(t *testing.T) {
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			p, err := r.Start(Spec{Path: "/bin/sh", Argv: []string{"sh", "-c", "exit " + strconv.Itoa(i%5)}, Files: []int{-1, -1, -1}})
			if err != nil {
				t.Error(err)
				return
			}
			<-p.Done()
			if got := p.Status().ExitCode; got != i%5 {
				t.Errorf("process %d exit %d, want %d", i, got, i%5)
			}
		})
	}
	wg.Wait()
}

func TestStartFailure(t *testing.T) {
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Start(Spec{Path: "/nonexistent/bin", Argv: []string{"x"}, Files: []int{-1, -1, -1}}); err == nil {
		t.Fatal("started a missing binary")
	}
}

// A Spec with a User runs the command as that user through and through: every user and group
// id, no supplementary groups, no capabilities.
func TestStartAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out, err := os.CreateTemp("", "procs-user-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	script := `grep -E '^(Uid|Gid|Groups|CapEff|CapPrm):' /proc/self/status`
	p, err := r.Start(Spec{Path: "/bin/sh", Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/",
		Files: fds(nil, out, out), User: &User{UID: 65532, GID: 65531}})
	if err != nil {
		t.Fatal(err)
	}
	if st := wait(t, p); st.ExitCode != 0 {
		t.Fatalf("exit %d", st.ExitCode)
	}
	b, _ := os.ReadFile(out.Name())
	got := strings.Join(strings.Fields(string(b)), " ")
	want := "Uid: 65532 65532 65532 65532 Gid: 65531 65531 65531 65531 Groups: CapPrm: 0000000000000000 CapEff: 0000000000000000"
	if got != want {
		t.Errorf("the command's identity:\n%s\nwant\n%s", got, want)
	}
}

func TestSignal(t *testing.T) {
	r, err := NewReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := start(t, r, "exec sleep 100")
	if err := p.Signal(syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, p); st.Signal != syscall.SIGTERM {
		t.Fatalf("after SIGTERM: %+v", st)
	}
	if err := p.Signal(syscall.SIGTERM, true); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("a signal after the reap: %v, want os.ErrProcessDone", err)
	}
}
