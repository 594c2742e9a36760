package templatebuild

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

// PushOptions say how Push reaches the registry, with the policy of `fusebox image push`
// (package registry): TLS verified against the system roots and CAFile, plain HTTP only when
// asked for and only to a loopback registry.
type PushOptions struct {
	// CAFile is a PEM bundle trusted for the registry's certificate besides the system roots.
	CAFile string
	// Insecure uses plain HTTP; refused unless the registry is on loopback.
	Insecure bool
	// Keychain resolves credentials; nil means the Docker config and its credential helpers.
	Keychain authn.Keychain
}

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
	if err := checkInsecure(repo, o); err != nil {
		return "", err
	}
	var nameOpts []name.Option
	if o.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.NewRepository(repo, nameOpts...)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", ErrBadPushReference, ref, err)
	}
	tr, err := pushTransport(o)
	if err != nil {
		return "", err
	}
	kc := o.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr), remote.WithAuthFromKeychain(kc)}
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

// CheckPush checks what Push will be given, before a build: a reference Push takes, and plain
// HTTP only for a loopback registry.
func CheckPush(ref string, o PushOptions) error {
	repo, _, err := parsePushReference(ref)
	if err != nil {
		return err
	}
	return checkInsecure(repo, o)
}

// checkInsecure refuses plain HTTP to a registry that is not on loopback.
func checkInsecure(repo string, o PushOptions) error {
	host, _, _ := strings.Cut(repo, "/")
	if o.Insecure && !registry.IsLoopback(host) {
		return fmt.Errorf("%w: plain HTTP is allowed for a loopback registry only, not %s: give its CA instead", registry.ErrInsecure, host)
	}
	return nil
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

// pushTransport is the registry's transport: CAFile trusted besides the system roots, and
// plain HTTP refused unless o.Insecure (go-containerregistry falls back to it for loopback
// and private registries when HTTPS fails).
func pushTransport(o PushOptions) (http.RoundTripper, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the registry CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the CA file %s holds no PEM certificate", o.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if o.Insecure {
		return tr, nil
	}
	return httpsOnly{tr}, nil
}

// httpsOnly refuses plain HTTP requests.
type httpsOnly struct{ next http.RoundTripper }

func (h httpsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		return nil, fmt.Errorf("plain HTTP to %s refused (not asked for as insecure)", req.URL.Host)
	}
	return h.next.RoundTrip(req)
}
