package runscalloc_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/fusebox-dev/fusebox/client"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/internal/runsc/runsctest"
	"github.com/fusebox-dev/fusebox/internal/sfuse"
	"github.com/fusebox-dev/fusebox/internal/templates"
	"github.com/fusebox-dev/fusebox/manager/runscalloc"
	"github.com/fusebox-dev/fusebox/test/imagetest"
	"github.com/fusebox-dev/fusebox/test/sandboxtest"
)

// entry is one file of a test layer.
type entry struct {
	name     string
	typ      byte
	mode     int64
	uid      int
	data     string
	linkname string
}

// layer returns a layer of entries, in order.
func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.uid, Size: int64(len(e.data)),
			Linkname: e.linkname, ModTime: time.Unix(1767225600, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// writeImage writes img as an OCI layout under t's temporary directory and returns its
// reference as a template names it (DIR@sha256:HEX).
func writeImage(t *testing.T, img v1.Image) string {
	t.Helper()
	lay := filepath.Join(t.TempDir(), "layout")
	h, err := imagetest.WriteImage(lay, img)
	if err != nil {
		t.Fatal(err)
	}
	return lay + "@" + h.String()
}

// A template image's /workspace (a Dockerfile's WORKDIR /workspace and COPY) is in each of
// its sandboxes' workspace, which would otherwise hide it: contents, modes, links and owners
// as in the image, so that the command user may write what the image let it write and no
// more; the workspace itself stays the command user's.
func TestTemplateImageWorkspaceIsCopied(t *testing.T) {
	runscBin := runsctest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base, err := imagetest.PlainImage(v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, WorkingDir: "/workspace"}, os.Stderr)
	if err != nil {
		t.Fatalf("making the plain image: %v", err)
	}
	const cmdUser = 65532 // localsandbox.DefaultCommandUser: the image names no user
	img, err := mutate.AppendLayers(base, layer(t,
		entry{name: "workspace/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "workspace/hello.txt", typ: tar.TypeReg, mode: 0o644, data: "hello from the image\n"},
		entry{name: "workspace/shared.txt", typ: tar.TypeReg, mode: 0o666, data: "shared\n"},
		entry{name: "workspace/app/", typ: tar.TypeDir, mode: 0o750, uid: cmdUser},
		entry{name: "workspace/app/main.py", typ: tar.TypeReg, mode: 0o640, uid: cmdUser, data: "print('hi')\n"},
		entry{name: "workspace/app/hello", typ: tar.TypeSymlink, linkname: "../hello.txt"},
		entry{name: "workspace/app/passwd", typ: tar.TypeSymlink, linkname: "/etc/passwd"},
	))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := runscalloc.FromSpec(templates.Spec{Name: "seeded", Image: writeImage(t, img)}, runscalloc.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := runscalloc.NewContext(ctx, runscalloc.Options{Runsc: runscBin, StateDir: t.TempDir(),
		SandboxBinary: sandboxtest.SandboxBinary(t), Templates: map[string]runscalloc.Template{"seeded": tm}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Shutdown(context.Background()); err != nil {
			t.Errorf("shutting down: %v", err)
		}
	})
	id := runsc.ID("seed"+strconv.FormatInt(int64(os.Getpid()), 36), 1)
	t.Cleanup(func() {
		if err := a.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroying %s: %v", id, err)
		}
	})
	info, err := a.Create(ctx, id, "seeded")
	if err != nil {
		t.Fatal(err)
	}
	key := sandboxtest.NewKey(t)
	res, err := sfuse.Initialize(ctx, info.InitAddr, sfuse.Request{AgentKey: key.PublicKey()})
	if err != nil {
		t.Fatalf("sFuse: %v", err)
	}
	c, err := client.Dial(info.DataAddr, res.SandboxKey, key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if out := sandboxtest.Sh(t, ctx, c, "cat /workspace/hello.txt && cat app/hello"); out != "hello from the image\nhello from the image\n" {
		t.Errorf("cat: %q", out)
	}
	got := sandboxtest.Sh(t, ctx, c, `id -u
stat -c '%n %u:%g %a %F' /workspace . hello.txt shared.txt app app/main.py app/hello | sed 's,^/workspace ,workspace ,'
readlink app/hello app/passwd
echo more >> app/main.py && echo wrote app/main.py
echo more >> shared.txt && echo wrote shared.txt
(echo more >> hello.txt) 2>/dev/null || echo refused hello.txt
touch new.txt && echo wrote new.txt`)
	want := `65532
workspace 65532:65532 755 directory
. 65532:65532 755 directory
hello.txt 0:0 644 regular file
shared.txt 0:0 666 regular file
app 65532:65532 750 directory
app/main.py 65532:65532 640 regular file
app/hello 0:0 777 symbolic link
../hello.txt
/etc/passwd
wrote app/main.py
wrote shared.txt
refused hello.txt
wrote new.txt
`
	if got != want {
		t.Errorf("in the sandbox:\n%s\nwant:\n%s", got, want)
	}
	// The capabilities the copy needed (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER) are gone from
	// the server once it serves: it keeps CAP_SETGID, CAP_SETUID and CAP_SYS_RESOURCE.
	if out := sandboxtest.Sh(t, ctx, c, `grep -E '^Cap(Prm|Eff):' /proc/1/status`); out != "CapPrm:\t00000000010000c0\nCapEff:\t00000000010000c0\n" {
		t.Errorf("the server's capabilities:\n%s", out)
	}
	if log := a.ServerLog(id); !strings.Contains(readFile(t, log), `"copied the image's workspace"`) {
		t.Errorf("the server log does not report the copy: %s", readFile(t, log))
	}
}

// An image whose /workspace holds more than the template's limits.workspace is refused when
// the allocator starts, with both sizes and the setting to change.
func TestTemplateImageWorkspaceOverTheLimit(t *testing.T) {
	runscBin := filepath.Join(t.TempDir(), "runsc") // never run: the image is refused first
	if err := os.WriteFile(runscBin, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "fusebox-sandbox")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer(t,
		entry{name: "workspace/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "workspace/data/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "workspace/data/big.bin", typ: tar.TypeReg, mode: 0o644, data: strings.Repeat("x", 2<<20)},
	))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = withPlatform(img); err != nil {
		t.Fatal(err)
	}
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := runscalloc.FromSpec(templates.Spec{Name: "big", Image: writeImage(t, img), Limits: templates.Limits{Workspace: "1Mi"}}, runscalloc.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = runscalloc.New(runscalloc.Options{Runsc: runscBin, StateDir: t.TempDir(), SandboxBinary: bin,
		Templates: map[string]runscalloc.Template{"big": tm}})
	want := "template big: sandbox image " + h.String() + ": its /workspace holds 2 MiB, over the workspace limit of 1 MiB (limits.workspace"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want %q", err, want)
	}
	t.Log(err)
}

// withPlatform returns img for this machine's platform, which the allocator checks.
func withPlatform(img v1.Image) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	return mutate.ConfigFile(img, cf)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A /workspace that passes the size check but does not fit the workspace tmpfs (many small
// files, each taking a page) fails the sandbox's start with the server's reason.
func TestTemplateImageWorkspaceCopyFails(t *testing.T) {
	runscBin := runsctest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	entries := []entry{{name: "workspace/", typ: tar.TypeDir, mode: 0o755}}
	for i := range 400 {
		entries = append(entries, entry{name: "workspace/f" + strconv.Itoa(i), typ: tar.TypeReg, mode: 0o644, data: "x"})
	}
	img, err := mutate.AppendLayers(empty.Image, layer(t, entries...))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = withPlatform(img); err != nil {
		t.Fatal(err)
	}
	tm, err := runscalloc.FromSpec(templates.Spec{Name: "small", Image: writeImage(t, img), Limits: templates.Limits{Workspace: "1Mi"}}, runscalloc.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := runscalloc.NewContext(ctx, runscalloc.Options{Runsc: runscBin, StateDir: t.TempDir(),
		SandboxBinary: sandboxtest.SandboxBinary(t), Templates: map[string]runscalloc.Template{"small": tm}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Shutdown(context.Background()); err != nil {
			t.Errorf("shutting down: %v", err)
		}
	})
	id := runsc.ID("seed"+strconv.FormatInt(int64(os.Getpid()), 36), 2)
	_, err = a.Create(ctx, id, "small")
	if err == nil {
		a.Destroy(context.Background(), id)
		t.Fatal("a sandbox whose workspace copy cannot fit started")
	}
	for _, want := range []string{"server exited before listening", "copying the image's workspace", "no space left on device"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q in it", err, want)
		}
	}
	t.Log(err)
}
