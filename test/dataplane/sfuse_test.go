package dataplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// dial connects to the data plane pinning sandboxKey and presenting key.
func dial(t testing.TB, addr string, sandboxKey []byte, key *client.Key) *client.Sandbox {
	t.Helper()
	c, err := client.Dial(addr, sandboxKey, key)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// execMarker runs a command creating /workspace/<marker> through c and returns its error.
func execMarker(ctx context.Context, c *client.Sandbox, marker string) error {
	res, err := c.Exec(ctx, client.Command{Script: "touch /workspace/" + marker})
	if err == nil && res.ExitCode != 0 {
		return errors.New("the marker command ran but failed")
	}
	return err
}

// wantNoMarker asserts, through the trusted client, that a rejected command never ran.
func wantNoMarker(t testing.TB, ctx context.Context, good *client.Sandbox, marker string) {
	t.Helper()
	_, err := good.Stat(ctx, marker, false)
	if codeOf(err) != codes.NotFound {
		t.Errorf("marker %s: Stat = %v, want NotFound: a rejected client's command ran", marker, err)
	}
}

func TestInitializeTLSRejectsMalformedKeysWithoutBlowingFuse(t *testing.T) {
	sb := sandboxtest.Start(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384DER, err := x509.MarshalPKIXPublicKey(&p384.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	good := sandboxtest.NewKey(t).PublicKey()
	garbage := make([]byte, 91)
	rand.Read(garbage)

	tests := []struct {
		name string
		key  []byte
	}{
		{"empty", nil},
		{"garbage", garbage},
		{"RSA-2048", rsaDER},
		{"ECDSA-P384", p384DER},
		{"truncated P-256", good[:len(good)-1]},
		{"P-256 with trailing bytes", append(append([]byte(nil), good...), 0)},
		{"oversized", make([]byte, 64<<10-100)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: tc.key})
			wantCode(t, "InitializeTLS with a malformed key", err, codes.InvalidArgument)
			sandboxtest.ServesNothing(t, socketPath(sb.DataAddr)) // the gate stays shut
		})
	}

	// The fuse is intact: a valid initialisation still succeeds and serves the data plane.
	key := sandboxtest.NewKey(t)
	fused, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("valid InitializeTLS after malformed ones: %v", err)
	}
	c := dial(t, sb.DataAddr, fused.SandboxKey, key)
	if out := sandboxtest.Sh(t, ctx, c, "echo ok"); out != "ok\n" {
		t.Fatalf("exec after init: stdout %q", out)
	}
}

func TestInitializeTLSSecondCallRefusedAndPinUnchanged(t *testing.T) {
	sb := sandboxtest.Start(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	first, second := sandboxtest.NewKey(t), sandboxtest.NewKey(t)

	fused, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: first.PublicKey()})
	if err != nil {
		t.Fatalf("first InitializeTLS: %v", err)
	}
	// The init listener was closed before the answer was written: the socket is gone now.
	if _, err := os.Lstat(socketPath(sb.InitAddr)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("init socket after InitializeTLS answered: %v, want it removed", err)
	}
	_, err = sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: second.PublicKey()})
	wantCode(t, "InitializeTLS after the init socket is gone", err, codes.Unavailable)

	good := dial(t, sb.DataAddr, fused.SandboxKey, first)
	if err := execMarker(ctx, good, "first-agent"); err != nil {
		t.Fatalf("the first agent can no longer exec: %v", err)
	}
	intruder := dial(t, sb.DataAddr, fused.SandboxKey, second)
	if err := execMarker(ctx, intruder, "second-agent"); err == nil {
		t.Fatal("a client with the second agent's key could exec: the pin was changed")
	}
	wantNoMarker(t, ctx, good, "second-agent")
}

func TestInitializeTLSConcurrentExactlyOneWins(t *testing.T) {
	sb := sandboxtest.Start(t, sandboxtest.Options{})
	ctx := testenv.Context(t, 2*time.Minute)
	const n = 10
	keys := make([]*client.Key, n)
	for i := range keys {
		keys[i] = sandboxtest.NewKey(t)
	}
	pubs := make([]sfuse.Result, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			pubs[i], errs[i] = sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: keys[i].PublicKey()})
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	seen := map[codes.Code]int{}
	for _, err := range errs {
		seen[codeOf(err)]++
	}
	t.Logf("outcomes of %d concurrent InitializeTLS calls: %v", n, seen)
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("InitializeTLS succeeded for both key %d and key %d", winner, i)
			}
			winner = i
			continue
		}
		wantCode(t, "losing InitializeTLS", err, codes.FailedPrecondition, codes.Unavailable)
	}
	if winner < 0 {
		t.Fatalf("no InitializeTLS succeeded: %v", errs)
	}
	good := dial(t, sb.DataAddr, pubs[winner].SandboxKey, keys[winner])
	if err := execMarker(ctx, good, "winner"); err != nil {
		t.Fatalf("the winning key cannot exec: %v", err)
	}
	for i := range n {
		if i == winner {
			continue
		}
		c := dial(t, sb.DataAddr, pubs[winner].SandboxKey, keys[i])
		marker := "loser-" + string(rune('a'+i))
		if err := execMarker(ctx, c, marker); err == nil {
			t.Errorf("losing key %d can exec", i)
		}
		wantNoMarker(t, ctx, good, marker)
	}
}

func TestDataSocketServesNothingBeforeInit(t *testing.T) {
	sb := sandboxtest.Start(t, sandboxtest.Options{})
	// The data socket is bound before the sandbox joins the pool (binding costs a round trip
	// to the host under gVisor), but until the fuse blows every connection is closed unserved:
	// no TLS handshake, no byte back.
	for range 3 {
		sandboxtest.ServesNothing(t, socketPath(sb.DataAddr))
	}
	// A client with a key is refused too, and after that the sandbox still initialises.
	key, _ := client.NewKey()
	other, _ := client.NewKey()
	early, err := client.Dial(sb.DataAddr, other.PublicKey(), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := early.Stat(ctx, ".", false); err == nil {
		t.Fatal("a data-plane call before init succeeded")
	}
	early.Close()
	fused, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("init after refused early connections: %v", err)
	}
	good := dial(t, sb.DataAddr, fused.SandboxKey, key)
	if _, err := good.Stat(ctx, ".", false); err != nil {
		t.Fatalf("data plane after init: %v", err)
	}
}

// waitSocketGone waits until the socket file at p is removed. The server closes the init
// listener after the InitializeTLS response is on its way, so the unlink follows the call.
func waitSocketGone(t testing.TB, p string) {
	t.Helper()
	sandboxtest.Eventually(t, 30*time.Second, "init socket "+p+" removed", func() (bool, string) {
		_, err := os.Lstat(p)
		return errors.Is(err, fs.ErrNotExist), "lstat: " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

func TestInitSocketRemovedAfterInit(t *testing.T) {
	b := sandboxtest.StartBound(t, sandboxtest.Options{})
	ctx := testenv.Context(t, time.Minute)
	initPath := socketPath(b.InitAddr)
	waitSocketGone(t, initPath)
	if c, err := net.Dial("unix", initPath); err == nil {
		c.Close()
		t.Fatal("connected to the init socket after init")
	}
	// Inside the sandbox too, only the data socket is left.
	if got := lsA(t, ctx, b.Client, "/run/fusebox"); strings.Join(got, " ") != "data.sock" {
		t.Errorf("/run/fusebox after init holds %q, want only data.sock", got)
	}
}

func TestUninitialisedSandboxExitsAfterIdleTTL(t *testing.T) {
	// sandboxtest.Start keeps its runsc.Runtime to itself; start the sandbox by hand to be
	// able to ask runsc about the container.
	rt := runsctest.Runtime(t)
	id := runsc.ID("idle", 1)
	ctx := testenv.Context(t, 2*time.Minute)
	sb, err := localsandbox.Start(ctx, localsandbox.Options{
		Runtime:       rt,
		ID:            id,
		Dir:           filepath.Join(t.TempDir(), "sandbox"),
		SandboxBinary: sandboxtest.SandboxBinary(t),
		ServerArgs:    []string{"-idle-ttl=1s"},
		Bundle:        runsc.BundleSpec{EtcDir: sandboxtest.EtcDir(t), MemoryLimitBytes: 2 << 30},
	})
	if err != nil {
		t.Fatalf("starting sandbox: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroying sandbox: %v", err)
		}
	})
	sandboxtest.Eventually(t, time.Minute, "uninitialised sandbox stopped", func() (bool, string) {
		st, err := rt.State(ctx, id)
		if errors.Is(err, runsc.ErrNotFound) {
			return true, ""
		}
		if err != nil {
			t.Fatalf("runsc state: %v", err)
		}
		return st.Status == runsc.StatusStopped, "status " + string(st.Status)
	})
	if log := sb.Log(); !strings.Contains(log, "nobody initialised") {
		t.Errorf("server log does not say why it exited:\n%s", log)
	}
	// And it can no longer be initialised.
	_, err = sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: sandboxtest.NewKey(t).PublicKey()})
	wantCode(t, "InitializeTLS after the idle TTL", err, codes.Unavailable)
}
