// Package managere2e tests the container manager end to end against the pinned gVisor runsc:
// the daemon in-process and the `fusebox` CLI as a subprocess, driven through the real
// Manager gRPC API, the Go client and the data plane. Every network address these tests use
// is a unix socket or 127.0.0.1.
package managere2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/syncbuf"
	"github.com/fusebox-dev/fusebox/manager/daemon"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// Deadlines for polling. They only keep a broken manager from hanging the test binary; no
// test asserts on how long anything takes.
const (
	pollDeadline = 2 * time.Minute
	testDeadline = 5 * time.Minute
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cliDir != "" {
		os.RemoveAll(cliDir)
	}
	os.Exit(code)
}

// wantCode fails the test unless err carries one of the gRPC codes want.
func wantCode(t testing.TB, what string, err error, want ...codes.Code) {
	t.Helper()
	if got := status.Code(err); !slices.Contains(want, got) {
		t.Errorf("%s: got code %v (err %v), want %v", what, got, err, want)
	}
}

// env is one manager's state directory and socket, with the runsc runtime that sees its
// containers. Its cleanup (registered first, so it runs last) removes whatever a failing
// test left: containers, process-runtime sandboxes, runsc's null-netns mount, the files.
type env struct {
	base     string
	StateDir string
	Addr     string // unix:///... of the manager
	Socket   string // host path of the manager's socket
	RT       *runsc.Runtime
	Runsc    string
	Sandbox  string // the fusebox-sandbox binary
}

func newEnv(t *testing.T) *env {
	t.Helper()
	bin := runsctest.Binary(t)
	sb := sandboxtest.SandboxBinary(t)
	// Short paths: a sandbox's socket path must fit sun_path (108 bytes).
	base, err := os.MkdirTemp("", "fbxe2e-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{base: base, StateDir: filepath.Join(base, "state"), Socket: filepath.Join(base, "run", "manager.sock"),
		Runsc: bin, Sandbox: sb}
	e.Addr = "unix://" + e.Socket
	e.RT = &runsc.Runtime{Binary: bin, Root: filepath.Join(e.StateDir, "runsc")}
	t.Cleanup(func() { e.forceClean(t) })
	return e
}

// forceClean removes every container under the state directory, kills process-runtime
// sandboxes, releases runsc's root and removes the files.
func (e *env) forceClean(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A manager the test killed may have left a runsc create running, which records its
	// container only after this would have listed them: wait for it (and kill what a cut-off
	// one left unrecorded) first.
	killed, err := e.RT.KillOrphans(ctx, time.Minute)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, p := range killed {
		t.Logf("cleanup: killed runsc %s process %d, which runsc does not record", p.Command, p.Pid)
	}
	if states, err := e.RT.List(ctx); err == nil {
		for _, s := range states {
			t.Logf("cleanup: removing leftover container %s (%s)", s.ID, s.Status)
			if err := e.RT.Remove(ctx, s.ID); err != nil {
				t.Errorf("cleanup: deleting container %s: %v", s.ID, err)
			}
		}
	}
	pids, _ := filepath.Glob(filepath.Join(e.StateDir, "sandboxes", "*", "pid"))
	for _, p := range pids {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == filepath.Base(e.Sandbox) {
			t.Logf("cleanup: killing leftover process sandbox %d", pid)
			syscall.Kill(-pid, syscall.SIGKILL)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if err := e.RT.ReleaseRoot(); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if err := os.RemoveAll(e.base); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// containers returns the ids of the containers runsc lists under the state directory.
func (e *env) containers(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	states, err := e.RT.List(ctx)
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	var ids []string
	for _, s := range states {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids
}

// mountsUnder returns the mount points under the state directory (/proc/self/mountinfo).
func (e *env) mountsUnder(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mount-point ...
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], e.StateDir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// sandboxDirs returns the names under <state>/sandboxes.
func (e *env) sandboxDirs(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.StateDir, "sandboxes"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range entries {
		names = append(names, d.Name())
	}
	slices.Sort(names)
	return names
}

// unitGone reports whether neither a container nor a state directory of id remains.
func (e *env) unitGone(t testing.TB, id string) (bool, string) {
	t.Helper()
	c, d := slices.Contains(e.containers(t), id), slices.Contains(e.sandboxDirs(t), id)
	return !c && !d, fmt.Sprintf("container listed: %v, state directory present: %v", c, d)
}

// waitUnitGone waits until unit id has neither container nor state directory.
func (e *env) waitUnitGone(t testing.TB, id string) {
	t.Helper()
	sandboxtest.Eventually(t, pollDeadline, "sandbox "+id+" destroyed", func() (bool, string) { return e.unitGone(t, id) })
}

// daemonOpts adjust an in-process manager.
type daemonOpts struct {
	PoolSize int
	LeaseTTL time.Duration
	PoolPing time.Duration
	// KeepAwake is daemon.Config.KeepSandboxesAwake.
	KeepAwake bool
	// FastPath is daemon.Config.FastPath (nil: every accelerator).
	FastPath *fastpath.Switches
	// ListenGroup is daemon.Config.Auth.ListenGroup.
	ListenGroup string
}

// manager is an in-process daemon.Run.
type manager struct {
	Log  *syncbuf.Buffer
	stop context.CancelFunc
	done chan error
}

// startDaemon runs daemon.Run in a goroutine (runsc allocator, fixed estimator) until the
// test ends, and returns once it serves.
func (e *env) startDaemon(t *testing.T, o daemonOpts) *manager {
	t.Helper()
	log := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	m := &manager{Log: log, stop: cancel, done: make(chan error, 1)}
	cfg := daemon.Config{Listen: e.Addr, Allocator: "runsc", StateDir: e.StateDir, Runsc: e.Runsc,
		SandboxBinary: e.Sandbox, Estimator: "fixed", PoolSize: o.PoolSize, LeaseTTL: o.LeaseTTL, PoolPing: o.PoolPing,
		KeepSandboxesAwake: o.KeepAwake, FastPath: o.FastPath, Auth: daemon.AuthConfig{ListenGroup: o.ListenGroup},
		Ready: func(addr string) { ready <- addr }}
	go func() {
		m.done <- daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}()
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Errorf("daemon.Run: %v", err)
		}
		if t.Failed() {
			t.Logf("manager log:\n%s", log)
		}
	})
	select {
	case <-ready:
	case err := <-m.done:
		m.done <- err
		t.Fatalf("daemon.Run returned before serving: %v\n%s", err, log)
	case <-time.After(pollDeadline):
		t.Fatalf("daemon did not serve within %v\n%s", pollDeadline, log)
	}
	return m
}

// Stop ends daemon.Run and returns its error. It is idempotent.
func (m *manager) Stop() error {
	m.stop()
	select {
	case err := <-m.done:
		m.done <- err
		return err
	case <-time.After(2 * time.Minute):
		return errors.New("daemon.Run did not return within 2 minutes of its context ending")
	}
}

// dialConn returns a plaintext connection to the manager's unix socket at addr, closed when
// the test ends.
func dialConn(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(addr, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dialManager returns a raw Manager client for addr, closed when the test ends.
func dialManager(t testing.TB, addr string) managerv1.ManagerClient {
	t.Helper()
	return managerv1.NewManagerClient(dialConn(t, addr))
}

// rawAllocate allocates through the raw API (no background renewal) and dials the data
// plane with key. The returned sandbox connection is closed when the test ends.
func rawAllocate(t testing.TB, ctx context.Context, mc managerv1.ManagerClient, key *client.Key, ttl time.Duration, egress ...string) (*managerv1.AllocateResponse, *client.Sandbox) {
	t.Helper()
	req := &managerv1.AllocateRequest{AgentPublicKey: key.PublicKey(), Egress: egress}
	if ttl > 0 {
		req.LeaseTtl = durationpb.New(ttl)
	}
	resp, err := mc.Allocate(ctx, req)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	sb, err := client.Dial(resp.GetEndpoint(), resp.GetSandboxPublicKey(), key)
	if err != nil {
		t.Fatalf("dialing %s: %v", resp.GetEndpoint(), err)
	}
	t.Cleanup(func() { sb.Close() })
	return resp, sb
}

// list returns the manager's units by id.
func list(t testing.TB, ctx context.Context, mc managerv1.ManagerClient) map[string]*managerv1.Sandbox {
	t.Helper()
	resp, err := mc.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	out := map[string]*managerv1.Sandbox{}
	for _, s := range resp.GetSandboxes() {
		out[s.GetSandboxId()] = s
	}
	return out
}

// idsIn returns the ids of the units in state st, sorted.
func idsIn(units map[string]*managerv1.Sandbox, st managerv1.UnitState) []string {
	var ids []string
	for id, s := range units {
		if s.GetState() == st {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// waitPoolSettled waits until the manager holds exactly ready Ready units and no unit is
// being created, initialised or destroyed, and returns its units.
func waitPoolSettled(t testing.TB, ctx context.Context, mc managerv1.ManagerClient, ready int) map[string]*managerv1.Sandbox {
	t.Helper()
	var units map[string]*managerv1.Sandbox
	sandboxtest.Eventually(t, pollDeadline, fmt.Sprintf("pool settled at %d ready", ready), func() (bool, string) {
		units = list(t, ctx, mc)
		counts := map[string]int{}
		for _, s := range units {
			counts[s.GetState().String()]++
		}
		busy := counts["UNIT_STATE_CREATING"] + counts["UNIT_STATE_INITIALISING"] + counts["UNIT_STATE_DESTROYING"]
		return counts["UNIT_STATE_READY"] == ready && busy == 0, fmt.Sprint(counts)
	})
	return units
}

// cliDir holds the fusebox CLI built for this test binary.
var (
	cliOnce sync.Once
	cliDir  string
	cliPath string
	cliErr  error
)

// fuseboxCLI returns the fusebox CLI the tests run (imagetest.FuseboxCLI: $FUSEBOX_BIN, or
// built once per test binary).
func fuseboxCLI(t testing.TB) string {
	t.Helper()
	cliOnce.Do(func() {
		if cliDir, cliErr = os.MkdirTemp("", "fusebox-cli-"); cliErr == nil {
			cliPath, cliErr = imagetest.FuseboxCLI(cliDir)
		}
	})
	if cliErr != nil {
		t.Fatalf("the fusebox CLI: %v", cliErr)
	}
	return cliPath
}

// proc is a `fusebox local up` subprocess. Its output goes to a file, not a pipe, so that
// waiting for it never depends on what its children hold open.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // set before done is closed
}

// startLocalUp starts `fusebox local up` with the env's state directory and socket plus
// extra flags. A cleanup kills it if it still runs when the test ends.
func (e *env) startLocalUp(t *testing.T, name string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"local", "up", "--state-dir", e.StateDir, "--listen", e.Addr,
		"--runsc", e.Runsc, "--sandbox-binary", e.Sandbox}, extra...)
	p := &proc{logPath: filepath.Join(e.base, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(fuseboxCLI(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// The manager dies with the test binary even if a cleanup never runs.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting fusebox local up: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.exited() {
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.log())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(pollDeadline):
		t.Fatalf("fusebox local up did not exit within %v\n%s", pollDeadline, p.log())
	}
	return p.cmd.ProcessState.ExitCode()
}

// signal sends sig and waits for the process to exit; it returns the exit code (-1 when
// killed by a signal).
func (p *proc) signal(t testing.TB, sig syscall.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling the manager: %v", err)
	}
	return p.wait(t)
}

// waitServing waits until the manager at e.Addr answers PoolStatus, failing early if p exits.
func (e *env) waitServing(t testing.TB, p *proc, mc managerv1.ManagerClient) {
	t.Helper()
	sandboxtest.Eventually(t, pollDeadline, "manager serving", func() (bool, string) {
		if p.exited() {
			t.Fatalf("fusebox local up exited (%v) before serving:\n%s", p.err, p.log())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := mc.PoolStatus(ctx, &managerv1.PoolStatusRequest{})
		return err == nil, fmt.Sprint(err)
	})
}

// serverEnv returns the environment unit id's sandbox server was started with (its bundle's
// process.env).
func (e *env) serverEnv(t testing.TB, id string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.StateDir, "sandboxes", id, "bundle", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Process struct {
			Env []string `json:"env"`
		} `json:"process"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("parsing %s's bundle: %v", id, err)
	}
	return spec.Process.Env
}

// fastUse records, through an allocation's trace hooks, how many times the hook for the data
// connection ran.
type fastUse struct {
	connected atomic.Int32
}

func (u *fastUse) trace() *client.AllocateTrace {
	return &client.AllocateTrace{
		Connected: func(time.Time) { u.connected.Add(1) },
	}
}
