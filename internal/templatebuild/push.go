package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

// PushOptions say how Push reaches the registry, with the policy of `fusebox image push`
// (registry.Remote): TLS verified against the system roots and CAFile, plain HTTP only when
// asked for (Insecure) and only to a loopback registry, credentials from Keychain (nil: the
// Docker config and its credential helpers).
type PushOptions = registry.Options

// ErrBadPushReference is wrapped by Push's error for a reference it does not take.
var ErrBadPushReference = errors.New("bad push reference")

// Push uploads the image res names, read back from its layout, to ref (REGISTRY/REPO or
// REGISTRY/REPO:TAG; the registry must be named, there is no default one), by digest and,
// with a tag, under it too. It checks that the registry then holds the digest, and returns
// the image's reference by digest, REGISTRY/REPO@sha256:..., which a templates file takes.
func Push(ctx context.Context, res *Result, ref string, o PushOptions) (string, error) {
	repo, tag, err := parsePushReference(ref)
	if err != nil {
		return "", err
	}
	host, _, _ := strings.Cut(repo, "/")
	nameOpts, ropts, err := registry.Remote(ctx, host, o)
	if err != nil {
		return "", err
	}
	r, err := name.NewRepository(repo, nameOpts...)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", ErrBadPushReference, ref, err)
	}
	img, err := layout.Path(res.Dir).Image(res.Digest)
	if err != nil {
		return "", fmt.Errorf("reading the built image from %s: %w", res.Dir, err)
	}
	d := r.Digest(res.Digest.String())
	if err := remote.Write(d, img, ropts...); err != nil {
		return "", fmt.Errorf("pushing %s to %s: %w", res.Digest, r, err)
	}
	if tag != "" {
		if err := remote.Tag(r.Tag(tag), img, ropts...); err != nil {
			return "", fmt.Errorf("tagging %s as %s:%s: %w", res.Digest, r, tag, err)
		}
	}
	if _, err := remote.Head(d, ropts...); err != nil {
		return "", fmt.Errorf("checking %s after the push: %w", d, err)
	}
	return d.String(), nil
}

// CheckPush checks what Push will be given, before a build: a reference Push takes, plain
// HTTP only for a loopback registry, and a CA file that holds a certificate.
func CheckPush(ref string, o PushOptions) error {
	repo, _, err := parsePushReference(ref)
	if err != nil {
		return err
	}
	host, _, _ := strings.Cut(repo, "/")
	_, _, err = registry.Remote(context.Background(), host, o)
	return err
}

// parsePushReference splits REGISTRY/REPO[:TAG] into REGISTRY/REPO and the tag.
func parsePushReference(ref string) (repo, tag string, err error) {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrBadPushReference, ref, why) }
	if strings.Contains(ref, "://") {
		return "", "", bad("want REGISTRY/REPO[:TAG], without a scheme")
	}
	if strings.Contains(ref, "@") {
		return "", "", bad("the image is pushed by its digest: give REGISTRY/REPO[:TAG], without one")
	}
	host, path, ok := strings.Cut(ref, "/")
	if !ok || path == "" || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return "", "", bad("want REGISTRY/REPO[:TAG] naming the registry (such as 127.0.0.1:5000/templates/python:3.12)")
	}
	repo = ref
	if i := strings.LastIndexByte(path, ':'); i >= 0 {
		repo, tag = host+"/"+path[:i], path[i+1:]
		if _, err := name.NewTag(repo + ":" + tag); err != nil || tag == "" {
			return "", "", bad(fmt.Sprintf("tag %q: letters, digits, _ . and -, at most 128", tag))
		}
	}
	return repo, tag, nil
}
