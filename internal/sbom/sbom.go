// Package sbom writes software bills of materials as SPDX 2.3 JSON, the subset a list of
// packages needs: the image described as the root package, and every package it contains,
// each with a package URL (purl). fusebox image build lists its images' Go modules and Debian
// packages with it, and fusebox template build lists what a built template holds, read from
// the image itself (FromImage): Debian and Alpine packages and Python distributions.
//
// A document is a function of its packages and an epoch: the same image gives the same bytes.
package sbom

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

// Package is one SPDX package.
type Package struct {
	Name             string        `json:"name"`
	SPDXID           string        `json:"SPDXID"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	Supplier         string        `json:"supplier,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	Comment          string        `json:"comment,omitempty"`
	ExternalRefs     []ExternalRef `json:"externalRefs,omitempty"`
	Checksums        []Checksum    `json:"checksums,omitempty"`
}

// Checksum is a package's digest.
type Checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

// ExternalRef is a package's reference elsewhere; PURL makes the usual one.
type ExternalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

// PURL is the external reference of a package URL.
func PURL(purl string) []ExternalRef {
	return []ExternalRef{{"PACKAGE-MANAGER", "purl", purl}}
}

type document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      creationInfo   `json:"creationInfo"`
	DocumentDescribes []string       `json:"documentDescribes"`
	Packages          []Package      `json:"packages"`
	Relationships     []relationship `json:"relationships"`
}

type creationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// Meta describes the document and its root package, the image.
type Meta struct {
	// Name names the document and the root package.
	Name string
	// ID makes the root package's id (SPDXRef-image-ID) and the namespace's prefix.
	ID string
	// Comment is the root package's comment.
	Comment string
	// Tool is the creator, "Tool: <Tool>".
	Tool string
}

// SBOM accumulates the packages of one image. Not safe for concurrent use.
type SBOM struct {
	meta Meta
	pkgs []Package
	seen map[string]bool
}

// New returns an empty SBOM of the image meta describes.
func New(meta Meta) *SBOM { return &SBOM{meta: meta, seen: map[string]bool{}} }

// Add adds p, unless a package with its SPDXID is already there.
func (s *SBOM) Add(p Package) {
	if s.seen[p.SPDXID] {
		return
	}
	s.seen[p.SPDXID] = true
	s.pkgs = append(s.pkgs, p)
}

// Len is the number of packages added.
func (s *SBOM) Len() int { return len(s.pkgs) }

// Packages returns the packages added, in order.
func (s *SBOM) Packages() []Package { return slices.Clone(s.pkgs) }

var idUnsafe = strings.NewReplacer("/", "-", "@", "-", "+", "-", "~", "-", ":", "-", "_", "-", " ", "-")

// ID is an SPDX id for a package of kind ("deb", "go", "pypi") name and version.
func ID(kind, name, version string) string {
	return "SPDXRef-" + kind + "-" + idUnsafe.Replace(name) + "-" + idUnsafe.Replace(version)
}

// stanzas splits a Debian control-style database (dpkg's status, apk's installed) into its
// stanzas, each a map of field to value; sep is the separator after the field's name.
func stanzas(data []byte, sep string) ([]map[string]string, error) {
	var out []map[string]string
	cur := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = map[string]string{}
			}
			continue
		}
		if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			continue // a continuation line
		}
		if k, v, ok := strings.Cut(line, sep); ok {
			cur[k] = strings.TrimSpace(v)
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out, sc.Err()
}

// AddDpkgStatus lists the installed packages of a dpkg status file, as packages of vendor's
// distribution distro (purl pkg:deb/VENDOR/NAME@VERSION?arch=ARCH&distro=DISTRO, for
// example vendor "debian", distro "debian-12").
func (s *SBOM) AddDpkgStatus(status []byte, vendor, distro string) error {
	all, err := stanzas(status, ": ")
	if err != nil {
		return fmt.Errorf("reading the dpkg status: %w", err)
	}
	slices.SortFunc(all, func(a, b map[string]string) int { return strings.Compare(a["Package"], b["Package"]) })
	for _, p := range all {
		if p["Package"] == "" || !strings.HasSuffix(p["Status"], " installed") {
			continue
		}
		purl := fmt.Sprintf("pkg:deb/%s/%s@%s?arch=%s", vendor, p["Package"], url.PathEscape(p["Version"]), p["Architecture"])
		if distro != "" {
			purl += "&distro=" + distro
		}
		sp := Package{
			Name: p["Package"], SPDXID: ID("deb", p["Package"], p["Version"]), VersionInfo: p["Version"],
			DownloadLocation: "NOASSERTION", ExternalRefs: PURL(purl),
		}
		if vendor == "debian" {
			sp.Supplier = "Organization: Debian"
		}
		if src := p["Source"]; src != "" {
			sp.Comment = "source package " + src
		}
		s.Add(sp)
	}
	return nil
}

// AddApkInstalled lists the packages of an Alpine apk database (lib/apk/db/installed).
func (s *SBOM) AddApkInstalled(db []byte, distro string) error {
	all, err := stanzas(db, ":")
	if err != nil {
		return fmt.Errorf("reading the apk database: %w", err)
	}
	slices.SortFunc(all, func(a, b map[string]string) int { return strings.Compare(a["P"], b["P"]) })
	for _, p := range all {
		if p["P"] == "" {
			continue
		}
		purl := fmt.Sprintf("pkg:apk/alpine/%s@%s?arch=%s", p["P"], url.PathEscape(p["V"]), p["A"])
		if distro != "" {
			purl += "&distro=" + distro
		}
		s.Add(Package{Name: p["P"], SPDXID: ID("apk", p["P"], p["V"]), VersionInfo: p["V"],
			DownloadLocation: "NOASSERTION", ExternalRefs: PURL(purl)})
	}
	return nil
}

// AddPythonMetadata lists the Python distribution whose METADATA (or PKG-INFO) is metadata,
// found at where in the image. A file without a name and version adds nothing.
func (s *SBOM) AddPythonMetadata(where string, metadata []byte) {
	var name, version string
	for _, line := range strings.Split(string(metadata), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			break // the headers end; the description follows
		}
		if k, v, ok := strings.Cut(line, ": "); ok {
			switch k {
			case "Name":
				name = strings.TrimSpace(v)
			case "Version":
				version = strings.TrimSpace(v)
			}
		}
	}
	if name == "" || version == "" {
		return
	}
	// PEP 503 normalisation, as the pypi purl type asks.
	norm := strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(name))
	s.Add(Package{Name: name, SPDXID: ID("pypi", norm, version), VersionInfo: version, DownloadLocation: "NOASSERTION",
		Comment: "installed at /" + strings.TrimPrefix(where, "/"), ExternalRefs: PURL("pkg:pypi/" + norm + "@" + url.PathEscape(version))})
}

// Document returns the SPDX JSON, created at epoch. The image is the described package;
// everything else is contained in it. The namespace is derived from the content, so the same
// packages give the same document.
func (s *SBOM) Document(epoch time.Time) ([]byte, error) {
	root := Package{Name: s.meta.Name, SPDXID: "SPDXRef-image-" + s.meta.ID, DownloadLocation: "NOASSERTION", Comment: s.meta.Comment}
	doc := document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name: s.meta.Name,
		CreationInfo: creationInfo{
			Created:  epoch.UTC().Format(time.RFC3339),
			Creators: []string{"Tool: " + s.meta.Tool},
		},
		DocumentDescribes: []string{root.SPDXID},
		Packages:          append([]Package{root}, s.pkgs...),
	}
	for _, p := range s.pkgs {
		doc.Relationships = append(doc.Relationships, relationship{root.SPDXID, "CONTAINS", p.SPDXID})
	}
	body, err := json.Marshal(doc.Packages)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	doc.DocumentNamespace = "urn:fusebox:sbom:" + s.meta.ID + ":" + hex.EncodeToString(sum[:])
	return json.MarshalIndent(doc, "", "  ")
}
