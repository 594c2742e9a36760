package managere2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// `fusebox local up --image DIR` serves sandboxes whose root is the image: `fusebox run`
// runs the image's python3 and git, as the image's user.
func TestLocalUpWithImage(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, testDeadline)
	lay := filepath.Join(e.base, "images", "sandbox")
	if _, err := imagetest.WriteLayout(lay, e.Sandbox, os.Stderr); err != nil {
		t.Fatalf("making the sandbox image layout: %v", err)
	}
	p := e.startLocalUp(t, "image", "--image", lay, "--pool-size", "1")
	e.waitServing(t, p, dialManager(t, e.Addr))
	code, out, errOut := runFusebox(t, ctx, "run", "--manager", e.Addr, "-q", "--", "sh", "-c",
		"python3 -c 'print(1)' && git --version && id -u && . /etc/os-release && echo $VERSION_CODENAME")
	if code != 0 || !strings.HasPrefix(out, "1\ngit version ") || !strings.HasSuffix(out, "\n65532\nbookworm\n") {
		t.Errorf("fusebox run on the image: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if l := p.log(); !strings.Contains(l, "sandbox image") || !strings.Contains(l, "digest=sha256:") {
		t.Errorf("local up does not log the image it runs:\n%s", l)
	}
	if code := p.signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code after SIGTERM: %d", code)
	}
}

// Bad --image values stop local up at once with an error that says what to do.
func TestLocalUpRefusesABadImage(t *testing.T) {
	e := newEnv(t)
	notLayout := filepath.Join(e.base, "not-a-layout")
	os.MkdirAll(notLayout, 0o755)
	for _, tc := range []struct{ image, want string }{
		{notLayout, "not an OCI image layout"},
		{filepath.Join(e.base, "missing"), "no such directory"},
		{"127.0.0.1:1", "without a repository path"},
		{"127.0.0.1:1/fusebox/sandbox:v1", "pulling 127.0.0.1:1/fusebox/sandbox:v1 from registry 127.0.0.1:1"},
	} {
		p := e.startLocalUp(t, "bad-image", "--image", tc.image)
		if code := p.wait(t); code == 0 {
			t.Errorf("--image %s: exit 0", tc.image)
		}
		if l := p.log(); !strings.Contains(l, tc.want) {
			t.Errorf("--image %s: the error does not say %q:\n%s", tc.image, tc.want, l)
		}
		if _, err := os.Stat(e.Socket); err == nil {
			t.Errorf("--image %s: the refused manager left a socket at %s", tc.image, e.Socket)
		}
	}
}
