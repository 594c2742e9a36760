package sbom

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const dpkgStatus = `Package: zlib1g
Status: install ok installed
Architecture: amd64
Source: zlib
Version: 1:1.2.13.dfsg-1
Description: compression library
 a continuation line: not a field

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b7
`

const apkDB = `C:Q1abc=
P:musl
V:1.2.4-r2
A:x86_64

P:busybox
V:1.36.1-r5
A:x86_64
`

// layer is a layer of regular files (and whiteouts, named .wh.NAME).
func layer(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range slicesSorted(files) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[name]))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(files[name]))
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func slicesSorted(m map[string]string) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// purls returns the document's package URLs, and fails unless it is SPDX 2.3 JSON whose root
// contains every package.
func purls(t *testing.T, doc []byte) []string {
	t.Helper()
	var d struct {
		SPDXVersion string
		Packages    []Package
		Relations   []relationship `json:"relationships"`
	}
	if err := json.Unmarshal(doc, &d); err != nil || d.SPDXVersion != "SPDX-2.3" {
		t.Fatalf("document: %v\n%s", err, doc)
	}
	if len(d.Relations) != len(d.Packages)-1 {
		t.Errorf("%d relationships for %d packages", len(d.Relations), len(d.Packages)-1)
	}
	var out []string
	for _, p := range d.Packages[1:] {
		for _, r := range p.ExternalRefs {
			out = append(out, r.Locator)
		}
	}
	return out
}

// TestFromImage: the packages of a Debian image's dpkg status (installed ones only), an
// Alpine database, and Python distributions installed by pip, as the image's last layers
// leave them (a distribution a later layer removed is not listed), named by os-release.
func TestFromImage(t *testing.T) {
	img, err := mutate.AppendLayers(empty.Image,
		layer(t, map[string]string{
			"usr/lib/os-release":  "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n",
			"var/lib/dpkg/status": dpkgStatus,
			"usr/local/lib/python3.11/dist-packages/gone-1.0.dist-info/METADATA": "Name: gone\nVersion: 1.0\n",
		}),
		layer(t, map[string]string{
			"usr/local/lib/python3.11/dist-packages/Fbx_Demo-2.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: Fbx_Demo\nVersion: 2.0\n\nName: not-a-header\n",
			"usr/lib/python3/dist-packages/six-1.16.0.egg-info/PKG-INFO":             "Name: six\nVersion: 1.16.0\n",
			"usr/local/lib/python3.11/dist-packages/.wh.gone-1.0.dist-info":          "",
			"opt/app/lib/noversion-1.0.dist-info/METADATA":                           "Name: noversion\n",
			"lib/apk/db/installed": apkDB,
			"usr/local/lib/python3.11/dist-packages/fbx_demo/__init__.py":             "",
			"usr/local/lib/python3.11/dist-packages/Fbx_Demo-2.0.dist-info/RECORD":    "",
			"usr/local/lib/python3.11/dist-packages/Fbx_Demo-2.0.dist-info/INSTALLER": "pip\n",
		}))
	if err != nil {
		t.Fatal(err)
	}
	s := New(Meta{Name: "template-app", ID: "app", Tool: "fusebox template build"})
	if err := FromImage(img, s); err != nil {
		t.Fatal(err)
	}
	doc, err := s.Document(time.Unix(1767225600, 0))
	if err != nil {
		t.Fatal(err)
	}
	got := purls(t, doc)
	want := []string{
		"pkg:deb/debian/bash@5.2.15-2+b7?arch=amd64&distro=debian-12",
		"pkg:deb/debian/zlib1g@1:1.2.13.dfsg-1?arch=amd64&distro=debian-12",
		"pkg:apk/alpine/busybox@1.36.1-r5?arch=x86_64&distro=debian-12",
		"pkg:apk/alpine/musl@1.2.4-r2?arch=x86_64&distro=debian-12",
		"pkg:pypi/fbx-demo@2.0",
		"pkg:pypi/six@1.16.0",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("purls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	again, _ := s.Document(time.Unix(1767225600, 0))
	if !bytes.Equal(doc, again) {
		t.Error("the same packages gave two documents")
	}
	if !strings.Contains(string(doc), `"created": "2026-01-01T00:00:00Z"`) || !strings.Contains(string(doc), `"Tool: fusebox template build"`) {
		t.Errorf("creation info:\n%s", doc)
	}
}

// TestOSID: the distribution of an os-release file, and dpkg's default without one.
func TestOSID(t *testing.T) {
	for _, c := range []struct{ in, vendor, distro string }{
		{"ID=ubuntu\nVERSION_ID=\"24.04\"\n", "ubuntu", "ubuntu-24.04"},
		{"ID=alpine\nVERSION_ID=3.20.1\n", "alpine", "alpine-3.20.1"},
		{"", "debian", ""},
	} {
		if v, d := osID([]byte(c.in)); v != c.vendor || d != c.distro {
			t.Errorf("osID(%q) = %s, %s; want %s, %s", c.in, v, d, c.vendor, c.distro)
		}
	}
}
