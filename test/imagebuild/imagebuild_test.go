// Package imagebuild tests the images `fusebox image build --tar` makes, with the real tools
// that consume them: each image's archive imported into a real containerd with ctr (name and
// digest as the build printed them), and the gVisor node installer image unpacked and its
// entrypoint run from its own userland.
package imagebuild

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/image"
)

// built is one image as `fusebox image build --tar` printed it.
type built struct {
	Name, Digest, Dir, Tar string
	// ImportName is the name the build says `ctr images import` gives the archive.
	ImportName string
}

var (
	buildOnce sync.Once
	buildOut  string
	images    map[string]built
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOut != "" {
		os.RemoveAll(buildOut)
	}
	os.Exit(code)
}

// goarch is the platform's architecture as OCI names it.
const goarch = runtime.GOARCH

func moduleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// needImageBuild skips or fails a test that builds the images when the machine cannot.
func needImageBuild(t *testing.T) {
	t.Helper()
	if os.Getenv("FUSEBOX_SKIP_RUNSC") == "1" {
		t.Skip("FUSEBOX_SKIP_RUNSC=1: the images carry the pinned runsc")
	}
	if os.Geteuid() != 0 {
		t.Skip("building the Debian userlands (mmdebstrap) and chroot need root")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("mmdebstrap missing (Debian package mmdebstrap); CI runs this test")
		}
		t.Fatal("mmdebstrap missing: .ci/run installs the Debian package mmdebstrap")
	}
	for _, p := range []string{runscPath(), shimPath()} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the pinned gVisor binaries the installer image carries: %v (make runsc shim builds them)", err)
		}
	}
}

func cacheDir() string {
	if d := os.Getenv("FUSEBOX_CACHE"); d != "" {
		return d
	}
	return "/var/cache/fusebox"
}

// runscPath and shimPath are what fusebox image build takes by default ($FUSEBOX_RUNSC and
// $FUSEBOX_SHIM, which the Makefile exports, else the cache's pinned builds).
func runscPath() string {
	if p := os.Getenv("FUSEBOX_RUNSC"); p != "" {
		return p
	}
	return filepath.Join(cacheDir(), "runsc-v0.0.0-20260905035102-160fafc42237", "runsc")
}

func shimPath() string {
	if p := os.Getenv("FUSEBOX_SHIM"); p != "" {
		return p
	}
	return filepath.Join(cacheDir(), "shim-v0.0.0-20260905035102-160fafc42237", "containerd-shim-runsc-v1")
}

var (
	builtLine   = regexp.MustCompile(`^(\S+)\s+(sha256:[0-9a-f]{64})  (\S+)$`)
	archiveLine = regexp.MustCompile(`^\s+archive (\S+) \(ctr images import names it (\S+)\)$`)
)

// parseBuilt reads what fusebox image build printed on stdout.
func parseBuilt(out string) (map[string]built, error) {
	m := map[string]built{}
	var last string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if g := builtLine.FindStringSubmatch(line); g != nil {
			m[g[1]] = built{Name: g[1], Digest: g[2], Dir: g[3]}
			last = g[1]
			continue
		}
		if g := archiveLine.FindStringSubmatch(line); g != nil && last != "" {
			b := m[last]
			b.Tar, b.ImportName = g[1], g[2]
			m[last] = b
			continue
		}
		return nil, fmt.Errorf("unexpected line %q", line)
	}
	return m, nil
}

// buildImages runs `fusebox image build --tar` once per test binary, with the fusebox CLI of
// $FUSEBOX_BIN or one built from this module, and returns what it printed.
func buildImages(t *testing.T) map[string]built {
	t.Helper()
	needImageBuild(t)
	buildOnce.Do(func() {
		if buildOut, buildErr = os.MkdirTemp("", "fusebox-imagebuild-"); buildErr != nil {
			return
		}
		cli := os.Getenv("FUSEBOX_BIN")
		if cli == "" {
			cli = filepath.Join(buildOut, "fusebox")
			// make build's flags, so that its build cache serves this build.
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", cli, "./cmd/fusebox")
			cmd.Dir = moduleDir()
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build -trimpath ./cmd/fusebox: %v\n%s", err, out)
				return
			}
		}
		cmd := exec.Command(cli, "image", "build", "--tar", "--out", filepath.Join(buildOut, "images"),
			"--repo", moduleDir(), "--runsc", runscPath(), "--shim", shimPath(), "--cache", cacheDir())
		var stdout strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("fusebox image build --tar: %v\n%s", err, stdout.String())
			return
		}
		images, buildErr = parseBuilt(stdout.String())
		if buildErr == nil && len(images) != len(image.Names) {
			buildErr = fmt.Errorf("fusebox image build printed %d images, want %v:\n%s", len(images), image.Names, stdout.String())
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return images
}

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// testCtx ends with the test or after d: the deadline only keeps a broken tool from hanging
// the test binary.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitForLine reads r line by line until a line contains want, and returns every line read.
func waitForLine(sc *bufio.Scanner, want string) (string, bool) {
	var b strings.Builder
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), want) {
			return b.String(), true
		}
	}
	return b.String(), false
}
