// Package registry_test pushes images to a real OCI distribution registry (Debian's
// docker-registry on loopback, htpasswd authentication, TLS from a test CA) and pulls them
// back, and checks the errors of wrong credentials, an untrusted certificate, a registry
// that is down and a digest the registry lacks.
package registry_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/image/registry"
	"github.com/fusebox-dev/fusebox/internal/image/registry/registrytest"
)

// testLayout writes a random image as an OCI layout and loads it as push does.
func testLayout(t *testing.T) v1.Image {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sandbox")
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	loaded, err := image.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

func TestPushPullRoundTrip(t *testing.T) {
	reg := registrytest.Start(t)
	t.Setenv("DOCKER_CONFIG", reg.DockerConfig)
	img := testLayout(t)
	r, err := registry.Open(context.Background(), reg.Host+"/fusebox", registry.Options{CAFile: reg.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := r.Push("sandbox", img)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	if want := reg.Host + "/fusebox/sandbox@" + d.String(); ref != want {
		t.Fatalf("pushed %s, want %s", ref, want)
	}
	if err := r.Check(ref); err != nil {
		t.Fatalf("check after push: %v", err)
	}
	// Pull it back with the same credentials and CA: same manifest, same layers.
	pr, err := registry.Open(context.Background(), reg.Host+"/fusebox", registry.Options{CAFile: reg.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := pr.Pull(ref)
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := pulled.Digest()
	if pd != d {
		t.Fatalf("pulled %s, pushed %s", pd, d)
	}
	want, _ := img.Layers()
	got, err := pulled.Layers()
	if err != nil || len(got) != len(want) {
		t.Fatalf("pulled layers %d (%v), want %d", len(got), err, len(want))
	}
	for i := range got {
		gd, err := got[i].Digest()
		wd, _ := want[i].Digest()
		if err != nil || gd != wd {
			t.Errorf("layer %d: %s, want %s (%v)", i, gd, wd, err)
		}
		// Read the blob: the registry serves the bytes, not only the manifest.
		rc, err := got[i].Compressed()
		if err != nil {
			t.Fatal(err)
		}
		rc.Close()
	}
	// Without credentials the registry refuses the pull.
	anon, _ := name.NewDigest(ref)
	if _, err := remote.Image(anon, remote.WithAuth(authn.Anonymous), remote.WithTransport(caTransport(t, reg.CAFile))); err == nil {
		t.Error("anonymous pull accepted: the registry has no authentication")
	}
	// A digest the registry lacks.
	missing := reg.Host + "/fusebox/sandbox@sha256:" + strings.Repeat("0", 64)
	if err := r.Check(missing); !errors.Is(err, registry.ErrMissing) || !reg.Is(err.Error()) || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("check of a missing digest: %v", err)
	}
}

func TestPushErrors(t *testing.T) {
	reg := registrytest.Start(t)
	img := testLayout(t)
	push := func(o registry.Options) error {
		r, err := registry.Open(context.Background(), reg.Host+"/fusebox", o)
		if err != nil {
			return err
		}
		_, err = r.Push("sandbox", img)
		return err
	}
	t.Run("wrong credentials", func(t *testing.T) {
		dir := t.TempDir()
		registrytest.WriteDockerConfig(t, dir, reg.Host, registrytest.User, "wrong")
		t.Setenv("DOCKER_CONFIG", dir)
		err := push(registry.Options{CAFile: reg.CAFile})
		if err == nil || !reg.Is(err.Error()) || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "credentials") {
			t.Fatalf("push with a wrong password: %v, want an error naming %s, HTTP 401 and the credentials", err, reg.Host)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		t.Setenv("DOCKER_CONFIG", reg.DockerConfig)
		err := push(registry.Options{})
		if err == nil || !reg.Is(err.Error()) || !strings.Contains(err.Error(), "--ca-file") {
			t.Fatalf("push without the CA: %v, want an error naming %s and --ca-file", err, reg.Host)
		}
	})
	t.Run("registry down", func(t *testing.T) {
		t.Setenv("DOCKER_CONFIG", reg.DockerConfig)
		reg.Stop()
		err := push(registry.Options{CAFile: reg.CAFile})
		if err == nil || !reg.Is(err.Error()) || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("push to a stopped registry: %v, want an error naming %s as unreachable", err, reg.Host)
		}
	})
}

func caTransport(t *testing.T, caFile string) *http.Transport {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
}

// BenchmarkPush pushes the layouts in $FUSEBOX_BENCH_LAYOUT (fusebox image build --out) to
// the test registry over TLS with authentication, each iteration into a new repository path
// so that every blob is uploaded, and reports the time and the bytes pushed.
//
//	FUSEBOX_BENCH_LAYOUT=bin/images go test -run '^$' -bench Push -benchtime 1x ./test/registry/
func BenchmarkPush(b *testing.B) {
	dir := os.Getenv("FUSEBOX_BENCH_LAYOUT")
	if dir == "" {
		b.Skip("FUSEBOX_BENCH_LAYOUT is not set (a directory that fusebox image build wrote)")
	}
	imgs, err := image.LoadAll(dir, image.Names)
	if err != nil {
		b.Fatal(err)
	}
	var bytes int64
	for _, img := range imgs {
		m, _ := img.Manifest()
		for _, l := range m.Layers {
			bytes += l.Size
		}
	}
	reg := registrytest.Start(b)
	b.Setenv("DOCKER_CONFIG", reg.DockerConfig)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := registry.Open(context.Background(), reg.Host+"/bench"+strconv.Itoa(i), registry.Options{CAFile: reg.CAFile})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range image.Names {
			ref, err := r.Push(n, imgs[n])
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Check(ref); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/push")
	b.ReportMetric(float64(bytes)/(1<<20), "MiB")
}
