// Package imagetest makes a small Debian 12 sandbox image for integration tests and
// benchmarks of the local runtime's image root: a minbase userland from mmdebstrap (with
// python3-minimal and git), from the mirror the machine's apt sources already name, plus the
// static fusebox-sandbox at /usr/local/bin as a second layer, with the sandbox image's
// configuration (entrypoint, user 65532, /workspace, PATH and LANG). It writes an OCI image
// layout of that one image.
//
// The mmdebstrap archive is cached under $FUSEBOX_CACHE (default /var/cache/fusebox), keyed
// by everything that goes into it, so that only the first run downloads packages.
package imagetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The userland: what the tests run (python3, git) on Debian 12's smallest base.
const (
	Suite    = "bookworm"
	Variant  = "minbase"
	Packages = "python3-minimal,git"
	// SandboxUID is the image's user, as in the images fusebox image build makes.
	SandboxUID = 65532
	// Entrypoint is where the image holds fusebox-sandbox.
	Entrypoint = "/usr/local/bin/fusebox-sandbox"
	// sourceDateEpoch fixes mmdebstrap's timestamps (2026-01-01).
	sourceDateEpoch = "1767225600"
)

// Config is the sandbox image's configuration.
func Config() v1.Config {
	return v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       fmt.Sprintf("%d:%d", SandboxUID, SandboxUID),
		WorkingDir: "/workspace",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
	}
}

// CacheDir is $FUSEBOX_CACHE, or /var/cache/fusebox.
func CacheDir() string {
	if d := os.Getenv("FUSEBOX_CACHE"); d != "" {
		return d
	}
	return "/var/cache/fusebox"
}

// aptSources returns the machine's apt sources file, found through apt-config: a deb822
// .sources file in the source parts directory, or the one-line sources.list. mmdebstrap
// reads either when given its path as the mirror.
func aptSources() (string, error) {
	out, err := exec.Command("apt-config", "dump").Output()
	if err != nil {
		return "", fmt.Errorf("reading the apt configuration (apt-config dump): %w", err)
	}
	conf := map[string]string{}
	re := regexp.MustCompile(`^(\S+) "(.*)";$`)
	for _, line := range strings.Split(string(out), "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			conf[m[1]] = m[2]
		}
	}
	etc := filepath.Join("/", conf["Dir"], conf["Dir::Etc"])
	parts := filepath.Join(etc, conf["Dir::Etc::sourceparts"])
	if matches, _ := filepath.Glob(filepath.Join(parts, "*.sources")); len(matches) > 0 {
		return matches[0], nil
	}
	list := filepath.Join(etc, conf["Dir::Etc::sourcelist"])
	if fi, err := os.Stat(list); err == nil && fi.Size() > 0 {
		return list, nil
	}
	return "", fmt.Errorf("no apt sources found (neither %s/*.sources nor %s)", parts, list)
}

// RootfsTar returns the path of the cached mmdebstrap archive, making it first if it is
// missing (about half a minute and a download of some 30 MB of packages).
func RootfsTar(log io.Writer) (string, error) {
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", errors.New("mmdebstrap is missing: install the Debian package mmdebstrap (apt-get install mmdebstrap)")
	}
	sources, err := aptSources()
	if err != nil {
		return "", err
	}
	srcData, err := os.ReadFile(sources)
	if err != nil {
		return "", err
	}
	version, err := exec.Command(mm, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("mmdebstrap --version: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "suite=%s\nvariant=%s\npackages=%s\nepoch=%s\nmmdebstrap=%s\nsources=%s\n", Suite, Variant, Packages, sourceDateEpoch, version, srcData)
	key := hex.EncodeToString(h.Sum(nil))[:24]
	dir := filepath.Join(CacheDir(), "test-rootfs")
	out := filepath.Join(dir, key+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.tar", key, os.Getpid()))
	defer os.Remove(tmp)
	fmt.Fprintf(log, "imagetest: mmdebstrap --variant=%s --include=%s %s (cached as %s)\n", Variant, Packages, Suite, out)
	cmd := exec.Command(mm, "--quiet", "--variant="+Variant, "--include="+Packages, Suite, tmp, sources)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+sourceDateEpoch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mmdebstrap: %w\n%s", err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	return out, nil
}

// binaryLayer returns a layer holding bin at Entrypoint, owned by root, mode 0755.
func binaryLayer(bin string) (v1.Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return tarLayer([]string{"usr/", "usr/local/", "usr/local/bin/"},
		map[string][]byte{strings.TrimPrefix(Entrypoint, "/"): data}, 0o755)
}

// tarLayer returns a layer of dirs, then files (by name, in name order, with mode), all at
// the userland's fixed time.
func tarLayer(dirs []string, files map[string][]byte, mode int64) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1767225600, 0)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed))
}

// baseLayer returns the userland as a compressed layer, compressed once and cached beside
// the archive (as a one-layer image layout), so that each layout written later copies it.
func baseLayer(log io.Writer) (v1.Layer, error) {
	rootTar, err := RootfsTar(log)
	if err != nil {
		return nil, err
	}
	cached := strings.TrimSuffix(rootTar, ".tar") + ".layout"
	if _, err := os.Stat(filepath.Join(cached, "index.json")); err != nil {
		l, err := tarball.LayerFromFile(rootTar, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return nil, err
		}
		img, err := mutate.AppendLayers(empty.Image, l)
		if err != nil {
			return nil, err
		}
		tmp := fmt.Sprintf("%s.%d.tmp", cached, os.Getpid())
		defer os.RemoveAll(tmp)
		p, err := layout.Write(tmp, empty.Index)
		if err != nil {
			return nil, err
		}
		if err := p.AppendImage(img); err != nil {
			return nil, err
		}
		os.RemoveAll(cached)
		if err := os.Rename(tmp, cached); err != nil {
			return nil, err
		}
	}
	idx, err := layout.ImageIndexFromPath(cached)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		return nil, fmt.Errorf("cached base layout %s: %v (remove it)", cached, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, err
	}
	ls, err := img.Layers()
	if err != nil || len(ls) != 1 {
		return nil, fmt.Errorf("cached base layout %s: %v (remove it)", cached, err)
	}
	return ls[0], nil
}

// Image returns the test sandbox image with sandboxBinary as its server.
func Image(sandboxBinary string, log io.Writer) (v1.Image, error) {
	base, err := baseLayer(log)
	if err != nil {
		return nil, err
	}
	bin, err := binaryLayer(sandboxBinary)
	if err != nil {
		return nil, err
	}
	return withConfig(Config(), base, bin)
}

// PlainImage returns the userland alone, with cfg: an image that holds nothing of fusebox,
// as a template's image from elsewhere does.
func PlainImage(cfg v1.Config, log io.Writer) (v1.Image, error) {
	base, err := baseLayer(log)
	if err != nil {
		return nil, err
	}
	return withConfig(cfg, base)
}

// ShellessImage returns the userland without any shell (whiteouts of sh, dash, bash and rbash
// in /usr/bin, where Debian 12's merged /usr keeps them), with cfg: an image in which only
// argv commands run.
func ShellessImage(cfg v1.Config, log io.Writer) (v1.Image, error) {
	base, err := baseLayer(log)
	if err != nil {
		return nil, err
	}
	whiteouts := map[string][]byte{}
	for _, sh := range []string{"bash", "dash", "rbash", "sh"} {
		whiteouts["usr/bin/.wh."+sh] = nil
	}
	wh, err := tarLayer([]string{"usr/", "usr/bin/"}, whiteouts, 0o644)
	if err != nil {
		return nil, err
	}
	return withConfig(cfg, base, wh)
}

// withConfig returns an image of layers with cfg, for this machine's architecture, made at
// a fixed time (the same inputs make the same digest).
func withConfig(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: time.Unix(1767225600, 0)})
}

// WriteLayout writes to dir (which must not exist) an OCI image layout of the test sandbox
// image with sandboxBinary as its server, and returns the image's digest.
func WriteLayout(dir, sandboxBinary string, log io.Writer) (v1.Hash, error) {
	img, err := Image(sandboxBinary, log)
	if err != nil {
		return v1.Hash{}, err
	}
	return WriteImage(dir, img)
}

// WriteImage writes img to dir (which must not exist) as an OCI image layout of that one
// image, and returns its digest.
func WriteImage(dir string, img v1.Image) (v1.Hash, error) {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "sandbox"})); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// OSRelease returns /etc/os-release of the cached userland (following the usr/lib link
// Debian makes it), read from the archive itself.
func OSRelease(log io.Writer) (string, error) {
	rootTar, err := RootfsTar(log)
	if err != nil {
		return "", err
	}
	f, err := os.Open(rootTar)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	files := map[string]string{}
	links := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
		name := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		switch {
		case h.Typeflag == tar.TypeSymlink && name == "etc/os-release":
			links[name] = h.Linkname
		case h.Typeflag == tar.TypeReg && (name == "etc/os-release" || name == "usr/lib/os-release"):
			b, err := io.ReadAll(tr)
			if err != nil {
				return "", err
			}
			files[name] = string(b)
		}
	}
	if s, ok := files["etc/os-release"]; ok {
		return s, nil
	}
	if target, ok := links["etc/os-release"]; ok {
		p := strings.TrimPrefix(filepath.Clean(filepath.Join("/etc", target)), "/")
		if s, ok := files[p]; ok {
			return s, nil
		}
	}
	return "", errors.New("no etc/os-release in the userland archive")
}
