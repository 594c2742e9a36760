package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Annotations of the image's entry in its layout's index.json.
const (
	// AnnotationRefName is the OCI reference name: fusebox/<name>:latest.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// annotationContainerdName is the full name `ctr images import` gives the image.
	annotationContainerdName = "io.containerd.image.name"
	// SBOMFile is the SPDX document's name in each layout directory.
	SBOMFile = "sbom.spdx.json"
)

// RefName is the reference name a layout's index gives image name.
func RefName(name string) string { return "fusebox/" + name + ":latest" }

func goarch() string { return runtime.GOARCH }

// writeLayout writes img as the OCI layout out/<name>/ (and out/<name>.tar with withTar),
// through a temporary directory renamed into place.
func writeLayout(out, name string, img v1.Image, sb *imageSBOM, epoch time.Time, withTar bool) (Built, error) {
	digest, err := img.Digest()
	if err != nil {
		return Built{}, err
	}
	tmp, err := os.MkdirTemp(out, "."+name+".tmp-")
	if err != nil {
		return Built{}, err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return Built{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		AnnotationRefName:        RefName(name),
		annotationContainerdName: RefName(name),
	})); err != nil {
		return Built{}, err
	}
	doc, err := sb.document(epoch)
	if err != nil {
		return Built{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, SBOMFile), doc, 0o644); err != nil {
		return Built{}, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Built{}, err
	}
	dir := filepath.Join(out, name)
	old := dir + ".old"
	os.RemoveAll(old)
	if err := os.Rename(dir, old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Built{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Built{}, err
	}
	os.RemoveAll(old)
	b := Built{Name: name, Digest: digest, Dir: dir, SBOM: filepath.Join(dir, SBOMFile)}
	if b.Size, err = imageSize(img); err != nil {
		return Built{}, err
	}
	if withTar {
		b.Tar = filepath.Join(out, name+".tar")
		if err := tarDir(dir, b.Tar, epoch); err != nil {
			return Built{}, fmt.Errorf("writing %s: %w", b.Tar, err)
		}
	}
	return b, nil
}

func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n := m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	raw, err := img.RawManifest()
	return n + int64(len(raw)), err
}

// tarDir archives dir (an OCI layout) into dst reproducibly: sorted entries, times at epoch,
// root-owned. Written to a temporary file and renamed.
func tarDir(dir, dst string, epoch time.Time) error {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	slices.Sort(paths)
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Format: tar.FormatPAX, Mode: 0o644}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// sha256Hex is the SHA-256 of data in lowercase hex.
func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// ErrNotLayout is wrapped when a directory is not an image layout that Build wrote.
var ErrNotLayout = errors.New("not an OCI image layout")

// Load opens the image of the OCI layout dir: a layout with exactly one image manifest in its
// index.json, as Build writes them.
func Load(dir string) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return nil, fmt.Errorf("%w: %s has no oci-layout file: pass a directory that fusebox image build wrote (e.g. bin/images/sandbox)", ErrNotLayout, dir)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotLayout, dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: index.json: %v", ErrNotLayout, dir, err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsImage() {
		return nil, fmt.Errorf("%w: %s: index.json holds %d entries, want one image manifest", ErrNotLayout, dir, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotLayout, dir, err)
	}
	return img, nil
}

// LoadAll opens the layouts of names under dir (dir/<name>/).
func LoadAll(dir string, names []string) (map[string]v1.Image, error) {
	if err := CheckNames(names); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory: run fusebox image build --out %s first", ErrNotLayout, dir, dir)
	}
	imgs := map[string]v1.Image{}
	for _, n := range names {
		img, err := Load(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		imgs[n] = img
	}
	return imgs, nil
}
