package rootdiff

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Compress writes the layer archive r to w gzip-compressed at a fixed level, with no name
// and no time in the gzip header: the same archive gives the same bytes, hence the same
// layer digest, with the same Go release (as internal/image does for its layers).
func Compress(w io.Writer, r io.Reader) error {
	zw, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	if _, err := io.Copy(zw, r); err != nil {
		return fmt.Errorf("compressing the layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compressing the layer: %w", err)
	}
	return nil
}

// Layer returns the OCI layer (media type application/vnd.oci.image.layer.v1.tar+gzip)
// whose compressed archive is the gzip file at path, as Compress writes it. The layer
// reads the file whenever its digests or content are needed (its digest is the file's
// sha256, its diff ID the archive's), so the file must stay until the image is written;
// layers too large for memory stay on disk.
func Layer(path string) (v1.Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening layer %s: %w", path, err)
	}
	var magic [2]byte
	_, err = io.ReadFull(f, magic[:])
	f.Close()
	if err != nil || !bytes.Equal(magic[:], []byte{0x1f, 0x8b}) {
		// An uncompressed file would be compressed again by go-containerregistry, at
		// another level than Compress's.
		return nil, fmt.Errorf("layer %s is not gzip-compressed: write it with Compress", path)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(path) },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("reading layer %s: %w", path, err)
	}
	return l, nil
}
