package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// file is one entry of a layer that fusebox assembles itself (binaries, certificates,
// directories). Content comes from src (a host file) or data.
type file struct {
	name     string // inside the image, without a leading slash
	dir      bool
	mode     int64
	uid, gid int
	src      string
	data     []byte
}

// filesLayer makes a reproducible layer of files: entries sorted by name, parents created,
// every time set to epoch, numeric owners only, gzip at a fixed level. The layer is built in
// memory (binaries and certificates, tens of MB at most).
func filesLayer(files []file, epoch time.Time) (v1.Layer, error) {
	byName := map[string]file{}
	for _, f := range files {
		f.name = strings.Trim(path.Clean(f.name), "/")
		byName[f.name] = f
		for d := path.Dir(f.name); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := byName[d]; !ok {
				byName[d] = file{name: d, dir: true, mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, n := range names {
		f := byName[n]
		h := &tar.Header{Name: n, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: epoch, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			continue
		}
		data := f.data
		if f.src != "" {
			b, err := os.ReadFile(f.src)
			if err != nil {
				return nil, fmt.Errorf("reading %s for /%s: %w", f.src, n, err)
			}
			data = b
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	if err := gzipTo(&gz, &raw); err != nil {
		return nil, err
	}
	b := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}

// gzipTo compresses r into w at a fixed level with no name and no time in the header:
// identical input gives identical bytes with the same Go release.
func gzipTo(w io.Writer, r io.Reader) error {
	zw, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	if _, err := io.Copy(zw, r); err != nil {
		return err
	}
	return zw.Close()
}
