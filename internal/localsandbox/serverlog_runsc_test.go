package localsandbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// noisyBinary builds testdata/noisy (static) for the sandbox.
func noisyBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "noisy")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/noisy")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building testdata/noisy: %v\n%s", err, out)
	}
	return bin
}

func sizeOf(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// A sandbox whose server writes far more than the limit to its standard error leaves host
// files no larger than the limit (the current one and the rotated one), ending with its last
// line.
func TestServerLogOnTheHostIsCapped(t *testing.T) {
	const noise = 8 << 20
	sb := sandboxtest.Start(t, sandboxtest.Options{SandboxBinary: noisyBinary(t), ServerArgs: []string{"-noise=" + strconv.Itoa(noise)}})
	// The server writes its noise before it listens: it has all gone through by now.
	m := regexp.MustCompile(`noise done: wrote (\d+) bytes\n$`).FindStringSubmatch(sb.Log())
	if m == nil {
		t.Fatalf("the log does not end with the server's last line")
	}
	if n, _ := strconv.Atoi(m[1]); n < noise {
		t.Fatalf("the server wrote only %d bytes of noise", n)
	}
	for _, name := range []string{localsandbox.LogName, localsandbox.LogName + ".1"} {
		if n := sizeOf(filepath.Join(sb.Dir, name)); n > localsandbox.DefaultLogLimit {
			t.Errorf("%s is %d bytes after %d bytes of noise, over the limit %d", name, n, noise, localsandbox.DefaultLogLimit)
		}
	}
}

// With nothing reading its log (the manager that started it ended), the sandbox server keeps
// serving: its writes to standard error fail, neither blocking nor killing it, and the host
// file does not grow.
func TestServerOutlivesItsLogReader(t *testing.T) {
	sb := sandboxtest.Start(t, sandboxtest.Options{})
	before := sb.Log()
	localsandbox.StopLogReader(sb)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := sandboxtest.NewKey(t)
	res, err := sfuse.Initialize(ctx, sb.InitAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("sFuse: %v", err)
	}
	c, err := client.Dial(sb.DataAddr, res.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first call makes the server log its allocation's timeline: a write to its standard
	// error, now without a reader.
	for i := range 5 {
		if out := sandboxtest.Sh(t, ctx, c, "echo "+strconv.Itoa(i)); out != strconv.Itoa(i)+"\n" {
			t.Fatalf("exec %d: %q", i, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The server is spared SIGPIPE's default action; its commands are not (a shell started
	// with SIGPIPE ignored cannot undo it, and would survive this).
	if out := sandboxtest.Sh(t, ctx, c, `sh -c 'kill -PIPE $$; echo survived'; echo "status $?"`); out != "status 141\n" {
		t.Errorf("a command's shell sent itself SIGPIPE: %q, want it killed (status 141)", out)
	}
	if after := sb.Log(); after != before {
		t.Errorf("the log changed after its reader ended: %q, was %q", after, before)
	}
}
