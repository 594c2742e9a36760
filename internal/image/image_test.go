package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/test/testenv"
)

var testEpoch = time.Unix(DefaultEpoch, 0).UTC()

// tarOf writes entries (in the given order) as an uncompressed tarball file.
func tarOf(t *testing.T, hdrs []*tar.Header, data map[string]string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, h := range hdrs {
		if d, ok := data[h.Name]; ok {
			h.Size = int64(len(d))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if d, ok := data[h.Name]; ok {
			tw.Write([]byte(d))
		}
	}
	tw.Close()
	f.Close()
	return p
}

type entry struct {
	name, link, data string
	typ              byte
	mod              time.Time
	uid              int
}

func readLayer(t *testing.T, r io.Reader) []entry {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []entry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out = append(out, entry{name: h.Name, link: h.Linkname, data: string(b), typ: h.Typeflag, mod: h.ModTime, uid: h.Uid})
	}
}

// TestNormalizeRootfs: mmdebstrap's tarball becomes a layer with sorted names, clamped times,
// hard links whose first name in order holds the data, no device nodes, no apt sources, no
// host resolver or host name, and the sandbox user.
func TestNormalizeRootfs(t *testing.T) {
	late := testEpoch.Add(time.Hour)
	in := tarOf(t, []*tar.Header{
		{Name: "./dev/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: late},
		{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: late},
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: late},
		{Name: "./usr/bin/perl", Typeflag: tar.TypeReg, Mode: 0o755, ModTime: testEpoch.Add(-time.Hour), Uname: "root"},
		{Name: "./usr/bin/a-perl", Typeflag: tar.TypeLink, Linkname: "./usr/bin/perl", ModTime: late},
		{Name: "./usr/bin/zperl", Typeflag: tar.TypeLink, Linkname: "./usr/bin/perl", ModTime: late},
		{Name: "./etc/apt/sources.list.d/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: late},
		{Name: "./etc/apt/sources.list.d/0000debian.sources", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: late},
		{Name: "./etc/resolv.conf", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: late},
		{Name: "./etc/hostname", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: late},
		{Name: "./etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: late},
		{Name: "./var/lib/dpkg/status", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: late},
		{Name: "./usr/bin/ping", Typeflag: tar.TypeReg, Mode: 0o755, ModTime: late, PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "caps"}},
	}, map[string]string{
		"./usr/bin/perl": "perl", "./etc/apt/sources.list.d/0000debian.sources": "URIs: http://mirror.invalid/debian",
		"./etc/resolv.conf": "nameserver 10.0.0.1\n", "./etc/hostname": "buildhost\n",
		"./etc/passwd": "root:x:0:0:root:/root:/bin/bash\n", "./var/lib/dpkg/status": "Package: perl\n", "./usr/bin/ping": "ping",
	})
	out := filepath.Join(t.TempDir(), "layer.tar.gz")
	status, err := normalizeRootfs(in, out, rootfsSpec{SandboxUser: true}, testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	if string(status) != "Package: perl\n" {
		t.Errorf("dpkg status %q", status)
	}
	f, _ := os.Open(out)
	defer f.Close()
	got := readLayer(t, f)
	var names []string
	for _, e := range got {
		names = append(names, e.name)
		if e.mod.After(testEpoch) {
			t.Errorf("%s: time %s after the epoch", e.name, e.mod)
		}
	}
	want := []string{"dev/", "etc/", "etc/apt/", "etc/apt/sources.list.d/", "etc/hostname", "etc/passwd", "etc/resolv.conf",
		"usr/bin/a-perl", "usr/bin/perl", "usr/bin/ping", "usr/bin/zperl", "var/lib/dpkg/status"}
	// Parents that mmdebstrap's tarball lists are kept; those it does not are not invented.
	want = slices.DeleteFunc(want, func(n string) bool { return n == "etc/" || n == "etc/apt/" })
	if !slices.Equal(names, want) {
		t.Fatalf("entries %v\nwant    %v", names, want)
	}
	by := map[string]entry{}
	for _, e := range got {
		by[e.name] = e
	}
	if e := by["usr/bin/a-perl"]; e.typ != tar.TypeReg || e.data != "perl" {
		t.Errorf("first of the hard-link group: %+v, want the data", e)
	}
	for _, n := range []string{"usr/bin/perl", "usr/bin/zperl"} {
		if e := by[n]; e.typ != tar.TypeLink || e.link != "usr/bin/a-perl" {
			t.Errorf("%s: %+v, want a hard link to usr/bin/a-perl", n, e)
		}
	}
	if e := by["etc/resolv.conf"]; e.data != "" {
		t.Errorf("resolv.conf holds %q: the build machine's resolver", e.data)
	}
	if e := by["etc/hostname"]; e.data != "localhost\n" {
		t.Errorf("hostname %q", e.data)
	}
	if e := by["etc/passwd"]; !strings.HasSuffix(e.data, "sandbox:x:65532:65532:fusebox sandbox:/workspace:/bin/bash\n") {
		t.Errorf("passwd %q lacks the sandbox user", e.data)
	}
	// The extended attribute (a file capability) survives.
	zr, _ := os.Open(out)
	defer zr.Close()
	gz, _ := gzip.NewReader(zr)
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatal("no usr/bin/ping")
		}
		if h.Name == "usr/bin/ping" {
			if h.PAXRecords["SCHILY.xattr.security.capability"] != "caps" {
				t.Errorf("ping lost its capability: %v", h.PAXRecords)
			}
			break
		}
	}
	// The same input gives the same bytes.
	out2 := filepath.Join(t.TempDir(), "layer.tar.gz")
	if _, err := normalizeRootfs(in, out2, rootfsSpec{SandboxUser: true}, testEpoch); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(out2)
	if !bytes.Equal(a, b) {
		t.Error("two normalisations of the same tarball differ")
	}
}

func TestBadInput(t *testing.T) {
	t.Run("unknown image", func(t *testing.T) {
		_, err := Build(BuildOptions{ModuleDir: testenv.ModuleRoot(), Out: t.TempDir(), Images: []string{"sandbox", "runner"}})
		if !errors.Is(err, ErrUnknownImage) || !strings.Contains(err.Error(), `"runner"`) || !strings.Contains(err.Error(), "manager, sandbox, gvisor-installer") {
			t.Fatalf("unknown image: %v", err)
		}
	})
	t.Run("not an OCI layout", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "index.json"), []byte("{}"), 0o644)
		_, err := Load(dir)
		if !errors.Is(err, ErrNotLayout) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "fusebox image build") {
			t.Fatalf("not a layout: %v", err)
		}
		if _, err := LoadAll(filepath.Join(dir, "nope"), []string{Sandbox}); !errors.Is(err, ErrNotLayout) {
			t.Fatalf("missing layout directory: %v", err)
		}
	})
	t.Run("mmdebstrap missing", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		_, err := buildRootfs(rootfsSpec{Variant: "minbase", Suite: "bookworm"}, t.TempDir(), testEpoch, io.Discard)
		if !errors.Is(err, ErrMmdebstrap) || !strings.Contains(err.Error(), "install the Debian package mmdebstrap") {
			t.Fatalf("mmdebstrap missing: %v", err)
		}
	})
	t.Run("mmdebstrap missing, before anything is built", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir()) // no go either: the manager's build would fail otherwise
		out := t.TempDir()
		_, err := Build(BuildOptions{ModuleDir: testenv.ModuleRoot(), Out: out, CacheDir: t.TempDir(), Runsc: "/r", Shim: "/s"})
		if !errors.Is(err, ErrMmdebstrap) || !strings.Contains(err.Error(), "install the Debian package mmdebstrap") {
			t.Fatalf("mmdebstrap missing: %v", err)
		}
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Errorf("the failed build wrote %v", entries)
		}
	})
	t.Run("userlands without a cache or of an unknown image", func(t *testing.T) {
		if err := Userlands(BuildOptions{}); err == nil || !strings.Contains(err.Error(), "cache directory") {
			t.Fatalf("no cache directory: %v", err)
		}
		if err := Userlands(BuildOptions{CacheDir: t.TempDir(), Images: []string{"runner"}}); !errors.Is(err, ErrUnknownImage) {
			t.Fatalf("unknown image: %v", err)
		}
	})
	t.Run("bad package name", func(t *testing.T) {
		_, err := Build(BuildOptions{ModuleDir: testenv.ModuleRoot(), Out: t.TempDir(), Images: []string{Sandbox}, ExtraPackages: []string{"jq; rm -rf /"}})
		if err == nil || !strings.Contains(err.Error(), "Debian package name") {
			t.Fatalf("bad package: %v", err)
		}
	})
}

// managerPackage is the manager's main package, or another static main of the module where
// the manager's own command does not exist.
func managerPackage(t testing.TB) string {
	if _, err := os.Stat(filepath.Join(testenv.ModuleRoot(), DefaultManagerPackage)); err == nil {
		return DefaultManagerPackage
	}
	return DefaultSandboxPackage
}

func needMmdebstrap(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("mmdebstrap missing (Debian package mmdebstrap); CI runs this test")
		}
		t.Fatal("mmdebstrap missing: .ci/run installs the Debian package mmdebstrap")
	}
	if os.Geteuid() != 0 {
		t.Skip("mmdebstrap builds need root here")
	}
}

// Userlands fills the cache Build then takes the sandbox's userland from, without running
// mmdebstrap again.
func TestUserlandsWarmTheBuild(t *testing.T) {
	needMmdebstrap(t)
	var warm, build bytes.Buffer
	o := BuildOptions{
		ModuleDir: testenv.ModuleRoot(), Out: t.TempDir(), Images: []string{Sandbox}, CacheDir: t.TempDir(), Epoch: testEpoch,
		SandboxVariant: "extract", SandboxPackages: []string{"base-files", "busybox"}, Progress: &warm,
	}
	if err := Userlands(o); err != nil {
		t.Fatalf("%v\n%s", err, warm.String())
	}
	if !strings.Contains(warm.String(), "mmdebstrap") {
		t.Errorf("Userlands on an empty cache ran no mmdebstrap:\n%s", warm.String())
	}
	if entries, _ := os.ReadDir(o.Out); len(entries) != 0 {
		t.Errorf("Userlands wrote images: %v", entries)
	}
	o.Progress = &build
	if _, err := Build(o); err != nil {
		t.Fatalf("%v\n%s", err, build.String())
	}
	if p := build.String(); strings.Contains(p, "mmdebstrap") || !strings.Contains(p, "cached in") {
		t.Errorf("the build after Userlands did not take the userland from the cache:\n%s", p)
	}
}

// TestReproducibleDigests builds the manager and a small sandbox twice, each time with an
// empty userland cache, and gets the same digests; a third build from the cache gets them
// too. The images have the configuration the runtimes rely on.
func TestReproducibleDigests(t *testing.T) {
	needMmdebstrap(t)
	build := func(cache string) ([]Built, string) {
		var progress bytes.Buffer
		o := BuildOptions{
			ModuleDir: testenv.ModuleRoot(), Out: t.TempDir(), Images: []string{Manager, Sandbox},
			ManagerPackage: managerPackage(t), CacheDir: cache, Epoch: testEpoch, Progress: &progress,
			// A small userland keeps the test fast; the full set is built by make images.
			SandboxVariant: "extract", SandboxPackages: []string{"base-files", "busybox"},
		}
		b, err := Build(o)
		if err != nil {
			t.Fatalf("%v\n%s", err, progress.String())
		}
		return b, progress.String()
	}
	first, _ := build(t.TempDir())
	secondCache := t.TempDir()
	second, _ := build(secondCache)
	third, progress := build(secondCache)
	if !strings.Contains(progress, "cached in") {
		t.Errorf("the third build did not use the cache:\n%s", progress)
	}
	for i := range first {
		if first[i].Digest != second[i].Digest || first[i].Digest != third[i].Digest {
			t.Errorf("%s: digests %s, %s, %s", first[i].Name, first[i].Digest, second[i].Digest, third[i].Digest)
		}
		a, _ := os.ReadFile(first[i].SBOM)
		b, _ := os.ReadFile(second[i].SBOM)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: SBOMs differ", first[i].Name)
		}
	}

	sandbox, err := Load(first[1].Dir)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := sandbox.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/fusebox-sandbox"}) || c.User != "65532:65532" || c.WorkingDir != "/workspace" ||
		!slices.Contains(c.Env, "LANG=C.UTF-8") || !slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		t.Errorf("sandbox config %+v", c)
	}
	if !cf.Created.Time.Equal(testEpoch) {
		t.Errorf("created %s, want the epoch", cf.Created)
	}
	files := imageFiles(t, sandbox)
	if f, ok := files["workspace/"]; !ok || f.uid != NonRoot {
		t.Errorf("/workspace: %+v (present %v), want owned by %d", f, ok, NonRoot)
	}
	if _, ok := files["usr/local/bin/fusebox-sandbox"]; !ok {
		t.Error("no /usr/local/bin/fusebox-sandbox")
	}
	if _, ok := files["bin/busybox"]; !ok {
		if _, ok := files["usr/bin/busybox"]; !ok {
			t.Error("the userland has no busybox")
		}
	}
	for name, f := range files {
		if (strings.HasPrefix(name, "etc/apt/sources.list.d/") && name != "etc/apt/sources.list.d/") || name == "etc/apt/sources.list" {
			t.Errorf("the image carries the machine's apt sources: %s", name)
		}
		if name == "etc/resolv.conf" && f.data != "" {
			t.Errorf("the image carries the machine's resolver: %q", f.data)
		}
	}
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name    string `json:"name"`
			Version string `json:"versionInfo"`
		} `json:"packages"`
	}
	b, _ := os.ReadFile(first[1].SBOM)
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	has := func(name string) bool {
		return slices.ContainsFunc(doc.Packages, func(p struct {
			Name    string `json:"name"`
			Version string `json:"versionInfo"`
		}) bool {
			return p.Name == name && p.Version != ""
		})
	}
	// The extract variant runs no dpkg, so its status lists no package: TestSBOMDebianPackages
	// covers that part, and make images builds the full userland.
	if doc.SPDXVersion != "SPDX-2.3" || !has("google.golang.org/grpc") || !has("github.com/fusebox-dev/fusebox") || !has("golang.org/toolchain") {
		t.Errorf("sandbox SBOM lacks grpc, the main module or the Go release: %s", b)
	}

	manager, err := Load(first[0].Dir)
	if err != nil {
		t.Fatal(err)
	}
	mcf, _ := manager.ConfigFile()
	if !slices.Equal(mcf.Config.Entrypoint, []string{"/usr/local/bin/fusebox-manager"}) || mcf.Config.User != "65532:65532" {
		t.Errorf("manager config %+v", mcf.Config)
	}
	var mnames []string
	for n := range imageFiles(t, manager) {
		mnames = append(mnames, n)
	}
	slices.Sort(mnames)
	wantManager := []string{"etc/", "etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/fusebox-manager"}
	if !slices.Equal(mnames, wantManager) {
		t.Errorf("manager image files %v, want only %v", mnames, wantManager)
	}
}

type imageFile struct {
	uid  int
	data string
}

// imageFiles returns every file of an image's layers (the last layer wins).
func imageFiles(t *testing.T, img v1.Image) map[string]imageFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]imageFile{}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range readLayer(t, rc) {
			d := ""
			if len(e.data) < 4096 {
				d = e.data
			}
			files[e.name] = imageFile{uid: e.uid, data: d}
		}
		rc.Close()
	}
	return files
}

// TestSBOMDebianPackages: the installed packages of a dpkg status file, with their versions,
// and nothing that is only configured away.
func TestSBOMDebianPackages(t *testing.T) {
	status := "Package: python3\nStatus: install ok installed\nArchitecture: amd64\nSource: python3-defaults\nVersion: 3.11.2-1+b1\nDescription: x\n continued\n\n" +
		"Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n\n" +
		"Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.15-2+b7\n"
	sb := newSBOM(Sandbox)
	if err := sb.addDpkgStatus([]byte(status), "12"); err != nil {
		t.Fatal(err)
	}
	doc, err := sb.document(testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"name": "bash"`, `"versionInfo": "5.2.15-2+b7"`, `"name": "python3"`,
		`pkg:deb/debian/python3@3.11.2-1+b1?arch=amd64\u0026distro=debian-12`, `"relationshipType": "CONTAINS"`} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("SBOM lacks %s:\n%s", want, doc)
		}
	}
	if strings.Contains(string(doc), `"name": "removed"`) {
		t.Error("SBOM lists a removed package")
	}
	again, _ := sb.document(testEpoch)
	if string(again) != string(doc) {
		t.Error("the same packages give different documents")
	}
}
