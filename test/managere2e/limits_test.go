package managere2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/test/testenv"
)

// The limits `fusebox local up` is given by its --sandbox-* flags are the ones its sandboxes
// get: the host cgroup's memory, CPU weight and pids files, and, seen from inside, the
// commands' task limit and the workspace's size.
func TestLocalUpLimitFlagsReachSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 5*time.Minute)
	mc := dialManager(t, e.Addr)
	p := e.startLocalUp(t, "manager", "--pool-size", "1", "--sandbox-cpus", "0.5", "--sandbox-memory", "768Mi",
		"--sandbox-pids", "300", "--sandbox-workspace", "200Mi")
	e.waitServing(t, p, mc)
	waitPoolSettled(t, ctx, mc, 1)
	ids := e.containers(t)
	if len(ids) != 1 {
		t.Fatalf("containers %v, want the one pool sandbox", ids)
	}
	// runsc puts each sandbox in the host cgroup /<container id> (cgroup v1 here).
	for _, c := range []struct{ controller, file, want string }{
		{"memory", "memory.limit_in_bytes", strconv.Itoa(768 << 20)},
		{"cpu", "cpu.shares", "512"},
		{"cpu", "cpu.cfs_quota_us", "-1"}, // a weight, no quota
		{"pids", "pids.max", strconv.Itoa(4*300 + 1024)},
	} {
		path := filepath.Join("/sys/fs/cgroup", c.controller, ids[0], c.file)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("reading the sandbox's cgroup: %v", err)
			continue
		}
		if got := strings.TrimSpace(string(b)); got != c.want {
			t.Errorf("%s = %s, want %s", path, got, c.want)
		}
	}
	code, stdout, stderr := runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--",
		"sh", "-c", "grep 'Max processes' /proc/self/limits; df -k /workspace | tail -1")
	if code != 0 {
		t.Fatalf("fusebox run: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("output %q, want the process limit's and df's lines", stdout)
	}
	if f := strings.Fields(lines[0]); len(f) < 4 || f[2] != "300" || f[3] != "300" {
		t.Errorf("process limit inside = %q, want 300 soft and hard (--sandbox-pids)", lines[0])
	}
	if f := strings.Fields(lines[1]); len(f) < 2 || f[1] != strconv.Itoa(200<<10) {
		t.Errorf("df -k /workspace inside = %q, want %d KiB (--sandbox-workspace)", lines[1], 200<<10)
	}
}

// Bad limit flags stop `fusebox local up` before it makes any sandbox, with an error that
// names the flag.
func TestLocalUpRefusesBadLimitFlags(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 2*time.Minute)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sandbox-memory", "lots"}, `invalid argument "lots" for "--sandbox-memory"`},
		{[]string{"--sandbox-pids", "2"}, "--sandbox-pids 2 is below 16"},
		{[]string{"--sandbox-workspace", "1Gi"}, "raise --sandbox-memory or lower --sandbox-workspace"},
	} {
		args := append([]string{"local", "up", "--state-dir", e.StateDir, "--listen", e.Addr,
			"--runsc", e.Runsc, "--sandbox-binary", e.Sandbox}, tc.args...)
		code, stdout, stderr := runFusebox(t, ctx, args...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("fusebox local up %q: exit %d, stdout %q, stderr %q; want an error containing %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
	if ids := e.containers(t); len(ids) != 0 {
		t.Errorf("containers %v after refused starts, want none", ids)
	}
}
