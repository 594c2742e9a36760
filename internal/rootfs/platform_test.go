package rootfs

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// otherArch is an architecture this machine does not run.
func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}

// withPlatform is img with its config naming os/arch.
func withPlatform(t *testing.T, img v1.Image, os, arch string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = os, arch
	out, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An image for another architecture is refused before anything is unpacked, naming both
// platforms; the cache holds nothing of it.
func TestUnpackRefusesAnotherPlatform(t *testing.T) {
	img := withPlatform(t, image(t, v1.Config{}, layer(t, file("bin/tool", "ELF"))), "linux", otherArch())
	cache := filepath.Join(t.TempDir(), "rootfs")
	_, err := Unpack(context.Background(), img, cache, nil)
	if !errors.Is(err, ErrPlatform) || !strings.Contains(err.Error(), "linux/"+otherArch()) || !strings.Contains(err.Error(), "linux/"+runtime.GOARCH) {
		t.Fatalf("Unpack of a linux/%s image: %v, want ErrPlatform naming both platforms", otherArch(), err)
	}
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if e.Name() != lockFile {
			t.Errorf("the refused image left %s in the cache", e.Name())
		}
	}
	if _, err := Unpack(context.Background(), withPlatform(t, img, "windows", runtime.GOARCH), cache, nil); !errors.Is(err, ErrPlatform) {
		t.Errorf("a windows image: %v", err)
	}
	if _, err := Unpack(context.Background(), withPlatform(t, img, "linux", runtime.GOARCH), cache, nil); err != nil {
		t.Errorf("the same image for this machine: %v", err)
	}
}

// A multi-platform index pulled by its digest gives this machine's image.
func TestPrepareResolvesAnIndex(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	mine := withPlatform(t, image(t, v1.Config{}, layer(t, file("etc/arch", runtime.GOARCH))), "linux", runtime.GOARCH)
	other := withPlatform(t, image(t, v1.Config{}, layer(t, file("etc/arch", otherArch()))), "linux", otherArch())
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch()}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.ParseReference(host + "/team/tool:multi")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	h, _ := idx.Digest()
	src, err := ParseSource(host + "/team/tool@" + h.String())
	if err != nil {
		t.Fatal(err)
	}
	src.Keychain = anonymous{}
	r, err := Prepare(context.Background(), src, filepath.Join(t.TempDir(), "rootfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(r.Dir, "etc/arch")); got != runtime.GOARCH {
		t.Fatalf("the index gave the image for %q", got)
	}
}

// A registry that answers a digest with another manifest is refused: the digest is checked.
func TestPrepareChecksTheDigest(t *testing.T) {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var swap struct{ from, to string }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if swap.from != "" && strings.HasSuffix(r.URL.Path, "/manifests/"+swap.from) {
			r.URL.Path = strings.TrimSuffix(r.URL.Path, swap.from) + swap.to
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	a := image(t, v1.Config{}, layer(t, file("etc/which", "a")))
	b := image(t, v1.Config{}, layer(t, file("etc/which", "b")))
	for tag, img := range map[string]v1.Image{"a": a, "b": b} {
		ref, err := name.ParseReference(host + "/team/tool:" + tag)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
	}
	ha, _ := a.Digest()
	hb, _ := b.Digest()
	swap.from, swap.to = ha.String(), hb.String()
	src, err := ParseSource(host + "/team/tool@" + ha.String())
	if err != nil {
		t.Fatal(err)
	}
	src.Keychain = anonymous{}
	cache := filepath.Join(t.TempDir(), "rootfs")
	if _, err = Prepare(context.Background(), src, cache, nil); !errors.Is(err, ErrDigest) || !strings.Contains(err.Error(), ha.Hex[:12]) || strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("a manifest that is not the digest's: %v, want an error naming the digest", err)
	}
	if entries, _ := os.ReadDir(cache); len(entries) > 1 {
		t.Errorf("the refused image left %d entries in the cache", len(entries))
	}
}
