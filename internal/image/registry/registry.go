// Package registry pushes fusebox's images to an OCI distribution registry by digest and
// checks that digests are there. Credentials come from the Docker config and its credential
// helpers (go-containerregistry's default keychain); TLS verifies against the system roots
// plus an optional CA file; plain HTTP is allowed for loopback registries only.
package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Errors that callers test with errors.Is.
var (
	// ErrBadReference: the registry reference is malformed or has no repository path.
	ErrBadReference = errors.New("bad registry reference")
	// ErrInsecure: plain HTTP was asked for a registry that is not on loopback.
	ErrInsecure = errors.New("insecure registry refused")
	// ErrMissing: a digest is not in the registry.
	ErrMissing = errors.New("digest not in the registry")
)

// Registry is where images are pushed: HOST[:PORT]/PATH, with how to reach it.
type Registry struct {
	// Host is HOST[:PORT]; Path the repository path below it (never empty).
	Host, Path string
	opts       []name.Option
	remote     []remote.Option
}

// Options configure Open.
type Options struct {
	// CAFile is a PEM bundle trusted in addition to the system roots.
	CAFile string
	// Insecure uses plain HTTP; refused unless the host is loopback.
	Insecure bool
	// Keychain resolves credentials; nil means the Docker config and its credential helpers.
	Keychain authn.Keychain
}

// ParseReference splits HOST[:PORT]/PATH. A reference without a repository path, with a tag
// or a digest, or with characters a repository cannot hold, is refused with ErrBadReference.
func ParseReference(ref string) (host, path string, err error) {
	ref = strings.TrimSuffix(strings.TrimSpace(ref), "/")
	for _, scheme := range []string{"https://", "http://"} {
		if strings.HasPrefix(ref, scheme) {
			return "", "", fmt.Errorf("%w %q: give HOST[:PORT]/PATH without %s (use --insecure for plain HTTP on loopback)", ErrBadReference, ref, scheme)
		}
	}
	host, path, ok := strings.Cut(ref, "/")
	if !ok || path == "" || host == "" {
		return "", "", fmt.Errorf("%w %q: no repository path: give HOST[:PORT]/PATH, e.g. %s/fusebox, so the images go to HOST[:PORT]/PATH/manager, .../sandbox", ErrBadReference, ref, orDefault(host, "127.0.0.1:5000"))
	}
	if strings.ContainsAny(ref, "@") || strings.Contains(path, ":") {
		return "", "", fmt.Errorf("%w %q: a registry reference names a repository path, no tag or digest", ErrBadReference, ref)
	}
	if _, err := name.NewRepository(host + "/" + path + "/sandbox"); err != nil {
		return "", "", fmt.Errorf("%w %q: %v", ErrBadReference, ref, err)
	}
	return host, path, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// IsLoopback reports whether host (HOST[:PORT]) is localhost or a loopback address.
func IsLoopback(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Open prepares pushes and checks against the registry reference ref (HOST[:PORT]/PATH).
func Open(ctx context.Context, ref string, o Options) (*Registry, error) {
	host, path, err := ParseReference(ref)
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: host, Path: path}
	if r.opts, r.remote, err = Remote(ctx, host, o); err != nil {
		return nil, err
	}
	return r, nil
}

// Remote returns the go-containerregistry options that reach the registry at host
// (HOST[:PORT]) by o's policy: the name options (plain HTTP with o.Insecure, which is refused
// with ErrInsecure unless host is loopback) and the remote options (TLS verified against the
// system roots and o.CAFile, plain HTTP refused unless o.Insecure, credentials from
// o.Keychain), bound to ctx.
func Remote(ctx context.Context, host string, o Options) ([]name.Option, []remote.Option, error) {
	var opts []name.Option
	if o.Insecure {
		if !IsLoopback(host) {
			return nil, nil, fmt.Errorf("%w: --insecure (plain HTTP) is allowed for a loopback registry only, not %s: give its CA with --ca-file", ErrInsecure, host)
		}
		opts = append(opts, name.Insecure)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the registry CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("the CA file %s holds no PEM certificate", o.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	// go-containerregistry falls back to plain HTTP for loopback and private (RFC 1918)
	// registries when HTTPS fails: refuse that unless --insecure was given, so that a mirror
	// inside a VPC is never reached without TLS by accident.
	var rt http.RoundTripper = tr
	if !o.Insecure {
		rt = httpsOnly{tr}
	}
	kc := o.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	return opts, []remote.Option{remote.WithContext(ctx), remote.WithTransport(rt), remote.WithAuthFromKeychain(kc)}, nil
}

// String is HOST[:PORT]/PATH.
func (r *Registry) String() string { return r.Host + "/" + r.Path }

// Repository is the repository of image name: HOST[:PORT]/PATH/<name>.
func (r *Registry) Repository(image string) string { return r.String() + "/" + image }

// Reference is the digest reference of image name: HOST[:PORT]/PATH/<name>@sha256:....
func (r *Registry) Reference(image string, d v1.Hash) string {
	return r.Repository(image) + "@" + d.String()
}

// Push uploads img as HOST[:PORT]/PATH/<image> by digest (no tag) and returns its digest
// reference. Blobs the registry already has are not uploaded again.
func (r *Registry) Push(image string, img v1.Image) (string, error) {
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	ref, err := name.NewDigest(r.Reference(image, d), r.opts...)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadReference, err)
	}
	if err := remote.Write(ref, img, r.remote...); err != nil {
		return "", r.explain("pushing "+image+" to "+r.Repository(image), err)
	}
	return ref.String(), nil
}

// Check returns nil when the registry holds the manifest ref (REPOSITORY@sha256:...), an
// error wrapping ErrMissing when it answers that it has no such manifest, and another error
// when it cannot be asked.
func (r *Registry) Check(ref string) error {
	d, err := name.NewDigest(ref, r.opts...)
	if err != nil {
		return fmt.Errorf("%w %q: want REPOSITORY@sha256:<64 hex>: %v", ErrBadReference, ref, err)
	}
	if _, err := remote.Head(d, r.remote...); err != nil {
		var te *transport.Error
		if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s is not in registry %s (HTTP 404): push it first (fusebox image push or fusebox release)", ErrMissing, ref, d.RegistryStr())
		}
		return r.explain("checking "+ref, err)
	}
	return nil
}

// explain turns a registry error into one that names the registry and the HTTP status, and
// says what to do next.
func (r *Registry) explain(doing string, err error) error {
	var ue x509.UnknownAuthorityError
	var he x509.HostnameError
	if errors.As(err, &ue) || errors.As(err, &he) || strings.Contains(err.Error(), "x509: ") {
		return fmt.Errorf("%s: registry %s: its TLS certificate is not trusted (no HTTP response): pass its CA with --ca-file: %w", doing, r.Host, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		status := fmt.Sprintf("HTTP %d %s", te.StatusCode, http.StatusText(te.StatusCode))
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%s: registry %s answered %s: check the credentials for %s in the Docker config ($DOCKER_CONFIG/config.json, `docker login %s`): %w",
				doing, r.Host, status, r.Host, r.Host, err)
		}
		return fmt.Errorf("%s: registry %s answered %s: %w", doing, r.Host, status, err)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return fmt.Errorf("%s: registry %s is unreachable (no HTTP response): %w", doing, r.Host, err)
	}
	return fmt.Errorf("%s: registry %s: %w", doing, r.Host, err)
}

// Pull returns the image ref (REPOSITORY@sha256:...) from the registry.
func (r *Registry) Pull(ref string) (v1.Image, error) {
	d, err := name.NewDigest(ref, r.opts...)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadReference, ref, err)
	}
	img, err := remote.Image(d, r.remote...)
	if err != nil {
		return nil, r.explain("pulling "+ref, err)
	}
	return img, nil
}

// httpsOnly refuses plain HTTP requests.
type httpsOnly struct{ next http.RoundTripper }

func (h httpsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		return nil, fmt.Errorf("plain HTTP to %s refused (no --insecure)", req.URL.Host)
	}
	return h.next.RoundTrip(req)
}
