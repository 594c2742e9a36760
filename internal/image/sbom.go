package image

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"time"

	"github.com/fusebox-dev/fusebox/internal/sbom"
)

// imageSBOM is an image's bill of materials (package sbom), with what fusebox image build
// lists besides the Debian packages: Go binaries and its own files.
type imageSBOM struct{ *sbom.SBOM }

func newSBOM(image string) *imageSBOM {
	return &imageSBOM{sbom.New(sbom.Meta{Name: "fusebox-" + image, ID: image, Comment: "the fusebox " + image + " image",
		Tool: "fusebox image build"})}
}

// addGoBinary lists a binary's main module, its dependencies (with their go.sum hashes) and
// the Go toolchain, from the binary's build information.
func (s *imageSBOM) addGoBinary(inImage string, b *goBinary) {
	tool := b.info.GoVersion
	s.Add(sbom.Package{
		Name: "golang.org/toolchain", SPDXID: sbom.ID("go", "toolchain", tool), VersionInfo: tool,
		DownloadLocation: "NOASSERTION",
		ExternalRefs:     sbom.PURL("pkg:golang/stdlib@" + tool),
	})
	main := b.info.Main
	version := main.Version
	if version == "" {
		version = "(devel)"
	}
	s.Add(sbom.Package{
		Name: main.Path, SPDXID: sbom.ID("go", main.Path, version), VersionInfo: version,
		DownloadLocation: "NOASSERTION", Comment: "main module of " + inImage,
		ExternalRefs: sbom.PURL("pkg:golang/" + main.Path + "@" + url.PathEscape(version)),
	})
	for _, d := range b.info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		p := sbom.Package{
			Name: m.Path, SPDXID: sbom.ID("go", m.Path, m.Version), VersionInfo: m.Version,
			DownloadLocation: "NOASSERTION",
			ExternalRefs:     sbom.PURL("pkg:golang/" + m.Path + "@" + m.Version),
		}
		if m.Sum != "" {
			p.Comment = "go.sum " + m.Sum
		}
		s.Add(p)
	}
}

// addFile lists a file fusebox puts into the image (a script), with its SHA-256.
func (s *imageSBOM) addFile(name string, data []byte) {
	sum := sha256.Sum256(data)
	s.Add(sbom.Package{
		Name: name, SPDXID: sbom.ID("file", name, hex.EncodeToString(sum[:8])), DownloadLocation: "NOASSERTION",
		Checksums: []sbom.Checksum{{Algorithm: "SHA256", Value: hex.EncodeToString(sum[:])}},
	})
}

// addDpkgStatus lists the installed packages of a dpkg status file of Debian version.
func (s *imageSBOM) addDpkgStatus(status []byte, version string) error {
	return s.AddDpkgStatus(status, "debian", "debian-"+version)
}

// document returns the SPDX JSON (sbom.SBOM.Document).
func (s *imageSBOM) document(epoch time.Time) ([]byte, error) { return s.Document(epoch) }
