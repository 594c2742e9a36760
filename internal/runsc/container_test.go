package runsc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/test/procstat"
)

// waitForFile returns the content of path once it is non-empty, failing the
// test after a generous deadline (this is not a timing assertion).
func waitForFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil && len(data) > 0 {
			return string(data)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear: %v", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// execOut runs argv in container id and returns its exit code and output.
func execOut(t *testing.T, rt *runsc.Runtime, id string, argv ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code, err := rt.Exec(t.Context(), id, argv, &out, &errOut)
	if err != nil {
		t.Fatalf("Exec %q: %v", argv, err)
	}
	return code, out.String(), errOut.String()
}

func TestContainer(t *testing.T) {
	outDir := t.TempDir()
	bundle := filepath.Join(t.TempDir(), "bundle")
	const memLimit = 512 << 20
	rt, id := runsctest.Start(t, runsc.BundleSpec{
		Dir:              bundle,
		Args:             []string{"/bin/sh", "-c", "uname -r > /run/out/kernel; sleep 30"},
		Mounts:           []runsc.Mount{{Source: outDir, Destination: "/run/out"}},
		MemoryLimitBytes: memLimit,
		CPUQuota:         1,
		PidsLimit:        256,
	})
	ctx := t.Context()

	var host syscall.Utsname
	if err := syscall.Uname(&host); err != nil {
		t.Fatal(err)
	}
	hostRelease := utsString(host.Release[:])

	t.Run("runs under gVisor", func(t *testing.T) {
		kernel := waitForFile(t, filepath.Join(outDir, "kernel"))
		if !strings.Contains(kernel, "gvisor") {
			t.Errorf("uname -r inside = %q, want gVisor's", kernel)
		}
		_, version, _ := execOut(t, rt, id, "cat", "/proc/version")
		if !strings.Contains(version, "gvisor") || strings.Contains(version, hostRelease) {
			t.Errorf("/proc/version = %q, want gVisor's, not the host's %q", version, hostRelease)
		}
	})

	t.Run("state and list", func(t *testing.T) {
		st, err := rt.State(ctx, id)
		if err != nil {
			t.Fatalf("State: %v", err)
		}
		if st.ID != id || st.Status != runsc.StatusRunning || st.Pid <= 0 || st.Bundle != bundle || st.Created.IsZero() {
			t.Errorf("State = %+v, want running with pid, bundle and creation time", st)
		}
		states, err := rt.List(ctx)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if !slices.ContainsFunc(states, func(s runsc.State) bool { return s.ID == id && s.Status == runsc.StatusRunning }) {
			t.Errorf("List = %+v, want %s running", states, id)
		}
	})

	t.Run("exec exit codes", func(t *testing.T) {
		if code, _, _ := execOut(t, rt, id, "sh", "-c", "exit 7"); code != 7 {
			t.Errorf("exit code = %d, want 7", code)
		}
		code, err := rt.Exec(ctx, id, []string{"/nonexistent"}, nil, nil)
		var ce *runsc.CommandError
		if !errors.As(err, &ce) {
			t.Errorf("Exec of a missing binary = %d, %v; want a CommandError", code, err)
		}
	})

	t.Run("exec leaving a child holding stdout", func(t *testing.T) {
		// Returns once sh exits (after pipeDrainTimeout), not after 30 s.
		code, out, _ := execOut(t, rt, id, "sh", "-c", "sleep 30 & echo done")
		if code != 0 || out != "done\n" {
			t.Errorf("exec = %d, %q; want 0, done", code, out)
		}
	})

	t.Run("host is not visible", func(t *testing.T) {
		if code, out, _ := execOut(t, rt, id, "ls", "-A", "/root"); code == 0 && out != "" {
			t.Errorf("ls /root succeeded with %q", out)
		}
		for _, p := range []string{"/work", "/home", "/var", "/root", "/.dockerenv"} {
			if code, _, _ := execOut(t, rt, id, "test", "-e", p); code == 0 {
				t.Errorf("%s exists inside the sandbox", p)
			}
		}
		if code, out, _ := execOut(t, rt, id, "cat", "/etc/shadow"); code == 0 || out != "" {
			t.Errorf("cat /etc/shadow = %d, %q; want a failure and no content", code, out)
		}
		if code, out, _ := execOut(t, rt, id, "cat", "/etc/passwd"); code != 0 || !strings.Contains(out, "root:") {
			t.Errorf("cat /etc/passwd = %d, %q; want the sanitised copy", code, out)
		}
		// /proc/net/dev: two header lines, then one line per interface.
		_, netdev, _ := execOut(t, rt, id, "cat", "/proc/net/dev")
		lines := strings.Split(strings.TrimSpace(netdev), "\n")
		if len(lines) != 3 || !strings.HasPrefix(strings.TrimSpace(lines[2]), "lo:") {
			t.Errorf("network interfaces:\n%s\nwant only lo", netdev)
		}
	})

	t.Run("filesystem", func(t *testing.T) {
		if code, out, errOut := execOut(t, rt, id, "sh", "-c", "echo hi > /workspace/f && cat /workspace/f && echo x > /tmp/x"); code != 0 || out != "hi\n" {
			t.Errorf("writing the workspace and /tmp: %d, %q, %q", code, out, errOut)
		}
		for _, p := range []string{"/usr/x", "/x", "/etc/x", "/bin/x"} {
			if code, _, _ := execOut(t, rt, id, "touch", p); code == 0 {
				t.Errorf("touch %s succeeded on the read-only root", p)
			}
		}
	})

	t.Run("privileges and limits", func(t *testing.T) {
		_, status, _ := execOut(t, rt, id, "cat", "/proc/self/status")
		// CAP_KILL (5), CAP_NET_BIND_SERVICE (10), CAP_AUDIT_WRITE (29).
		for _, want := range []string{"CapEff:\t0000000020000420", "CapBnd:\t0000000020000420", "NoNewPrivs:\t1"} {
			if !strings.Contains(status, want) {
				t.Errorf("/proc/self/status lacks %q:\n%s", want, status)
			}
		}
		_, meminfo, _ := execOut(t, rt, id, "head", "-1", "/proc/meminfo")
		if want := "524288 kB"; !strings.Contains(meminfo, want) {
			t.Errorf("meminfo %q, want MemTotal %s (the limit)", meminfo, want)
		}
		data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var s specs.Spec
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		if r := s.Linux.Resources; r == nil || r.Memory == nil || *r.Memory.Limit != memLimit {
			t.Errorf("config.json resources = %+v, want the memory limit", r)
		}
	})

	t.Run("delete", func(t *testing.T) {
		if err := rt.Delete(ctx, id, true); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := rt.State(ctx, id); !errors.Is(err, runsc.ErrNotFound) {
			t.Errorf("State after Delete = %v, want ErrNotFound", err)
		}
		if err := rt.Delete(ctx, id, true); err != nil {
			t.Errorf("second Delete = %v, want nil", err)
		}
		if err := rt.Delete(ctx, id, false); err != nil {
			t.Errorf("Delete without force of a missing container = %v, want nil", err)
		}
		states, err := rt.List(ctx)
		if err != nil || slices.ContainsFunc(states, func(s runsc.State) bool { return s.ID == id }) {
			t.Errorf("List after Delete = %+v, %v", states, err)
		}
		if err := rt.Start(ctx, id); !errors.Is(err, runsc.ErrNotFound) {
			t.Errorf("Start after Delete = %v, want ErrNotFound", err)
		}
		if err := rt.Kill(ctx, id, syscall.SIGKILL, false); !errors.Is(err, runsc.ErrNotFound) {
			t.Errorf("Kill after Delete = %v, want ErrNotFound", err)
		}
	})
}

// createSleepers creates (not starts) one container per id under rt, each running
// `sleep seconds` on a host-derived root with a sanitised /etc, removed when the test ends, and
// returns their bundle directories by id.
func createSleepers(t *testing.T, rt *runsc.Runtime, ids []string, seconds string) map[string]string {
	t.Helper()
	etc := filepath.Join(t.TempDir(), "etc")
	if err := runsc.WriteSanitizedEtc(etc); err != nil {
		t.Fatal(err)
	}
	bundles := map[string]string{}
	for _, id := range ids {
		dir := filepath.Join(t.TempDir(), "bundle")
		if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, EtcDir: etc, Args: []string{"/bin/sleep", seconds}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { runsctest.Remove(t, rt, id) })
		if err := rt.Create(t.Context(), id, dir); err != nil {
			t.Fatalf("Create %s: %v", id, err)
		}
		bundles[id] = dir
	}
	return bundles
}

// TestSeveralContainersOneRoot checks that containers under one root are
// addressed exactly, including ids that would be prefixes of each other if
// they were not fixed-width, and that the created status is reported.
func TestSeveralContainersOneRoot(t *testing.T) {
	rt := runsctest.Runtime(t)
	ctx := t.Context()
	ids := []string{runsc.ID("pool", 1), runsc.ID("pool", 10)}
	createSleepers(t, rt, ids, "30")
	for _, id := range ids {
		st, err := rt.State(ctx, id)
		if err != nil || st.ID != id || st.Status != runsc.StatusCreated {
			t.Errorf("State(%s) = %+v, %v; want it created", id, st, err)
		}
	}
	if err := rt.Start(ctx, ids[0]); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if st, _ := rt.State(ctx, ids[1]); st.Status != runsc.StatusCreated {
		t.Errorf("starting %s changed %s to %s", ids[0], ids[1], st.Status)
	}
	if err := rt.Kill(ctx, ids[0], syscall.SIGKILL, false); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := rt.State(ctx, ids[0])
		if err == nil && st.Status == runsc.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGKILL State = %+v, %v; want stopped", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rt.Delete(ctx, ids[0], false); err != nil {
		t.Errorf("Delete of a stopped container without force: %v", err)
	}
	states, err := rt.List(ctx)
	if err != nil || len(states) != 1 || states[0].ID != ids[1] {
		t.Errorf("List = %+v, %v; want only %s", states, err, ids[1])
	}
}

func TestCreateWithStdio(t *testing.T) {
	rt := runsctest.Runtime(t)
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, Args: []string{"/bin/sh", "-c", "echo out; echo err >&2; sleep 30"}}); err != nil {
		t.Fatal(err)
	}
	logs := t.TempDir()
	stdout, err := os.Create(filepath.Join(logs, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(logs, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	id := runsc.ID("stdio", 1)
	t.Cleanup(func() { runsctest.Remove(t, rt, id) })
	if err := rt.CreateWithStdio(t.Context(), id, dir, runsc.Stdio{Stdout: stdout, Stderr: stderr}); err != nil {
		t.Fatalf("CreateWithStdio: %v", err)
	}
	if err := rt.Start(t.Context(), id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if got := waitForFile(t, stdout.Name()); got != "out\n" {
		t.Errorf("stdout = %q", got)
	}
	if got := waitForFile(t, stderr.Name()); got != "err\n" {
		t.Errorf("stderr = %q", got)
	}
}

// utsString converts a NUL-terminated utsname field.
func utsString(f []int8) string {
	b := make([]byte, 0, len(f))
	for _, c := range f {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// TestKillOrphans checks that a sandbox whose container runsc no longer records (as a runsc
// create cut off before it wrote the container's state leaves it) is found and killed, with
// its gofer, and that a recorded container is left alone.
func TestKillOrphans(t *testing.T) {
	rt := runsctest.Runtime(t)
	ctx := t.Context()
	ids := []string{runsc.ID("orph", 1), runsc.ID("orph", 2)}
	bundles := createSleepers(t, rt, ids, "300")
	orphan := ids[1]
	pid, err := runsc.ReadSandboxPID(bundles[orphan])
	if err != nil {
		t.Fatal(err)
	}
	procs, err := rt.Processes()
	if err != nil {
		t.Fatal(err)
	}
	byCommand := map[string]int{}
	for _, p := range procs {
		if p.Bundle == bundles[orphan] {
			byCommand[p.Command]++
		}
	}
	if byCommand["boot"] != 1 || byCommand["gofer"] != 1 {
		t.Fatalf("Processes shows %v for %s's bundle, want one boot and one gofer (all: %+v)", byCommand, orphan, procs)
	}
	// Forget the container as a cut-off create would never have recorded it.
	if err := os.Remove(filepath.Join(rt.Root, orphan+"_sandbox:"+orphan+".state")); err != nil {
		t.Fatal(err)
	}
	if states, err := rt.List(ctx); err != nil || len(states) != 1 || states[0].ID != ids[0] {
		t.Fatalf("List = %+v, %v; want only %s", states, err, ids[0])
	}
	killed, err := rt.KillOrphans(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) != 2 {
		t.Errorf("KillOrphans killed %+v, want the orphan's sandbox and gofer", killed)
	}
	for _, p := range killed {
		if p.Bundle != bundles[orphan] {
			t.Errorf("KillOrphans killed %+v, not of the orphan %s", p, orphan)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil && procstat.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan's sandbox process %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st, err := rt.State(ctx, ids[0]); err != nil || st.Status != runsc.StatusCreated {
		t.Errorf("the recorded container: State = %+v, %v; want it still created", st, err)
	}
}
