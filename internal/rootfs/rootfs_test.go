package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one archive entry of a test layer.
type entry struct {
	name, link, body string
	typ              byte
	mode             int64
	uid, gid         int
}

func file(name, body string) entry {
	return entry{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func dir(name string, mode int64) entry {
	return entry{name: name, typ: tar.TypeDir, mode: mode}
}
func symlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// tarOf returns the archive of entries, in order.
func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Size: int64(len(e.body)), ModTime: epoch, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer returns an image layer holding entries.
func layer(t testing.TB, entries ...entry) v1.Layer {
	t.Helper()
	data := tarOf(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// image returns an image of layers (bottom first) with config cfg.
func image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestUnpackAppliesLayersAndWhiteouts(t *testing.T) {
	base := layer(t,
		dir("./", 0o755),
		dir("a/", 0o755), file("a/keep", "v1"), file("a/gone", "x"), file("a/target", "t"),
		dir("d/", 0o755), file("d/x", "x"), file("d/y", "y"),
		dir("gone-dir/", 0o755), file("gone-dir/f", "f"),
		symlink("abs", "/a/keep"), symlink("rel", "a/keep"),
		entry{name: "hard", link: "a/target", typ: tar.TypeLink, mode: 0o644},
		entry{name: "suid", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o4755},
		entry{name: "sgid-dir/", typ: tar.TypeDir, mode: 0o2775},
		dir("tmp/", 0o1777),
		dir("ro/", 0o555), file("ro/f", "in a read-only directory"),
		dir("dev/", 0o755), entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		entry{name: "fifo", typ: tar.TypeFifo, mode: 0o644},
		entry{name: "owned", body: "o", typ: tar.TypeReg, mode: 0o640, uid: 1234, gid: 5678},
	)
	upper := layer(t,
		dir("a/", 0o755), file("a/keep", "v2"), file("a/.wh.gone", ""),
		dir("d/", 0o755), file("d/.wh..wh..opq", ""), file("d/new", "n"),
		file(".wh.gone-dir", ""),
		dir("usr/local/bin/", 0o755), entry{name: "usr/local/bin/server", body: "ELF", typ: tar.TypeReg, mode: 0o755},
	)
	img := image(t, v1.Config{Entrypoint: []string{"/usr/local/bin/server"}, User: "65532:65532"}, base, upper)
	cache := filepath.Join(t.TempDir(), "rootfs")
	r, err := Unpack(context.Background(), img, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if r.Digest != want || r.Dir != filepath.Join(cache, want.Hex, "root") {
		t.Fatalf("root %+v, want digest %s under %s", r, want, cache)
	}
	if !slices.Equal(r.Config.Entrypoint, []string{"/usr/local/bin/server"}) || r.Config.User != "65532:65532" {
		t.Fatalf("config %+v", r.Config)
	}
	root := r.Dir
	for p, body := range map[string]string{"a/keep": "v2", "a/target": "t", "hard": "t", "d/new": "n", "ro/f": "in a read-only directory", "usr/local/bin/server": "ELF"} {
		if got := readFile(t, filepath.Join(root, p)); got != body {
			t.Errorf("%s = %q, want %q", p, got, body)
		}
	}
	for _, p := range []string{"a/gone", "d/x", "d/y", "gone-dir", "dev/null", "fifo"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it absent", p, err)
		}
	}
	for p, target := range map[string]string{"abs": "/a/keep", "rel": "a/keep"} {
		if got, err := os.Readlink(filepath.Join(root, p)); err != nil || got != target {
			t.Errorf("link %s -> %q (%v), want %q", p, got, err, target)
		}
	}
	var a, h syscall.Stat_t
	syscall.Stat(filepath.Join(root, "a/target"), &a)
	syscall.Stat(filepath.Join(root, "hard"), &h)
	if a.Ino != h.Ino {
		t.Errorf("hard is not a hard link of a/target")
	}
	for p, mode := range map[string]fs.FileMode{
		"suid": 0o755, "sgid-dir": fs.ModeDir | 0o775, "tmp": fs.ModeDir | fs.ModeSticky | 0o777,
		"ro": fs.ModeDir | 0o555, "usr/local/bin/server": 0o755, "owned": 0o640, ".": fs.ModeDir | 0o755,
	} {
		info, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode() != mode {
			t.Errorf("%s mode %v, want %v (set-id bits dropped, the rest kept)", p, info.Mode(), mode)
		}
		if !info.ModTime().Equal(epoch) {
			t.Errorf("%s mtime %v, want the archive's %v", p, info.ModTime(), epoch)
		}
	}
	if os.Geteuid() == 0 {
		info, _ := os.Lstat(filepath.Join(root, "owned"))
		st := info.Sys().(*syscall.Stat_t)
		if st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("owned: uid %d gid %d, want the archive's 1234:5678", st.Uid, st.Gid)
		}
	}
}

// rawUnpack writes the archive entries straight into a fresh directory (no flattening),
// returning the directory and writeTree's error.
func rawUnpack(t *testing.T, entries ...entry) (string, error) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := writeTree(context.Background(), bytes.NewReader(tarOf(t, entries...)), root, nil)
	return root, err
}

func TestWriteTreeNeverWritesOutsideTheRoot(t *testing.T) {
	outside := t.TempDir() // a host directory the archive tries to reach
	cases := []struct {
		name    string
		entries []entry
		escape  bool // ErrEscape expected; otherwise some error from the kernel-checked path
	}{
		{"dot-dot name", []entry{file("../escaped", "x")}, true},
		{"dot-dot inside the name", []entry{file("a/../../escaped", "x")}, true},
		{"hard link to a path above the root", []entry{{name: "h", link: "../../escaped", typ: tar.TypeLink}}, true},
		{"write through an absolute link to a host path", []entry{symlink("evil", outside), file("evil/escaped", "x")}, false},
		{"write through a relative link above the root", []entry{symlink("up", "../../../../../../.."+outside), file("up/escaped", "x")}, false},
		{"hard link through a link", []entry{symlink("evil", outside), {name: "h", link: "evil/escaped", typ: tar.TypeLink}}, false},
		{"directory through a link", []entry{symlink("evil", outside), dir("evil/sub/", 0o755)}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rawUnpack(t, tc.entries...)
			if err == nil {
				t.Fatal("unpacked without error")
			}
			if tc.escape && !errors.Is(err, ErrEscape) {
				t.Errorf("error %v, want ErrEscape", err)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Fatalf("wrote outside the root: %v", entries)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(filepath.Dir(outside)), "escaped")); err == nil {
				t.Fatal("wrote above the root")
			}
		})
	}
}

func TestUnpackRefusesEscapingNames(t *testing.T) {
	img := image(t, v1.Config{}, layer(t, file("ok", "x"), file("../escaped", "x")))
	cache := filepath.Join(t.TempDir(), "rootfs")
	if _, err := Unpack(context.Background(), img, cache, nil); err == nil {
		t.Fatal("unpacked an archive with a name above its root")
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(cache), "escaped")); err == nil {
		t.Fatal("wrote above the root")
	}
	assertNoRoots(t, cache)
}

// assertNoRoots fails unless cache holds no unpacked root and no temporary directory.
func assertNoRoots(t *testing.T, cache string) {
	t.Helper()
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != lockFile {
			t.Errorf("%s left in the cache", e.Name())
		}
	}
}

// unreadable is an image whose layers must not be read.
type unreadable struct{ v1.Image }

func (unreadable) Layers() ([]v1.Layer, error) { return nil, errors.New("layers read") }

func TestUnpackReusesARootByDigest(t *testing.T) {
	img := image(t, v1.Config{User: "1"}, layer(t, file("f", "x")))
	cache := filepath.Join(t.TempDir(), "rootfs")
	first, err := Unpack(context.Background(), img, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Unpack(context.Background(), unreadable{img}, cache, nil)
	if err != nil {
		t.Fatalf("second unpack of the same digest read the image again: %v", err)
	}
	if again.Dir != first.Dir || again.Digest != first.Digest || again.Config.User != "1" {
		t.Fatalf("second unpack %+v, want %+v", again, first)
	}
	// A different image gets its own directory.
	other, err := Unpack(context.Background(), image(t, v1.Config{}, layer(t, file("g", "y"))), cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.Dir == first.Dir {
		t.Fatal("two images share a root")
	}
	// A directory whose record names another digest is not used.
	h, _ := img.Digest()
	rec := filepath.Join(cache, h.Hex, recordFile)
	data := strings.Replace(readFile(t, rec), h.Hex, strings.Repeat("0", 64), 1)
	os.WriteFile(rec, []byte(data), 0o600)
	if _, err := Unpack(context.Background(), img, cache, nil); err == nil || !strings.Contains(err.Error(), "not a complete unpacked image") {
		t.Fatalf("unpack over a mismatched record: %v", err)
	}
}

// brokenLayer reads like its layer for n bytes, then fails.
type brokenLayer struct {
	v1.Layer
	n int64
}

func (b brokenLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := b.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(io.LimitReader(rc, b.n), errReader{}), rc}, nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestInterruptedUnpackLeavesNothingThatIsUsed(t *testing.T) {
	good := layer(t, dir("d/", 0o755), file("d/a", strings.Repeat("a", 4096)), file("d/b", strings.Repeat("b", 4096)))
	cache := filepath.Join(t.TempDir(), "rootfs")

	// A read failing half-way.
	broken := image(t, v1.Config{}, brokenLayer{good, 3000})
	if _, err := Unpack(context.Background(), broken, cache, nil); err == nil {
		t.Fatal("unpack of a failing layer succeeded")
	}
	assertNoRoots(t, cache)

	// A cancelled unpack.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Unpack(ctx, image(t, v1.Config{}, good), cache, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled unpack: %v", err)
	}
	assertNoRoots(t, cache)

	// A crash mid-unpack leaves a temporary directory: never used, removed by the next
	// unpack, which makes the root afresh.
	img := image(t, v1.Config{}, good)
	h, _ := img.Digest()
	crashed := filepath.Join(cache, tmpPrefix+h.Hex[:12]+"-123")
	os.MkdirAll(filepath.Join(crashed, rootDir, "d"), 0o755)
	os.WriteFile(filepath.Join(crashed, rootDir, "d", "a"), []byte("half"), 0o644)
	r, err := Unpack(context.Background(), img, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(r.Dir, "d", "a")); got != strings.Repeat("a", 4096) {
		t.Fatalf("d/a = %.10q..., want the image's content", got)
	}
	if _, err := os.Lstat(crashed); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("interrupted unpack's directory left: %v", err)
	}
}

func TestParseSource(t *testing.T) {
	tmp := t.TempDir()
	notLayout := filepath.Join(tmp, "plain")
	os.Mkdir(notLayout, 0o755)
	aFile := filepath.Join(tmp, "file")
	os.WriteFile(aFile, nil, 0o644)
	lay := filepath.Join(tmp, "layout")
	if _, err := layout.Write(lay, empty.Index); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		arg     string
		wantErr error  // errors.Is target, if any
		errText string // substring of the error; empty: no error
		dir     bool
		digest  bool
	}{
		{arg: lay, dir: true},
		{arg: notLayout, wantErr: ErrNotLayout, errText: "no oci-layout file"},
		{arg: aFile, wantErr: ErrNotLayout, errText: "not a directory"},
		{arg: filepath.Join(tmp, "missing"), errText: "no such directory"},
		{arg: "127.0.0.1:5000/fusebox/sandbox@" + digest, digest: true},
		{arg: "localhost:5000/sandbox:v1"},
		{arg: "127.0.0.1:5000", wantErr: ErrNoRepository, errText: "repository path"},
		{arg: "127.0.0.1:5000@" + digest, wantErr: ErrNoRepository, errText: "repository path"},
		{arg: "127.0.0.1:5000/@" + digest, wantErr: ErrNoRepository, errText: "repository path"},
		{arg: "sandbox", errText: "names no registry host"},
		{arg: "", errText: "no image given"},
	}
	for _, tc := range cases {
		t.Run(tc.arg, func(t *testing.T) {
			s, err := ParseSource(tc.arg)
			if tc.errText != "" && tc.wantErr == nil && err != nil && strings.Contains(err.Error(), tc.errText) {
				return
			}
			if tc.wantErr != nil || tc.errText != "" {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("ParseSource(%q) = %v, want an error %v containing %q", tc.arg, err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (s.Dir != "") != tc.dir {
				t.Errorf("Dir %q", s.Dir)
			}
			if _, ok := s.Digest(); ok != tc.digest {
				t.Errorf("Digest ok %v, want %v", ok, tc.digest)
			}
		})
	}
	// An empty index is a layout, but holds no image.
	s, _ := ParseSource(lay)
	if _, err := s.Image(context.Background()); !errors.Is(err, ErrNotLayout) || !strings.Contains(err.Error(), "no image manifest") {
		t.Fatalf("image of an empty layout: %v", err)
	}
}

func TestPrepareFromALayout(t *testing.T) {
	img := image(t, v1.Config{Entrypoint: []string{"/bin/server"}}, layer(t, file("etc/os-release", "ID=test\n")))
	lay := filepath.Join(t.TempDir(), "sandbox")
	p, err := layout.Write(lay, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: "sandbox"})); err != nil {
		t.Fatal(err)
	}
	src, err := ParseSource(lay)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Prepare(context.Background(), src, filepath.Join(t.TempDir(), "rootfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(r.Dir, "etc/os-release")); got != "ID=test\n" {
		t.Fatalf("os-release %q", got)
	}
	// A layout of two images is refused, naming them.
	if err := p.AppendImage(image(t, v1.Config{}, layer(t, file("x", "y"))), layout.WithAnnotations(map[string]string{refNameAnnotation: "manager"})); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Image(context.Background()); err == nil || !strings.Contains(err.Error(), "holds 2 images") || !strings.Contains(err.Error(), "manager@") {
		t.Fatalf("two-image layout: %v", err)
	}
	// Pinned by digest (DIR@sha256:HEX), a layout of several images gives the one named,
	// and one it does not hold is refused.
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := ParseSource(lay + "@" + h.String())
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := pinned.Digest(); !ok || d != h {
		t.Errorf("a pinned layout's digest: %v %v, want %v", d, ok, h)
	}
	got, err := pinned.Image(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if gh, _ := got.Digest(); gh != h {
		t.Errorf("the pinned layout gave image %v, want %v", gh, h)
	}
	other, err := ParseSource(lay + "@sha256:" + strings.Repeat("0", 64))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Image(context.Background()); err == nil || !strings.Contains(err.Error(), "lists no image manifest sha256:000") {
		t.Errorf("a digest the layout lacks: %v", err)
	}
	if _, err := ParseSource(lay + "@md5:abc"); err == nil {
		t.Error("a layout pinned by a malformed digest was accepted")
	}
}

// anonymous resolves every registry to no credentials, so the tests never read the
// machine's Docker config.
type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

func TestPrepareFromARegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	img := image(t, v1.Config{User: "65532:65532"}, layer(t, file("etc/os-release", "ID=pulled\n")))
	h, _ := img.Digest()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.ParseReference(host + "/fusebox/sandbox:test")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(t.TempDir(), "rootfs")
	for _, arg := range []string{host + "/fusebox/sandbox:test", host + "/fusebox/sandbox@" + h.String()} {
		src, err := ParseSource(arg)
		if err != nil {
			t.Fatal(err)
		}
		src.Keychain = anonymous{}
		r, err := Prepare(context.Background(), src, cache, nil)
		if err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		if r.Digest != h || readFile(t, filepath.Join(r.Dir, "etc/os-release")) != "ID=pulled\n" {
			t.Fatalf("%s: root %+v", arg, r)
		}
	}
	// A missing repository: the registry's status, named.
	src, _ := ParseSource(host + "/fusebox/missing:test")
	src.Keychain = anonymous{}
	if _, err := Prepare(context.Background(), src, cache, nil); !errors.Is(err, ErrPull) ||
		!strings.Contains(err.Error(), "registry "+host) || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("missing repository: %v", err)
	}
	// The registry gone: a reference by digest is served from the unpacked root; a tag
	// cannot be, and the error names the registry.
	srv.Close()
	src, _ = ParseSource(host + "/fusebox/sandbox@" + h.String())
	if r, err := Prepare(context.Background(), src, cache, nil); err != nil || r.Digest != h {
		t.Fatalf("digest reference with the registry down: %v", err)
	}
	src, _ = ParseSource(host + "/fusebox/sandbox:test")
	src.Keychain = anonymous{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Prepare(ctx, src, cache, nil); !errors.Is(err, ErrPull) || !strings.Contains(err.Error(), "registry "+host) {
		t.Fatalf("tag with the registry down: %v", err)
	}
}

func TestPullErrorNamesTheStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	src, err := ParseSource(host + "/fusebox/sandbox:v1")
	if err != nil {
		t.Fatal(err)
	}
	src.Keychain = anonymous{}
	_, err = Prepare(context.Background(), src, t.TempDir(), nil)
	if !errors.Is(err, ErrPull) || !strings.Contains(err.Error(), "registry "+host) || !strings.Contains(err.Error(), "HTTP 403") {
		t.Fatalf("refused pull: %v", err)
	}
	// Nothing listening at all.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	src, _ = ParseSource(addr + "/fusebox/sandbox:v1")
	src.Keychain = anonymous{}
	if _, err = Prepare(context.Background(), src, t.TempDir(), nil); !errors.Is(err, ErrPull) || !strings.Contains(err.Error(), "registry "+addr) {
		t.Fatalf("pull from a closed port: %v", err)
	}
}

// The image's user resolves in its own root (package userdb holds the cases).
func TestUser(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("app:x:1000:100::/:/bin/sh\n"), 0o644)
	r := &Root{Dir: dir, Config: v1.Config{User: "app"}}
	if uid, gid, err := r.User(); err != nil || uid != 1000 || gid != 100 {
		t.Fatalf("User app = %d:%d, %v; want 1000:100", uid, gid, err)
	}
	if _, _, err := r.UserOf("ghost"); err == nil || !strings.Contains(err.Error(), `no user "ghost"`) {
		t.Fatalf("UserOf ghost: %v", err)
	}
}

// Layers apply in order, as a container runtime applies them: a hard link keeps its content
// when a higher layer deletes the name it was made to; a file replaced by a directory and a
// directory by a file take the higher layer's; an opaque directory keeps what its own layer
// wrote before the marker; a later layer may recreate a deleted name.
func TestUnpackAppliesLayersInOrder(t *testing.T) {
	l1 := layer(t,
		dir("bin/", 0o755), file("bin/perl5.36", "perl"),
		entry{name: "bin/perl", link: "bin/perl5.36", typ: tar.TypeLink, mode: 0o755},
		file("was-file", "f"), dir("was-dir/", 0o700), file("was-dir/inner", "i"),
		dir("opq/", 0o755), file("opq/lower", "l"), file("again", "1"),
	)
	l2 := layer(t,
		file("bin/.wh.perl5.36", ""),
		dir("was-file/", 0o750), file("was-file/now", "d"),
		file("was-dir", "now a file"),
		dir("opq/", 0o755), file("opq/mine", "m"), file("opq/.wh..wh..opq", ""),
		file(".wh.again", ""),
	)
	l3 := layer(t, file("again", "3"))
	r, err := Unpack(context.Background(), image(t, v1.Config{}, l1, l2, l3), filepath.Join(t.TempDir(), "rootfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for p, body := range map[string]string{"bin/perl": "perl", "was-file/now": "d", "was-dir": "now a file", "opq/mine": "m", "again": "3"} {
		if got := readFile(t, filepath.Join(r.Dir, p)); got != body {
			t.Errorf("%s = %q, want %q", p, got, body)
		}
	}
	for _, p := range []string{"bin/perl5.36", "opq/lower", "was-dir/inner"} {
		if _, err := os.Lstat(filepath.Join(r.Dir, p)); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("%s: %v, want it deleted", p, err)
		}
	}
	if info, err := os.Lstat(filepath.Join(r.Dir, "was-file")); err != nil || info.Mode() != fs.ModeDir|0o750 {
		t.Errorf("was-file: %v %v, want the higher layer's directory (0750)", info.Mode(), err)
	}
}
