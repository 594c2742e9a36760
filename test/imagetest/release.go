package imagetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// Built is one image as `fusebox image build --tar` printed it.
type Built struct {
	Name, Digest, Dir, Tar string
	// ImportName is the name the build says `ctr images import` gives the archive.
	ImportName string
}

var (
	buildOnce sync.Once
	buildOut  string
	built     map[string]Built
	buildErr  error
)

// Cleanup removes what Release built; call it from TestMain after the tests.
func Cleanup() {
	if buildOut != "" {
		os.RemoveAll(buildOut)
	}
}

// NeedImageBuild skips or fails a test that builds the release images when the machine
// cannot: it skips without root or with FUSEBOX_SKIP_RUNSC=1, and, outside CI, without
// mmdebstrap.
func NeedImageBuild(t testing.TB) {
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
	for _, p := range []string{RunscPath(), ShimPath()} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the pinned gVisor binaries the installer image carries: %v (make runsc shim builds them)", err)
		}
	}
}

// RunscPath and ShimPath are what fusebox image build takes by default ($FUSEBOX_RUNSC and
// $FUSEBOX_SHIM, which the Makefile exports, else the cache's pinned builds).
func RunscPath() string {
	if p := os.Getenv("FUSEBOX_RUNSC"); p != "" {
		return p
	}
	return filepath.Join(CacheDir(), "runsc-v0.0.0-20260905035102-160fafc42237", "runsc")
}

// ShimPath: see RunscPath.
func ShimPath() string {
	if p := os.Getenv("FUSEBOX_SHIM"); p != "" {
		return p
	}
	return filepath.Join(CacheDir(), "shim-v0.0.0-20260905035102-160fafc42237", "containerd-shim-runsc-v1")
}

var (
	builtLine   = regexp.MustCompile(`^(\S+)\s+(sha256:[0-9a-f]{64})  (\S+)$`)
	archiveLine = regexp.MustCompile(`^\s+archive (\S+) \(ctr images import names it (\S+)\)$`)
)

// ParseBuilt reads what fusebox image build printed on stdout.
func ParseBuilt(out string) (map[string]Built, error) {
	m := map[string]Built{}
	var last string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if g := builtLine.FindStringSubmatch(line); g != nil {
			m[g[1]] = Built{Name: g[1], Digest: g[2], Dir: g[3]}
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

// FuseboxCLI returns $FUSEBOX_BIN (make test passes make build's), or builds cmd/fusebox into
// dir with make build's flags, so that its build cache serves this build.
func FuseboxCLI(dir string) (string, error) {
	if p := os.Getenv("FUSEBOX_BIN"); p != "" {
		return p, nil
	}
	cli := filepath.Join(dir, "fusebox")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", cli, "./cmd/fusebox")
	cmd.Dir = testenv.ModuleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -trimpath ./cmd/fusebox: %v\n%s", err, out)
	}
	return cli, nil
}

// BuiltFile is the file in $FUSEBOX_IMAGES that holds what `fusebox image build --tar` printed
// when it built the images there (make images writes it).
const BuiltFile = "built.txt"

// Release returns the release images (manager, sandbox, gVisor installer) by name, as `fusebox
// image build --tar` printed them. With $FUSEBOX_IMAGES set (make test builds the images once
// before the tests that take them) they are the ones built there, read-only to the tests;
// otherwise it runs the build once per test binary, with the fusebox CLI of $FUSEBOX_BIN or
// one built from this module.
func Release(t testing.TB) map[string]Built {
	t.Helper()
	NeedImageBuild(t)
	if dir := os.Getenv("FUSEBOX_IMAGES"); dir != "" {
		return prebuilt(t, dir)
	}
	buildOnce.Do(func() {
		if buildOut, buildErr = os.MkdirTemp("", "fusebox-imagebuild-"); buildErr != nil {
			return
		}
		var cli string
		if cli, buildErr = FuseboxCLI(buildOut); buildErr != nil {
			return
		}
		cmd := exec.Command(cli, "image", "build", "--tar", "--out", filepath.Join(buildOut, "images"),
			"--repo", testenv.ModuleRoot(), "--runsc", RunscPath(), "--shim", ShimPath(), "--cache", CacheDir())
		var stdout strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("fusebox image build --tar: %v\n%s", err, stdout.String())
			return
		}
		built, buildErr = ParseBuilt(stdout.String())
		if buildErr == nil && len(built) != len(image.Names) {
			buildErr = fmt.Errorf("fusebox image build printed %d images, want %v:\n%s", len(built), image.Names, stdout.String())
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// prebuilt reads the images make images built into dir.
func prebuilt(t testing.TB, dir string) map[string]Built {
	t.Helper()
	out, err := os.ReadFile(filepath.Join(dir, BuiltFile))
	if err != nil {
		t.Fatalf("FUSEBOX_IMAGES=%s: %v (make images writes it)", dir, err)
	}
	m, err := ParseBuilt(string(out))
	if err == nil && len(m) != len(image.Names) {
		err = fmt.Errorf("%d images, want %v", len(m), image.Names)
	}
	for _, b := range m {
		if err == nil && (!filepath.IsAbs(b.Dir) || b.Tar == "") {
			err = fmt.Errorf("image %s: want an absolute layout path and an archive (fusebox image build --tar --out ABSDIR)", b.Name)
		}
	}
	if err != nil {
		t.Fatalf("FUSEBOX_IMAGES=%s: %s: %v", dir, BuiltFile, err)
	}
	return m
}
