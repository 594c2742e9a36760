// Package rootfs turns an OCI image into a root filesystem that gVisor sandboxes share
// read-only: the image (an OCI image layout directory, or a reference pulled from a
// registry) is flattened with its whiteouts applied and unpacked once into a directory named
// by its manifest digest, which every sandbox of that image then uses as its root.
//
// An unpacked root is made in a temporary directory and renamed into place only when
// complete, so a root that exists is whole; unpackers of one cache directory take turns
// (a lock file), and a temporary directory left by an interrupted unpack is removed by the
// next one. Roots of images no longer in use stay until removed by hand.
package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Errors a Source's image can fail with, for errors.Is.
var (
	// ErrNotLayout: a directory that is not an OCI image layout.
	ErrNotLayout = errors.New("not an OCI image layout")
	// ErrNoRepository: a registry reference without a repository path.
	ErrNoRepository = errors.New("registry reference without a repository path")
	// ErrPull: the registry refused or could not be reached.
	ErrPull = errors.New("pulling the image failed")
	// ErrPlatform: the image is for another operating system or architecture than this
	// machine's (linux/GOARCH), whose gVisor could not run its programs.
	ErrPlatform = errors.New("image for another platform")
	// ErrDigest: what a registry served for a digest is not that digest's content.
	ErrDigest = errors.New("content does not match its digest")
)

// refNameAnnotation names a manifest of an image layout's index.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Source is where an image comes from: an OCI image layout directory, or a registry
// reference (HOST[:PORT]/PATH@sha256:... or HOST[:PORT]/PATH[:TAG]).
type Source struct {
	// Arg is what the user gave.
	Arg string
	// Dir is the layout directory's absolute path; empty for a reference.
	Dir string
	// Ref is the parsed reference; nil for a layout.
	Ref name.Reference
	// Pin, for a layout given as DIR@sha256:HEX, is the manifest to use (the layout may hold
	// several); its digest is checked when read.
	Pin v1.Hash
	// Keychain resolves registry credentials; nil means authn.DefaultKeychain (the
	// Docker config and its credential helpers).
	Keychain authn.Keychain
}

// ParseSource interprets arg as an existing directory (which must be an OCI image layout)
// or, if no such path exists, as a registry reference that names its registry host and a
// repository path. It checks the layout's marker file or the reference's syntax; it reads no
// image.
func ParseSource(arg string) (*Source, error) {
	if arg == "" {
		return nil, errors.New("no image given: pass an OCI image layout directory or a registry reference HOST[:PORT]/PATH@sha256:DIGEST")
	}
	if info, err := os.Stat(arg); err == nil {
		dir, err := filepath.Abs(arg)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			return nil, fmt.Errorf("image %s: %w: it is a file, not a directory; pass the layout directory that `fusebox image build --out DIR` writes (DIR/sandbox)", arg, ErrNotLayout)
		}
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return nil, fmt.Errorf("image %s: %w: it has no oci-layout file; build one with `fusebox image build --image sandbox --out DIR` and pass DIR/sandbox", arg, ErrNotLayout)
		}
		if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
			return nil, fmt.Errorf("image %s: %w: it has no index.json; rebuild it with `fusebox image build --image sandbox --out DIR`", arg, ErrNotLayout)
		}
		return &Source{Arg: arg, Dir: dir}, nil
	}
	if dir, digest, ok := strings.Cut(arg, "@"); ok && strings.HasPrefix(arg, "/") {
		pin, err := v1.NewHash(digest)
		if err != nil {
			return nil, fmt.Errorf("image %s: %q is not a digest (want sha256:HEX): %v", arg, digest, err)
		}
		s, err := ParseSource(dir)
		if err != nil {
			return nil, err
		}
		if s.Dir == "" {
			return nil, fmt.Errorf("image %s: no such directory", arg)
		}
		s.Arg, s.Pin = arg, pin
		return s, nil
	}
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return nil, fmt.Errorf("image %s: no such directory; build the layout with `fusebox image build --image sandbox --out DIR` and pass DIR/sandbox", arg)
	}
	host, path, _ := strings.Cut(arg, "/")
	repo, _, _ := strings.Cut(path, "@")
	if i := strings.LastIndex(repo, ":"); i >= 0 {
		repo = repo[:i]
	}
	if !strings.ContainsAny(host, ".:") && host != "localhost" {
		return nil, fmt.Errorf("image %s: neither an existing directory nor a registry reference HOST[:PORT]/PATH@sha256:DIGEST (its first part %q names no registry host)", arg, host)
	}
	if repo == "" {
		return nil, fmt.Errorf("image %s: %w: want HOST[:PORT]/PATH@sha256:DIGEST or HOST[:PORT]/PATH:TAG", arg, ErrNoRepository)
	}
	ref, err := name.ParseReference(arg)
	if err != nil {
		return nil, fmt.Errorf("image %s: not a valid registry reference (want HOST[:PORT]/PATH@sha256:DIGEST or HOST[:PORT]/PATH:TAG): %w", arg, err)
	}
	return &Source{Arg: arg, Ref: ref}, nil
}

// String is what the user gave.
func (s *Source) String() string { return s.Arg }

// Digest is the digest the source pins without reading anything: a reference by digest's, or
// a pinned layout's manifest.
func (s *Source) Digest() (v1.Hash, bool) {
	if s.Pin != (v1.Hash{}) {
		return s.Pin, true
	}
	if d, ok := s.Ref.(name.Digest); ok {
		if h, err := v1.NewHash(d.DigestStr()); err == nil {
			return h, true
		}
	}
	return v1.Hash{}, false
}

// Image returns the source's image. For a layout it reads the index (which must hold one
// image manifest); for a reference it fetches the manifest from the registry. Layers are
// read only when unpacked.
func (s *Source) Image(ctx context.Context) (v1.Image, error) {
	if s.Ref == nil {
		return s.layoutImage()
	}
	kc := s.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	// A multi-platform index resolves to this machine's image.
	img, err := remote.Image(s.Ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithPlatform(hostPlatform))
	if err != nil {
		return nil, s.pullError(err)
	}
	return img, nil
}

// layoutImage returns the one image manifest of the layout's index.
func (s *Source) layoutImage() (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w: reading index.json: %v", s.Arg, ErrNotLayout, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w: reading index.json: %v", s.Arg, ErrNotLayout, err)
	}
	var found []v1.Descriptor
	for _, d := range im.Manifests {
		if d.MediaType == types.OCIManifestSchema1 || d.MediaType == types.DockerManifestSchema2 {
			found = append(found, d)
		}
	}
	if s.Pin != (v1.Hash{}) {
		return s.pinnedImage(idx, found)
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("image %s: %w: index.json lists no image manifest", s.Arg, ErrNotLayout)
	case 1:
	default:
		var names []string
		for _, d := range found {
			names = append(names, d.Annotations[refNameAnnotation]+"@"+d.Digest.String())
		}
		return nil, fmt.Errorf("image %s: the layout holds %d images (%s); pass a layout of one image, such as DIR/sandbox of `fusebox image build --out DIR`", s.Arg, len(found), strings.Join(names, ", "))
	}
	img, err := idx.Image(found[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: reading manifest %s: %w", s.Arg, found[0].Digest, err)
	}
	return img, nil
}

// pinnedImage returns the image manifest of the layout whose digest is s.Pin, after checking
// the manifest's bytes against it.
func (s *Source) pinnedImage(idx v1.ImageIndex, found []v1.Descriptor) (v1.Image, error) {
	if !slices.ContainsFunc(found, func(d v1.Descriptor) bool { return d.Digest == s.Pin }) {
		return nil, fmt.Errorf("image %s: the layout's index.json lists no image manifest %s", s.Arg, s.Pin)
	}
	img, err := idx.Image(s.Pin)
	if err != nil {
		return nil, fmt.Errorf("image %s: reading manifest %s: %w", s.Arg, s.Pin, err)
	}
	if h, err := img.Digest(); err != nil || h != s.Pin {
		return nil, fmt.Errorf("image %s: manifest %s does not match its digest (got %v, %v)", s.Arg, s.Pin, h, err)
	}
	return img, nil
}

// pullError describes a failed registry request: the registry, and the HTTP status or why it
// could not be reached.
func (s *Source) pullError(err error) error {
	reg := s.Ref.Context().RegistryStr()
	var te *transport.Error
	if errors.As(err, &te) {
		return fmt.Errorf("%w: pulling %s from registry %s: HTTP %d: %v", ErrPull, s.Arg, reg, te.StatusCode, err)
	}
	if strings.Contains(err.Error(), "does not match requested digest") {
		// go-containerregistry checks a manifest fetched by digest (with no sentinel error).
		return fmt.Errorf("%w: %w: pulling %s from registry %s: %v", ErrPull, ErrDigest, s.Arg, reg, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pulling %s from registry %s: %w", s.Arg, reg, err)
	}
	return fmt.Errorf("%w: pulling %s from registry %s (unreachable?): %v", ErrPull, s.Arg, reg, err)
}

// hostPlatform is the platform this machine's sandboxes run.
var hostPlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// checkPlatform refuses an image whose config names another OS or architecture than
// hostPlatform (ErrPlatform). An image that names none is taken as it is.
func checkPlatform(cf *v1.ConfigFile) error {
	if (cf.OS != "" && cf.OS != hostPlatform.OS) || (cf.Architecture != "" && cf.Architecture != hostPlatform.Architecture) {
		return fmt.Errorf("%w: the image is for %s/%s, this machine runs %s/%s", ErrPlatform, cf.OS, cf.Architecture, hostPlatform.OS, hostPlatform.Architecture)
	}
	return nil
}
