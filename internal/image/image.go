// Package image builds fusebox's OCI images without a Docker daemon, reproducibly: the
// manager (its static binary, CA certificates, user 65532), the sandbox (a Debian userland
// made by mmdebstrap from the machine's apt mirror, fusebox-sandbox as entrypoint, user 65532,
// /workspace) and the gVisor node installer for AKS (the installer script, the pinned runsc
// and containerd-shim-runsc-v1, a small userland for the script's shell).
//
// Each image is written as an OCI image layout, DIR/<name>/, whose index.json holds the one
// manifest (annotated with org.opencontainers.image.ref.name), and with an SPDX SBOM beside it
// (DIR/<name>/sbom.spdx.json). Two builds of the same sources on the same inputs give the same
// digests: timestamps come from one epoch, tar entries are sorted, owners numeric, gzip runs
// at a fixed level, and the Go binaries are built with -trimpath and an empty build ID.
package image

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The images fusebox builds.
const (
	Manager         = "manager"
	Sandbox         = "sandbox"
	GVisorInstaller = "gvisor-installer"
)

// Names are the images in build order.
var Names = []string{Manager, Sandbox, GVisorInstaller}

// Defaults of BuildOptions.
const (
	DefaultManagerPackage = "./cmd/fusebox-manager"
	DefaultSandboxPackage = "./cmd/fusebox-sandbox"
	DefaultSuite          = "bookworm"
	// DefaultEpoch is the time of every file and of the images' creation unless
	// SOURCE_DATE_EPOCH says otherwise: a constant (2026-01-01T00:00:00Z), not the commit
	// time, so that the cached userland stays valid across commits.
	DefaultEpoch = 1767225600
	// NonRoot is the user and group the manager and sandbox images run as.
	NonRoot = 65532
)

// SandboxPackages are the Debian packages of the sandbox userland: what agents expect.
var SandboxPackages = []string{
	"bash", "ca-certificates", "coreutils", "curl", "findutils", "gawk", "git", "grep", "gzip",
	"python3", "python3-pip", "python3-venv", "sed", "tar", "xz-utils",
}

// InstallerPackages are the node installer's userland: what node-installer.sh runs (bash,
// curl, sha256sum and install from coreutils, grep, nsenter from util-linux).
var InstallerPackages = []string{"bash", "ca-certificates", "coreutils", "curl", "grep", "util-linux"}

// sandboxPath is the sandbox image's PATH.
const sandboxPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ErrUnknownImage is wrapped when an image name is not one of Names.
var ErrUnknownImage = errors.New("unknown image")

// BuildOptions configure Build.
type BuildOptions struct {
	// ModuleDir is the fusebox module's root (go.mod), the binaries' source. Required.
	ModuleDir string
	// Out receives one OCI layout per image, Out/<name>/. Required.
	Out string
	// Images to build; empty means all of Names.
	Images []string
	// Tar also writes Out/<name>.tar, the layout as an archive that `ctr images import` takes.
	Tar bool
	// ManagerPackage and SandboxPackage are the main packages of the two binaries (defaults
	// DefaultManagerPackage, DefaultSandboxPackage).
	ManagerPackage, SandboxPackage string
	// Suite is the Debian suite (default bookworm).
	Suite string
	// SandboxVariant is mmdebstrap's variant for the sandbox (default minbase).
	SandboxVariant string
	// SandboxPackages replaces SandboxPackages (tests use a small set); ExtraPackages are added.
	SandboxPackages, ExtraPackages []string
	// Runsc and Shim are the pinned gVisor binaries put into the node installer image.
	// Required for GVisorInstaller.
	Runsc, Shim string
	// CacheDir holds the cached userlands (CacheDir/rootfs/<key>/). Required when an image
	// with a Debian userland is built.
	CacheDir string
	// Epoch is the time of every file; zero means SOURCE_DATE_EPOCH, else DefaultEpoch.
	Epoch time.Time
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// Built is one image written by Build.
type Built struct {
	Name   string
	Digest v1.Hash
	// Dir is the image's OCI layout; SBOM is its SPDX document; Tar the archive, if asked.
	Dir, SBOM, Tar string
	// Size is the sum of the compressed layers, config and manifest.
	Size int64
}

// Epoch returns the build's epoch: SOURCE_DATE_EPOCH when set, else DefaultEpoch.
func Epoch() (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		var n int64
		if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 0 {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Unix(DefaultEpoch, 0).UTC(), nil
}

// CheckNames returns an error naming the first name that is not an image.
func CheckNames(names []string) error {
	for _, n := range names {
		if !slices.Contains(Names, n) {
			return fmt.Errorf("%w %q: the images are %s", ErrUnknownImage, n, strings.Join(Names, ", "))
		}
	}
	return nil
}

// Build builds the images and writes their layouts. Each layout is assembled in a temporary
// directory and renamed into place, so a failed build leaves the previous layout as it was.
func Build(o BuildOptions) ([]Built, error) {
	if o.ModuleDir == "" || o.Out == "" {
		return nil, errors.New("image build: the module directory and the output directory are required")
	}
	if _, err := os.Stat(filepath.Join(o.ModuleDir, "go.mod")); err != nil {
		return nil, fmt.Errorf("image build: %s is not the fusebox module (no go.mod): run from the repository", o.ModuleDir)
	}
	o, names, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if slices.Contains(names, GVisorInstaller) && (o.Runsc == "" || o.Shim == "") {
		return nil, errors.New("image build: the gvisor-installer image needs the pinned runsc and containerd-shim-runsc-v1 (--runsc, --shim; make runsc shim builds them)")
	}
	if (slices.Contains(names, Sandbox) || slices.Contains(names, GVisorInstaller)) && o.CacheDir == "" {
		return nil, errors.New("image build: a cache directory for the Debian userlands is required")
	}
	if slices.Contains(names, Sandbox) || slices.Contains(names, GVisorInstaller) {
		// Before anything is built: a missing mmdebstrap fails the build at once.
		if _, _, err := mmdebstrapVersion(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("creating the output directory: %w", err)
	}
	work, err := os.MkdirTemp("", "fusebox-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	var built []Built
	for _, n := range names {
		start := time.Now()
		fmt.Fprintf(o.Progress, "building %s\n", n)
		var img v1.Image
		var sb *imageSBOM
		var err error
		switch n {
		case Manager:
			img, sb, err = buildManager(o, work)
		case Sandbox:
			img, sb, err = buildSandbox(o, work)
		case GVisorInstaller:
			img, sb, err = buildInstaller(o, work)
		}
		if err != nil {
			return built, fmt.Errorf("building the %s image: %w", n, err)
		}
		b, err := writeLayout(o.Out, n, img, sb, o.Epoch, o.Tar)
		if err != nil {
			return built, fmt.Errorf("writing the %s image: %w", n, err)
		}
		fmt.Fprintf(o.Progress, "  %s %s (%s) in %s\n", n, b.Digest, humanSize(b.Size), time.Since(start).Round(100*time.Millisecond))
		built = append(built, b)
	}
	return built, nil
}

func validPackage(p string) bool {
	if len(p) < 2 || !(p[0] >= 'a' && p[0] <= 'z' || p[0] >= '0' && p[0] <= '9') {
		return false
	}
	for _, c := range p {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("+-.", c)) {
			return false
		}
	}
	return true
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// config makes an image from layers with the given config, created at epoch.
func config(layers []v1.Layer, cfg v1.Config, epoch time.Time, history string) (v1.Image, error) {
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: types.OCILayer, History: v1.History{
			Created: v1.Time{Time: epoch}, CreatedBy: history,
		}})
	}
	img, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = goarch(), "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// withDefaults returns o with its defaults filled in and the names of the images to build,
// or an error naming the first option that is wrong.
func (o BuildOptions) withDefaults() (BuildOptions, []string, error) {
	names := o.Images
	if len(names) == 0 {
		names = Names
	}
	if err := CheckNames(names); err != nil {
		return o, nil, err
	}
	for _, p := range o.ExtraPackages {
		if !validPackage(p) {
			return o, nil, fmt.Errorf("Debian package name %q: want lowercase letters, digits and + - . (e.g. jq)", p)
		}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.ManagerPackage == "" {
		o.ManagerPackage = DefaultManagerPackage
	}
	if o.SandboxPackage == "" {
		o.SandboxPackage = DefaultSandboxPackage
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.SandboxVariant == "" {
		o.SandboxVariant = "minbase"
	}
	if o.SandboxPackages == nil {
		o.SandboxPackages = SandboxPackages
	}
	if o.Epoch.IsZero() {
		e, err := Epoch()
		if err != nil {
			return o, nil, err
		}
		o.Epoch = e
	}
	return o, names, nil
}

// Userlands builds, or finds in o.CacheDir, the Debian userlands that Build with the same
// options puts into the images named in o.Images, and builds no image: a cache made ahead
// of the builds that need it (make test warms it while the toolchains compile).
func Userlands(o BuildOptions) error {
	o, names, err := o.withDefaults()
	if err != nil {
		return err
	}
	if o.CacheDir == "" {
		return errors.New("image userlands: a cache directory for the Debian userlands is required")
	}
	for _, n := range names {
		var spec rootfsSpec
		switch n {
		case Sandbox:
			spec = sandboxSpec(o)
		case GVisorInstaller:
			spec = installerSpec(o)
		default:
			continue // no Debian userland
		}
		fmt.Fprintf(o.Progress, "userland of %s\n", n)
		if _, err := buildRootfs(spec, o.CacheDir, o.Epoch, o.Progress); err != nil {
			return fmt.Errorf("the %s image's userland: %w", n, err)
		}
	}
	return nil
}

// sandboxSpec and installerSpec are the userlands of the sandbox and installer images.
func sandboxSpec(o BuildOptions) rootfsSpec {
	pkgs := append(slices.Clone(o.SandboxPackages), o.ExtraPackages...)
	return rootfsSpec{Variant: o.SandboxVariant, Suite: o.Suite, Packages: pkgs, SandboxUser: true}
}

func installerSpec(o BuildOptions) rootfsSpec {
	return rootfsSpec{Variant: "essential", Suite: o.Suite, Packages: InstallerPackages}
}

func buildManager(o BuildOptions, work string) (v1.Image, *imageSBOM, error) {
	bin, err := buildGo(o.ModuleDir, o.ManagerPackage, work, "fusebox-manager")
	if err != nil {
		return nil, nil, err
	}
	const certs = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(certs); err != nil {
		return nil, nil, fmt.Errorf("the manager image's CA certificates come from %s: %w: install the Debian package ca-certificates", certs, err)
	}
	layer, err := filesLayer([]file{
		{name: "usr/local/bin/fusebox-manager", mode: 0o755, src: bin.path},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, src: certs},
	}, o.Epoch)
	if err != nil {
		return nil, nil, err
	}
	img, err := config([]v1.Layer{layer}, v1.Config{
		Entrypoint: []string{"/usr/local/bin/fusebox-manager"},
		User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		Labels:     map[string]string{"org.opencontainers.image.title": "fusebox manager"},
	}, o.Epoch, "fusebox image build: fusebox-manager and CA certificates")
	if err != nil {
		return nil, nil, err
	}
	sb := newSBOM(Manager)
	sb.addGoBinary("/usr/local/bin/fusebox-manager", bin)
	if status, err := os.ReadFile("/var/lib/dpkg/status"); err == nil {
		// Only the certificates' package: nothing else of the host is in the image.
		sb.addDpkgStatus(onlyPackage(status, "ca-certificates"), debianVersion(o.Suite))
	}
	return img, sb, nil
}

// onlyPackage keeps one package's stanza of a dpkg status file.
func onlyPackage(status []byte, name string) []byte {
	for _, stanza := range strings.Split(string(status), "\n\n") {
		if strings.HasPrefix(stanza, "Package: "+name+"\n") {
			return []byte(stanza + "\n")
		}
	}
	return nil
}

func buildSandbox(o BuildOptions, work string) (v1.Image, *imageSBOM, error) {
	rfs, err := buildRootfs(sandboxSpec(o), o.CacheDir, o.Epoch, o.Progress)
	if err != nil {
		return nil, nil, err
	}
	bin, err := buildGo(o.ModuleDir, o.SandboxPackage, work, "fusebox-sandbox")
	if err != nil {
		return nil, nil, err
	}
	top, err := filesLayer([]file{
		{name: "usr/local/bin/fusebox-sandbox", mode: 0o755, src: bin.path},
		{name: "workspace", dir: true, mode: 0o755, uid: NonRoot, gid: NonRoot},
	}, o.Epoch)
	if err != nil {
		return nil, nil, err
	}
	img, err := config([]v1.Layer{rfs.layer, top}, v1.Config{
		Entrypoint: []string{"/usr/local/bin/fusebox-sandbox"},
		User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		WorkingDir: "/workspace",
		Env:        []string{sandboxPath, "LANG=C.UTF-8"},
		Labels:     map[string]string{"org.opencontainers.image.title": "fusebox sandbox"},
	}, o.Epoch, "fusebox image build: Debian "+o.Suite+" userland (mmdebstrap), fusebox-sandbox, /workspace")
	if err != nil {
		return nil, nil, err
	}
	sb := newSBOM(Sandbox)
	sb.addGoBinary("/usr/local/bin/fusebox-sandbox", bin)
	if err := sb.addDpkgStatus(rfs.dpkgStatus, debianVersion(o.Suite)); err != nil {
		return nil, nil, err
	}
	return img, sb, nil
}

// InstallerSumsPath is where the gvisor-installer image records the SHA-256 of the runsc
// and containerd-shim-runsc-v1 it carries (in /opt/gvisor beside them), in sha256sum's
// format: the node installer installs a binary only if it has that digest.
const InstallerSumsPath = "opt/gvisor/SHA256SUMS"

// InstallerSums is the content of InstallerSumsPath: one "<sha256>  <name>" line per binary,
// as `sha256sum -c` reads it in /opt/gvisor.
func InstallerSums(runscSum, shimSum string) []byte {
	return []byte(runscSum + "  runsc\n" + shimSum + "  containerd-shim-runsc-v1\n")
}

func buildInstaller(o BuildOptions, work string) (v1.Image, *imageSBOM, error) {
	scriptPath := filepath.Join(o.ModuleDir, "components", "gvisor", "node-installer.sh")
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the node installer script: %w", err)
	}
	runsc, err := readGoBinary(o.Runsc)
	if err != nil {
		return nil, nil, fmt.Errorf("runsc %s (make runsc builds it): %w", o.Runsc, err)
	}
	shim, err := readGoBinary(o.Shim)
	if err != nil {
		return nil, nil, fmt.Errorf("containerd-shim-runsc-v1 %s (make shim builds it): %w", o.Shim, err)
	}
	rfs, err := buildRootfs(installerSpec(o), o.CacheDir, o.Epoch, o.Progress)
	if err != nil {
		return nil, nil, err
	}
	// The binaries are read once: the bytes hashed into SHA256SUMS are the bytes in the layer.
	runscData, err := os.ReadFile(runsc.path)
	if err != nil {
		return nil, nil, err
	}
	shimData, err := os.ReadFile(shim.path)
	if err != nil {
		return nil, nil, err
	}
	runscSum, shimSum := sha256Hex(runscData), sha256Hex(shimData)
	top, err := filesLayer([]file{
		{name: "usr/local/bin/fusebox-gvisor-installer", mode: 0o755, data: script},
		{name: "opt/gvisor/runsc", mode: 0o755, data: runscData},
		{name: "opt/gvisor/containerd-shim-runsc-v1", mode: 0o755, data: shimData},
		{name: InstallerSumsPath, mode: 0o444, data: InstallerSums(runscSum, shimSum)},
	}, o.Epoch)
	if err != nil {
		return nil, nil, err
	}
	img, err := config([]v1.Layer{rfs.layer, top}, v1.Config{
		Entrypoint: []string{"/bin/bash", "/usr/local/bin/fusebox-gvisor-installer"},
		Env:        []string{sandboxPath, "LANG=C.UTF-8"},
		Labels: map[string]string{
			"org.opencontainers.image.title":  "fusebox gVisor node installer",
			"dev.fusebox.gvisor.runsc":        runsc.info.Main.Version,
			"dev.fusebox.gvisor.runsc.sha256": runscSum,
			"dev.fusebox.gvisor.shim.sha256":  shimSum,
		},
	}, o.Epoch, "fusebox image build: Debian "+o.Suite+" userland (mmdebstrap), node-installer.sh, runsc and its shim")
	if err != nil {
		return nil, nil, err
	}
	sb := newSBOM(GVisorInstaller)
	sb.addFile("/usr/local/bin/fusebox-gvisor-installer", script)
	sb.addGoBinary("/opt/gvisor/runsc", runsc)
	sb.addGoBinary("/opt/gvisor/containerd-shim-runsc-v1", shim)
	sb.addFile("/"+InstallerSumsPath, InstallerSums(runscSum, shimSum))
	if err := sb.addDpkgStatus(rfs.dpkgStatus, debianVersion(o.Suite)); err != nil {
		return nil, nil, err
	}
	return img, sb, nil
}

func debianVersion(suite string) string {
	switch suite {
	case "bookworm":
		return "12"
	case "trixie":
		return "13"
	}
	return suite
}
