// Package sandboxtest starts real fusebox sandboxes under the pinned gVisor runsc for
// integration tests: it builds the static fusebox-sandbox binary once per test binary, starts
// a sandbox with its workspace in gVisor's own memory, and removes everything when the test
// ends. It also holds what those tests do as the agent: make a key, run a script that must
// succeed.
package sandboxtest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

var (
	buildMu sync.Mutex
	built   = map[string]*build{} // by command name
	etcOnce sync.Once
	etcDir  string
	etcErr  error
	next    atomic.Uint64
)

// build is one static build of a command of cmd/.
type build struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// SandboxBinary builds cmd/fusebox-sandbox (static) once per test binary and returns its path.
func SandboxBinary(t testing.TB) string {
	t.Helper()
	return StaticBinary(t, "fusebox-sandbox")
}

// StaticBinary builds cmd/NAME (static, CGO_ENABLED=0) once per test binary and returns its
// path.
func StaticBinary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	b := built[name]
	if b == nil {
		b = &build{}
		built[name] = b
	}
	buildMu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", name+"-bin-")
		if err == nil {
			// Searchable by every user: a sandbox may run it as another one (its commands').
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-trimpath", "-o", b.path, "./cmd/"+name)
		cmd.Dir = testenv.ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("building %s: %v\n%s", name, b.err, b.out)
	}
	return b.path
}

// EtcDir returns a sanitised /etc shared by the sandboxes of this test binary.
func EtcDir(t testing.TB) string {
	t.Helper()
	etcOnce.Do(func() {
		var dir string
		if dir, etcErr = os.MkdirTemp("", "fusebox-etc-"); etcErr == nil {
			etcDir = filepath.Join(dir, "etc")
			etcErr = runsc.WriteSanitizedEtc(etcDir)
		}
	})
	if etcErr != nil {
		t.Fatalf("writing sanitised /etc: %v", etcErr)
	}
	return etcDir
}

// Options adjust a test sandbox.
type Options struct {
	ServerArgs []string
	Bundle     runsc.BundleSpec
	// Egress is the allowlist StartBound's InitializeTLS carries (what the manager sends for
	// the allocation): the sandbox's relay starts only with a non-empty one.
	Egress []string
	// SandboxBinary, if set, is the fusebox-sandbox to bind in instead of the one
	// SandboxBinary builds.
	SandboxBinary string
}

// Start starts an uninitialised sandbox and removes it when the test ends.
func Start(t testing.TB, o Options) *localsandbox.Sandbox {
	t.Helper()
	rt := runsctest.Runtime(t)
	spec := o.Bundle
	if spec.EtcDir == "" && spec.RootFS == "" {
		spec.EtcDir = EtcDir(t)
	}
	if spec.MemoryLimitBytes == 0 {
		spec.MemoryLimitBytes = 2 << 30
	}
	// Built (or found built) before the start's minute begins: on a busy machine the build
	// alone can take longer.
	bin := o.SandboxBinary
	if bin == "" {
		bin = SandboxBinary(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := localsandbox.Start(ctx, localsandbox.Options{
		Runtime:       rt,
		ID:            runsc.ID("t", next.Add(1)),
		Dir:           filepath.Join(t.TempDir(), "sandbox"),
		SandboxBinary: bin,
		ServerArgs:    o.ServerArgs,
		Bundle:        spec,
	})
	if err != nil {
		t.Fatalf("starting sandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sb.Destroy(ctx); err != nil {
			t.Errorf("destroying sandbox: %v", err)
		}
		if t.Failed() {
			t.Logf("sandbox server log:\n%s", sb.Log())
		}
	})
	return sb
}

// Bound is an initialised sandbox and a client connected to it.
type Bound struct {
	*localsandbox.Sandbox
	Client     *client.Sandbox
	Key        *client.Key
	SandboxKey []byte
}

// StartBound starts a sandbox, performs sFuse with a fresh agent key and dials the data plane.
func StartBound(t testing.TB, o Options) *Bound {
	t.Helper()
	sb := Start(t, o)
	key := NewKey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: key.PublicKey(), Egress: o.Egress})
	if err != nil {
		t.Fatalf("sFuse: %v", err)
	}
	pub := res.SandboxKey
	c, err := client.Dial(sb.DataAddr, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &Bound{Sandbox: sb, Client: c, Key: key, SandboxKey: pub}
}

// ServesNothing checks that the data socket at path, bound before initialisation, serves
// nothing: each connection is closed without a byte read or written. It dials twice and
// checks that both connections are closed unserved.
func ServesNothing(t testing.TB, path string) {
	t.Helper()
	for range 2 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dialing the pre-bound data socket: %v", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("\x16\x03\x01\x00\x05hello")) // may fail: the server may have closed already
		n, err := c.Read(make([]byte, 64))
		if n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
			t.Fatalf("data socket before init: read %d bytes, %v; want the connection closed unserved", n, err)
		}
	}
}

// Eventually polls cond until it reports done, failing with cond's last explanation after
// deadline. It asserts that asynchronous effects happen (a pool refilling, a sandbox
// destroyed, a temp file discarded, a socket unlinked), never how fast.
func Eventually(t testing.TB, deadline time.Duration, what string, cond func() (done bool, why string)) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		done, why := cond()
		if done {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: still not true after %v: %s", what, deadline, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NewKey returns a fresh agent key.
func NewKey(t testing.TB) *client.Key {
	t.Helper()
	k, err := client.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Sh runs script through c; it must succeed. It returns the script's standard output.
func Sh(t testing.TB, ctx context.Context, c *client.Sandbox, script string) string {
	t.Helper()
	res, err := c.Exec(ctx, client.Command{Script: script})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d (signal %q)\nstdout: %s\nstderr: %s", script, res.ExitCode, res.Signal, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}
