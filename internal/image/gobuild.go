package image

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// goBinary is a static Go binary built from the module, with the build information that its
// SBOM lists.
type goBinary struct {
	path string
	info *buildinfo.BuildInfo
}

// ErrGoToolchain is wrapped when the Go toolchain that builds the binaries is missing.
var ErrGoToolchain = errors.New("go toolchain")

// buildGo builds the main package pkg of the module in moduleDir into dir as a static linux
// binary, reproducibly: no cgo, -trimpath, no VCS stamping, an empty build ID and fixed
// ldflags, so the same source and toolchain give the same bytes.
func buildGo(moduleDir, pkg, dir, name string) (*goBinary, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("%w: go not found in PATH (building %s): install Go (see go.mod for the version) or add it to PATH", ErrGoToolchain, pkg)
	}
	if !strings.HasPrefix(pkg, "./") {
		return nil, fmt.Errorf("package %q: want a path inside the module such as ./cmd/fusebox-sandbox", pkg)
	}
	if fi, err := os.Stat(filepath.Join(moduleDir, filepath.FromSlash(pkg))); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("package %s: no such directory in the module at %s (pass the main package with --manager-package)", pkg, moduleDir)
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command(goTool, "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", out, pkg)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=-mod=readonly")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("building %s: %w: %s", pkg, err, strings.TrimSpace(stderr.String()))
	}
	return readGoBinary(out)
}

// readGoBinary reads the build information of a Go binary (runsc, the shim).
func readGoBinary(path string) (*goBinary, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the Go build information of %s: %w", path, err)
	}
	return &goBinary{path: path, info: info}, nil
}
