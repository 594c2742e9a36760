package adversarial

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-dev/fusebox/client"
	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// jailSetup builds, through a command (commands may do anything inside the sandbox), a secret
// outside the workspace and links in it that lead out.
const jailSetup = `set -e
echo TOPSECRET > /tmp/fbx-secret
echo TOPSECRET > /tmp/f
cd /workspace
mkdir -p esc
ln -s /tmp esc/tmp
ln -s / esc/root
ln -s ../../tmp esc/up
ln -s ../esc2 esc/chain
ln -s /tmp esc2
ln -s /tmp/fbx-secret esc/secret
ln -s /proc/self/root esc/procroot
ln -s /proc/1/root esc/serverroot
echo victim > victim
`

// fileAttacks try to leave the workspace through the data plane's file API: lexical escapes,
// absolute paths, links out (symbolic and hard), /proc's roots, and links swapped between
// the check and the use.
func fileAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "files")
	ctx := g.ctx
	l := s.allocate(t, ctx)
	c, rpc := l.C, l.C.RPC()
	sandboxtest.Sh(t, ctx, c, jailSetup)
	tmpBefore := sandboxtest.Sh(t, ctx, c, "ls -A /tmp")
	data := []byte("pwned\n")

	// jailed judges an API call that must be refused (PermissionDenied or InvalidArgument)
	// and, when it returned data, must not have returned the secret.
	jailed := func(err error, got ...[]byte) verdict {
		for _, b := range got {
			if bytes.Contains(b, []byte("TOPSECRET")) {
				return escapedf("returned the secret: %q", b)
			}
		}
		if code := status.Code(err); code != codes.PermissionDenied && code != codes.InvalidArgument {
			return escapedf("got %v (%v), want PermissionDenied or InvalidArgument", code, err)
		}
		return refusedf("%v: %.160s", status.Code(err), status.Convert(err).Message())
	}
	write := func(p string) func() verdict {
		return func() verdict { return jailed(c.WriteFile(ctx, p, data, 0o644)) }
	}
	read := func(p string) func() verdict {
		return func() verdict { b, err := c.ReadFile(ctx, p); return jailed(err, b) }
	}
	readFiles := func(p string) func() verdict {
		return func() verdict {
			files, _, err := c.ReadFiles(ctx, p)
			var all [][]byte
			for _, b := range files {
				all = append(all, b)
			}
			return jailed(err, all...)
		}
	}
	stat := func(p string, follow bool) func() verdict {
		return func() verdict { _, err := c.Stat(ctx, p, follow); return jailed(err) }
	}
	for _, a := range []struct {
		name string
		do   func() verdict
	}{
		{"write ../pwned", write("../pwned")},
		{"write a/../../tmp/pwned", write("a/../../tmp/pwned")},
		{"write /tmp/pwned", write("/tmp/pwned")},
		{"write /workspace/../tmp/pwned", write("/workspace/../tmp/pwned")},
		{"write /workspace-pwned", write("/workspace-pwned")},
		{"write /proc/self/root/tmp/pwned", write("/proc/self/root/tmp/pwned")},
		{"write /proc/1/root/tmp/pwned", write("/proc/1/root/tmp/pwned")},
		{"write through a link to /tmp", write("esc/tmp/pwned")},
		{"write through a link to /", write("esc/root/tmp/pwned")},
		{"write through a relative link out", write("esc/up/pwned")},
		{"write through a chain of links", write("esc/chain/pwned")},
		{"write through a link to /proc/self/root", write("esc/procroot/tmp/pwned")},
		{"write through a link to the server's root", write("esc/serverroot/tmp/pwned")},
		{"write a path with a NUL byte", write("pw\x00ned")},
		{"stream through a link to /tmp", func() verdict {
			_, err := c.WriteFileFrom(ctx, "esc/tmp/pwned-stream", 0o644, bytes.NewReader(data), int64(len(data)))
			return jailed(err)
		}},
		{"read ../../etc/passwd", read("../../etc/passwd")},
		{"read /tmp/fbx-secret", read("/tmp/fbx-secret")},
		{"read /proc/self/root/tmp/fbx-secret", read("/proc/self/root/tmp/fbx-secret")},
		{"read a link to the secret", read("esc/secret")},
		{"read through a link to /tmp", read("esc/tmp/fbx-secret")},
		{"read through a chain of links", read("esc/chain/fbx-secret")},
		{"read through a link to /proc/self/root", read("esc/procroot/tmp/fbx-secret")},
		{"read through a link to the server's root", read("esc/serverroot/tmp/fbx-secret")},
		{"ReadFiles a glob through a link", readFiles("esc/tmp/*")},
		{"ReadFiles ** through a chain", readFiles("esc/chain/**")},
		{"ReadFiles /etc/passwd", readFiles("/etc/passwd")},
		{"stat following a link out", stat("esc/tmp", true)},
		{"stat through a link out", stat("esc/tmp/fbx-secret", false)},
		{"list through a link to /", func() verdict { _, err := c.List(ctx, "esc/root", true, 2); return jailed(err) }},
		{"list ..", func() verdict { _, err := c.List(ctx, "..", false, 0); return jailed(err) }},
		{"find through a link to /tmp", func() verdict {
			_, err := c.Find(ctx, &sandboxv1.FindRequest{Path: "esc/tmp"})
			return jailed(err)
		}},
		{"grep /tmp", func() verdict {
			r, err := c.Grep(ctx, &sandboxv1.GrepRequest{Pattern: "TOPSECRET", Paths: []string{"/tmp"}})
			if len(r.GetMatches()) > 0 {
				return escapedf("matches %v", r.GetMatches())
			}
			return jailed(err)
		}},
		{"mkdir through a link to /tmp", func() verdict { return jailed(c.Mkdir(ctx, "esc/tmp/pwned-dir", true)) }},
		{"rename a file out", func() verdict { return jailed(c.Rename(ctx, "victim", "../pwned-renamed", false)) }},
		{"rename the secret in", func() verdict { return jailed(c.Rename(ctx, "esc/tmp/fbx-secret", "stolen", false)) }},
		{"remove through a link", func() verdict { return jailed(c.Remove(ctx, "esc/tmp/fbx-secret", false)) }},
		{"remove ..", func() verdict { return jailed(c.Remove(ctx, "..", true)) }},
		{"symlink with an absolute target", func() verdict { return jailed(c.Symlink(ctx, "/tmp", "pwned-abs")) }},
		{"symlink with a target out", func() verdict { return jailed(c.Symlink(ctx, "../tmp", "pwned-rel")) }},
		{"a batch with one escaping file", func() verdict {
			_, err := rpc.WriteFiles(ctx, &sandboxv1.WriteFilesRequest{
				Files: []*sandboxv1.FileWrite{{Path: "batch-ok.txt", Data: data}, {Path: "../pwned-batch", Data: data}}})
			if _, serr := c.Stat(ctx, "batch-ok.txt", false); status.Code(serr) != codes.NotFound {
				return escapedf("the batch's valid file was written (%v) though the batch was refused (%v)", serr, err)
			}
			return jailed(err)
		}},
	} {
		g.attack(a.name, "through the file API: "+a.name, func(t *testing.T) verdict { return a.do() })
	}

	// Hard links: a command links files from outside into the workspace, which the server
	// would then serve as workspace files.
	for _, h := range []struct{ name, script string }{
		{"hard-link the secret in", "ln /tmp/fbx-secret /workspace/hard-secret"},
		{"hard-link /etc/passwd in", "ln /etc/passwd /workspace/hard-passwd"},
		{"hard-link the server's binary in", "ln /proc/1/exe /workspace/hard-exe || ln \"$(readlink /proc/1/exe)\" /workspace/hard-exe"},
	} {
		g.attack(h.name, h.script, func(t *testing.T) verdict {
			return shell(t, ctx, c, h.script, "Invalid cross-device link", "Operation not permitted", "Permission denied", "No such file")
		})
	}

	g.attack("swap a directory for a link during reads", "flip sw between a directory holding f and a link to /tmp (whose f is the secret) while reading sw/f", func(t *testing.T) verdict {
		return raceJail(t, ctx, c, func(i int) (string, error) {
			if i%2 == 0 {
				b, err := c.ReadFile(ctx, "sw/f")
				if bytes.Contains(b, []byte("TOPSECRET")) {
					return "LEAK", err
				}
				return status.Code(err).String(), nil
			}
			files, _, err := c.ReadFiles(ctx, "sw/f", "sw/*")
			for _, b := range files {
				if bytes.Contains(b, []byte("TOPSECRET")) {
					return "LEAK", err
				}
			}
			return status.Code(err).String(), nil
		})
	})
	g.attack("swap a directory for a link during writes", "flip sw between a directory and a link to /tmp while writing, streaming and making directories under sw", func(t *testing.T) verdict {
		return raceJail(t, ctx, c, func(i int) (string, error) {
			var err error
			switch i % 3 {
			case 0:
				err = c.WriteFile(ctx, fmt.Sprintf("sw/pwned-%d", i), data, 0o644)
			case 1:
				_, err = c.WriteFileFrom(ctx, fmt.Sprintf("sw/pwned-stream-%d", i), 0o644, bytes.NewReader(data), -1)
			default:
				err = c.Mkdir(ctx, fmt.Sprintf("sw/pwned-dir-%d/x", i), true)
			}
			return status.Code(err).String(), nil
		})
	})

	if after := sandboxtest.Sh(t, ctx, c, "ls -A /tmp"); after != tmpBefore {
		t.Errorf("/tmp changed: before %q, after %q", tmpBefore, after)
	}
	if got := sandboxtest.Sh(t, ctx, c, "cat /tmp/fbx-secret; find / -xdev -name '*pwned*' 2>/dev/null; find /tmp -name '*pwned*'; true"); got != "TOPSECRET\n" {
		t.Errorf("outside the workspace after the attacks: %q", got)
	}
	if err := s.unharmed(ctx, l); err != nil {
		t.Errorf("after the file attacks: %v", err)
	}
}

// swapper flips /workspace/sw between a directory holding f ("inside") and a link to /tmp as
// fast as it can, until /workspace/stop exists.
const swapper = `import os, shutil, sys
os.chdir("/workspace")
n = 0
while not os.path.exists("stop"):
    try:
        if os.path.islink("sw"):
            os.unlink("sw")
        elif os.path.isdir("sw"):
            shutil.rmtree("sw", ignore_errors=True)
        if n % 2 == 0:
            os.mkdir("sw")
            with open("sw/f", "w") as f:
                f.write("inside\n")
        else:
            os.symlink("/tmp", "sw")
    except OSError:
        pass
    n += 1
print(n)
`

// raceJail runs op from 4 goroutines, 40 times each, while the swapper flips sw. The attack
// succeeds if op reports "LEAK" or anything lands in /tmp.
func raceJail(t *testing.T, ctx context.Context, c *client.Sandbox, op func(i int) (string, error)) verdict {
	t.Helper()
	sandboxtest.Sh(t, ctx, c, "rm -rf /workspace/sw /workspace/stop")
	type swapResult struct {
		res *client.Result
		err error
	}
	flips := make(chan swapResult, 1)
	go func() {
		res, err := c.Exec(ctx, client.Command{Argv: []string{"python3", "-c", swapper}, Timeout: 2 * time.Minute})
		flips <- swapResult{res, err}
	}()
	sandboxtest.Eventually(t, time.Minute, "the swapper started", func() (bool, string) {
		_, err := c.Stat(ctx, "sw", false)
		return err == nil, errString(err)
	})
	var mu sync.Mutex // guards outcomes
	outcomes := map[string]int{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 40 {
				o, _ := op(w*1000 + i)
				mu.Lock()
				outcomes[o]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := c.WriteFile(ctx, "stop", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sw := <-flips
	if sw.err != nil {
		t.Fatalf("the swapper: %v", sw.err)
	}
	var n int
	if _, err := fmt.Sscan(string(sw.res.Stdout), &n); err != nil || sw.res.ExitCode != 0 || n < 20 {
		t.Fatalf("the swapper: exit %d, stdout %q, stderr %q; want it to have flipped sw at least 20 times", sw.res.ExitCode, sw.res.Stdout, sw.res.Stderr)
	}
	swapped := fmt.Sprintf("%d flips", n)
	leaked := sandboxtest.Sh(t, ctx, c, "find /tmp -name '*pwned*'; true")
	sandboxtest.Sh(t, ctx, c, "rm -rf /workspace/sw /workspace/stop /workspace/pwned*")
	keys := make([]string, 0, len(outcomes))
	for k, n := range outcomes {
		keys = append(keys, fmt.Sprintf("%s×%d", k, n))
	}
	slices.Sort(keys)
	if outcomes["LEAK"] > 0 || leaked != "" {
		return escapedf("outcomes %v, in /tmp: %q (swapper: %s)", keys, leaked, swapped)
	}
	return refusedf("outcomes %v, nothing read or written outside (swapper: %s)", keys, swapped)
}
