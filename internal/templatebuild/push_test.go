package templatebuild_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/fusebox-dev/fusebox/internal/image/registry"
	"github.com/fusebox-dev/fusebox/internal/image/registry/registrytest"
	"github.com/fusebox-dev/fusebox/internal/templatebuild"
)

// A built image pushed to a real registry (TLS from a test CA, htpasswd credentials) and
// pulled back by the printed reference has the same digest; the tag names it too.
func TestPush(t *testing.T) {
	reg := registrytest.Start(t)
	t.Setenv("DOCKER_CONFIG", reg.DockerConfig)
	// COPY only: nothing runs, runsc is never called.
	bin, _ := fakeRunsc(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{"app.txt": "app\n"})
	o := templatebuild.Options{DockerfileData: []byte("FROM " + baseImage(t) + "\nCOPY app.txt /app.txt\n"), Context: ctxDir,
		Tag: "app", Out: filepath.Join(t.TempDir(), "out"), CacheDir: sharedCache, Runsc: bin}
	res, err := build(t, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	ref, err := templatebuild.Push(t.Context(), res, reg.Host+"/templates/app:v1", templatebuild.PushOptions{CAFile: reg.CAFile})
	if err != nil {
		t.Fatalf("Push: %v", err)
	}
	if want := reg.Host + "/templates/app@" + res.Digest.String(); ref != want {
		t.Errorf("Push = %s, want %s", ref, want)
	}
	r, err := registry.Open(t.Context(), reg.Host+"/templates", registry.Options{CAFile: reg.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	img, err := r.Pull(ref)
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	if d, err := img.Digest(); err != nil || d != res.Digest {
		t.Errorf("pulled digest %s, %v; want %s", d, err, res.Digest)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Errorf("pulled image has %d layers, %v; want the base's and the COPY's", len(layers), err)
	}
	for _, l := range layers { // the registry serves the blobs, not only the manifest
		if _, err := l.Digest(); err != nil {
			t.Error(err)
		}
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		rc.Close()
	}
	pem, err := os.ReadFile(reg.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tag, _ := name.NewTag(reg.Host + "/templates/app:v1")
	desc, err := remote.Head(tag, remote.WithContext(t.Context()), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithTransport(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}))
	if err != nil || desc.Digest != res.Digest {
		t.Errorf("tag v1 = %v, %v; want %s", desc, err, res.Digest)
	}

	t.Run("untrusted certificate", func(t *testing.T) {
		_, err := templatebuild.Push(t.Context(), res, reg.Host+"/templates/other", templatebuild.PushOptions{})
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("Push without the CA = %v, want a certificate error", err)
		}
	})
	// Plain HTTP only when asked for: a plain-HTTP server on loopback (which is where
	// go-containerregistry would fall back to it by itself) gets no request otherwise.
	t.Run("plain HTTP only when asked for", func(t *testing.T) {
		var hits atomic.Int64
		plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			http.Error(w, "no", http.StatusForbidden)
		}))
		defer plain.Close()
		host := strings.TrimPrefix(plain.URL, "http://")
		if _, err := templatebuild.Push(t.Context(), res, host+"/templates/app", templatebuild.PushOptions{}); err == nil {
			t.Error("Push to a plain-HTTP registry succeeded")
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the plain-HTTP registry got %d requests without Insecure", n)
		}
		if _, err := templatebuild.Push(t.Context(), res, host+"/templates/app", templatebuild.PushOptions{Insecure: true}); err == nil {
			t.Error("Push to a registry that refuses succeeded")
		}
		if hits.Load() == 0 {
			t.Error("the plain-HTTP registry got no request with Insecure")
		}
		_, err := templatebuild.Push(t.Context(), res, "registry.example.com/templates/app", templatebuild.PushOptions{Insecure: true})
		if !errors.Is(err, registry.ErrInsecure) {
			t.Errorf("Insecure to a registry off loopback = %v, want ErrInsecure", err)
		}
	})
}
