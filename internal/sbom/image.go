package sbom

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// maxRead bounds what FromImage reads of one file: a package database or a METADATA larger
// than this is not one.
const maxRead = 64 << 20

// pythonMetadata matches a Python distribution's metadata file anywhere in an image:
// NAME-VERSION.dist-info/METADATA, or an egg-info directory's PKG-INFO.
var pythonMetadata = regexp.MustCompile(`(^|/)[^/]+\.(dist-info/METADATA|egg-info/PKG-INFO)$`)

// FromImage adds to s what img's flattened filesystem says is installed: the dpkg status
// (var/lib/dpkg/status), the apk database (lib/apk/db/installed) and every Python
// distribution's metadata, with the distribution named by etc/os-release (or
// usr/lib/os-release). It reads the image's layers once.
func FromImage(img v1.Image, s *SBOM) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	var dpkg, apk, osRelease []byte
	type meta struct {
		where string
		data  []byte
	}
	var python []meta
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the image's files: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		var dst *[]byte
		switch {
		case name == "var/lib/dpkg/status":
			dst = &dpkg
		case name == "lib/apk/db/installed":
			dst = &apk
		case name == "etc/os-release" || (name == "usr/lib/os-release" && osRelease == nil):
			dst = &osRelease
		case pythonMetadata.MatchString(name):
			python = append(python, meta{where: path.Dir(name)})
			dst = &python[len(python)-1].data
		default:
			continue
		}
		if *dst, err = io.ReadAll(io.LimitReader(tr, maxRead)); err != nil {
			return fmt.Errorf("reading %s in the image: %w", name, err)
		}
	}
	vendor, distro := osID(osRelease)
	if dpkg != nil {
		if err := s.AddDpkgStatus(dpkg, vendor, distro); err != nil {
			return err
		}
	}
	if apk != nil {
		if err := s.AddApkInstalled(apk, distro); err != nil {
			return err
		}
	}
	for _, m := range python {
		s.AddPythonMetadata(m.where, m.data)
	}
	return nil
}

// osID returns the distribution of an os-release file: its ID ("debian"; "debian" when
// there is none, dpkg's own) and ID-VERSION_ID ("debian-12"; empty without a version).
func osID(osRelease []byte) (vendor, distro string) {
	fields := map[string]string{}
	for _, line := range strings.Split(string(osRelease), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			fields[k] = strings.Trim(v, `"'`)
		}
	}
	vendor = fields["ID"]
	if vendor == "" {
		vendor = "debian"
	}
	if v := fields["VERSION_ID"]; v != "" {
		distro = vendor + "-" + v
	}
	return vendor, distro
}
