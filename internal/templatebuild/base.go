package templatebuild

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/rootfs"
)

// base is the resolved FROM image.
type base struct {
	img          v1.Image
	cf           *v1.ConfigFile
	digest       v1.Hash
	configDigest v1.Hash
	// pinned is the image as pinned by digest: REF@sha256:... or DIR@sha256:....
	pinned string
	// root is its unpacked root, shared read-only with other builds and sandboxes.
	root *rootfs.Root
}

// resolveBase pins the FROM image by digest (resolving a tag or an unpinned layout once),
// and unpacks it under the cache.
func resolveBase(ctx context.Context, from string, line int, o Options) (*base, error) {
	if from == "scratch" {
		return nil, &dockerfile.Error{Line: line, Err: dockerfile.ErrUnsupported,
			Msg: "FROM scratch is not supported: start from an image with a root filesystem"}
	}
	src, err := rootfs.ParseSource(from)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: FROM: %w", line, err)
	}
	src.Keychain = o.Keychain
	img, err := src.Image(ctx)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: FROM: %w", line, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: FROM %s: reading the image's digest: %w", line, from, err)
	}
	b := &base{img: img, digest: digest, pinned: from}
	if _, pinned := src.Digest(); !pinned {
		if src.Ref != nil {
			d := src.Ref.Context().Digest(digest.String())
			src.Ref, b.pinned = d, d.String()
		} else {
			src.Pin, b.pinned = digest, src.Dir+"@"+digest.String()
		}
		src.Arg = b.pinned
		fmt.Fprintf(o.Progress, "FROM %s: resolved to %s (pin it in the Dockerfile to build the same image again)\n", from, b.pinned)
	} else {
		fmt.Fprintf(o.Progress, "FROM %s\n", from)
	}
	if d, ok := src.Ref.(name.Digest); ok && d.DigestStr() != digest.String() {
		// A pinned index resolves to this platform's image.
		fmt.Fprintf(o.Progress, "FROM %s: this platform's image is %s\n", from, digest)
	}
	if b.cf, err = img.ConfigFile(); err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: FROM %s: reading the image's config: %w", line, from, err)
	}
	if b.configDigest, err = img.ConfigName(); err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: FROM %s: reading the image's config: %w", line, from, err)
	}
	if b.root, err = rootfs.Prepare(ctx, src, filepath.Join(o.CacheDir, "base"), nil); err != nil {
		return nil, fmt.Errorf("Dockerfile:%d: FROM %s: %w", line, from, err)
	}
	if b.root.Digest != digest {
		return nil, fmt.Errorf("Dockerfile:%d: FROM %s: unpacked image %s, not %s", line, from, b.root.Digest, digest)
	}
	return b, nil
}
