package image

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// SPDX 2.3 JSON, the subset an SBOM of packages needs.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	DocumentDescribes []string           `json:"documentDescribes"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string        `json:"name"`
	SPDXID           string        `json:"SPDXID"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	Supplier         string        `json:"supplier,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	Comment          string        `json:"comment,omitempty"`
	ExternalRefs     []spdxExtRef  `json:"externalRefs,omitempty"`
	Checksums        []spdxSummary `json:"checksums,omitempty"`
}

type spdxSummary struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxExtRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// sbom accumulates the packages of one image.
type sbom struct {
	image string
	pkgs  []spdxPackage
	seen  map[string]bool
}

func newSBOM(image string) *sbom { return &sbom{image: image, seen: map[string]bool{}} }

func (s *sbom) add(p spdxPackage) {
	if s.seen[p.SPDXID] {
		return
	}
	s.seen[p.SPDXID] = true
	s.pkgs = append(s.pkgs, p)
}

var spdxIDUnsafe = strings.NewReplacer("/", "-", "@", "-", "+", "-", "~", "-", ":", "-", "_", "-")

func spdxID(kind, name, version string) string {
	return "SPDXRef-" + kind + "-" + spdxIDUnsafe.Replace(name) + "-" + spdxIDUnsafe.Replace(version)
}

// addGoBinary lists a binary's main module, its dependencies (with their go.sum hashes) and
// the Go toolchain, from the binary's build information.
func (s *sbom) addGoBinary(inImage string, b *goBinary) {
	tool := b.info.GoVersion
	s.add(spdxPackage{
		Name: "golang.org/toolchain", SPDXID: spdxID("go", "toolchain", tool), VersionInfo: tool,
		DownloadLocation: "NOASSERTION",
		ExternalRefs:     []spdxExtRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/stdlib@" + tool}},
	})
	main := b.info.Main
	version := main.Version
	if version == "" {
		version = "(devel)"
	}
	s.add(spdxPackage{
		Name: main.Path, SPDXID: spdxID("go", main.Path, version), VersionInfo: version,
		DownloadLocation: "NOASSERTION", Comment: "main module of " + inImage,
		ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + main.Path + "@" + url.PathEscape(version)}},
	})
	for _, d := range b.info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		p := spdxPackage{
			Name: m.Path, SPDXID: spdxID("go", m.Path, m.Version), VersionInfo: m.Version,
			DownloadLocation: "NOASSERTION",
			ExternalRefs:     []spdxExtRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.Path + "@" + m.Version}},
		}
		if m.Sum != "" {
			p.Comment = "go.sum " + m.Sum
		}
		s.add(p)
	}
}

// addFile lists a file fusebox puts into the image (a script), with its SHA-256.
func (s *sbom) addFile(name string, data []byte) {
	sum := sha256.Sum256(data)
	s.add(spdxPackage{
		Name: name, SPDXID: spdxID("file", name, hex.EncodeToString(sum[:8])), DownloadLocation: "NOASSERTION",
		Checksums: []spdxSummary{{"SHA256", hex.EncodeToString(sum[:])}},
	})
}

// addDpkgStatus lists the installed Debian packages of a dpkg status file.
func (s *sbom) addDpkgStatus(status []byte, suite string) error {
	type pkg struct{ name, version, arch, source, status string }
	var pkgs []pkg
	var cur pkg
	flush := func() {
		if cur.name != "" && strings.HasSuffix(cur.status, " installed") {
			pkgs = append(pkgs, cur)
		}
		cur = pkg{}
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		k, v, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(line, " ") {
			continue
		}
		switch k {
		case "Package":
			cur.name = v
		case "Version":
			cur.version = v
		case "Architecture":
			cur.arch = v
		case "Source":
			cur.source = v
		case "Status":
			cur.status = v
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the dpkg status: %w", err)
	}
	flush()
	slices.SortFunc(pkgs, func(a, b pkg) int { return strings.Compare(a.name, b.name) })
	for _, p := range pkgs {
		purl := fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s&distro=debian-%s", p.name, url.PathEscape(p.version), p.arch, suite)
		sp := spdxPackage{
			Name: p.name, SPDXID: spdxID("deb", p.name, p.version), VersionInfo: p.version,
			Supplier: "Organization: Debian", DownloadLocation: "NOASSERTION",
			ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", purl}},
		}
		if p.source != "" {
			sp.Comment = "source package " + p.source
		}
		s.add(sp)
	}
	return nil
}

// document returns the SPDX JSON. The image itself is the described package; everything else
// is contained in it. The namespace is derived from the content, so the same image gives the
// same document.
func (s *sbom) document(epoch time.Time) ([]byte, error) {
	root := spdxPackage{Name: "fusebox-" + s.image, SPDXID: "SPDXRef-image-" + s.image, DownloadLocation: "NOASSERTION",
		Comment: "the fusebox " + s.image + " image"}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name: "fusebox-" + s.image,
		CreationInfo: spdxCreationInfo{
			Created:  epoch.UTC().Format(time.RFC3339),
			Creators: []string{"Tool: fusebox image build"},
		},
		DocumentDescribes: []string{root.SPDXID},
		Packages:          append([]spdxPackage{root}, s.pkgs...),
	}
	for _, p := range s.pkgs {
		doc.Relationships = append(doc.Relationships, spdxRelationship{root.SPDXID, "CONTAINS", p.SPDXID})
	}
	body, err := json.Marshal(doc.Packages)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	doc.DocumentNamespace = "urn:fusebox:sbom:" + s.image + ":" + hex.EncodeToString(sum[:])
	return json.MarshalIndent(doc, "", "  ")
}
