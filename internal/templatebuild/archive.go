package templatebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"time"
)

// ADD of a local archive: as Docker's, a tar archive, uncompressed or compressed with gzip or
// bzip2, is unpacked into the destination directory instead of copied (xz and zstd files are
// refused: they may hold an archive this build cannot unpack). A compressed
// file that holds no tar archive is copied as it is. Entries are written through the image's
// os.Root: a name or a link that leaves the root is refused, and so are device nodes, fifos
// and sockets, each naming the entry.

// compressions are the archive formats ADD unpacks, by their magic.
var compressions = []struct {
	name  string
	magic []byte
}{
	{"gzip", []byte{0x1f, 0x8b}},
	{"bzip2", []byte("BZh")},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
}

// decompress returns r's content decompressed as kind ("tar": as it is).
func decompress(kind string, r io.Reader) (io.ReadCloser, error) {
	switch kind {
	case "tar":
		return io.NopCloser(r), nil
	case "gzip":
		return gzip.NewReader(r)
	case "bzip2":
		return io.NopCloser(bzip2.NewReader(r)), nil
	}
	return nil, fmt.Errorf("%s compression is not supported: COPY the file and unpack it with RUN", kind)
}

// archiveKind returns how ADD unpacks the context file p: "tar", or the compression of a
// compressed tar archive; "" for a file that is copied as it is. An xz- or zstd-compressed
// file is refused: it may be an archive, which this build cannot unpack.
func archiveKind(r *os.Root, p string) (string, error) {
	f, err := r.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	head, _ := br.Peek(8)
	kind := "tar"
	for _, c := range compressions {
		if bytes.HasPrefix(head, c.magic) {
			kind = c.name
		}
	}
	if kind == "xz" || kind == "zstd" {
		return "", fmt.Errorf("%s is %s-compressed, which ADD would unpack if it holds a tar archive, and this build cannot: COPY it and unpack it with RUN", p, kind)
	}
	rc, err := decompress(kind, br)
	if err != nil {
		return "", nil // not what its magic says: a plain file
	}
	defer rc.Close()
	if _, err := tar.NewReader(rc).Next(); err != nil {
		return "", nil
	}
	return kind, nil
}

// unpack unpacks the context archive src (e: its entry, kind: archiveKind's answer) into the
// image directory dst, which exists.
func (w *copyWriter) unpack(src, dst, kind string, e entry) error {
	in, err := w.ctx.Open(src)
	if err != nil {
		return explain(err)
	}
	defer in.Close()
	h := sha256.New()
	rc, err := decompress(kind, io.TeeReader(in, h))
	if err != nil {
		return fmt.Errorf("unpacking %s: %w", src, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hd, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("unpacking %s: %w", src, err)
		}
		if err := w.unpackEntry(src, dst, hd, tr); err != nil {
			return err
		}
	}
	if _, err := io.Copy(io.Discard, in); err != nil { // the rest, for the digest
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != e.digest {
		return fmt.Errorf("%s changed during the build", src)
	}
	return nil
}

// unpackEntry writes one archive entry under dst.
func (w *copyWriter) unpackEntry(src, dst string, hd *tar.Header, r io.Reader) error {
	rel := path.Clean(hd.Name)
	if rel == "." {
		return nil
	}
	bad := func(why string) error { return fmt.Errorf("%s: entry %q %s", src, hd.Name, why) }
	if !fs.ValidPath(rel) {
		return bad("leaves the destination (an absolute name or ..)")
	}
	name := path.Join(dst, rel)
	if err := mkdirAllIn(w.img, path.Dir(name), w.uid, w.gid); err != nil {
		return err
	}
	uid, gid := hd.Uid, hd.Gid
	if w.chowned {
		uid, gid = w.uid, w.gid
	}
	mode := unixMode(hd.Mode)
	existing, err := w.img.Lstat(name)
	exists := err == nil
	if exists && !(existing.IsDir() && hd.Typeflag == tar.TypeDir) {
		if existing.IsDir() {
			return bad(fmt.Sprintf("would replace the directory /%s", name))
		}
		if err := w.img.Remove(name); err != nil {
			return err
		}
		exists = false
	}
	switch hd.Typeflag {
	case tar.TypeDir:
		if !exists {
			if err := w.img.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
		w.dirs = append(w.dirs, dirTime{name, hd.ModTime})
	case tar.TypeReg:
		out, err := w.img.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return explainImage(err)
		}
		if _, err := io.Copy(out, r); err != nil {
			out.Close()
			return fmt.Errorf("unpacking %s: %w", src, err)
		}
		if err := out.Close(); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := w.img.Symlink(hd.Linkname, name); err != nil {
			return err
		}
		return w.img.Lchown(name, uid, gid)
	case tar.TypeLink:
		target := path.Clean(hd.Linkname)
		if !fs.ValidPath(target) {
			return bad("links to a name outside the destination")
		}
		if err := w.img.Link(path.Join(dst, target), name); err != nil {
			return bad(fmt.Sprintf("links to %q: %v", hd.Linkname, explainImage(err)))
		}
		return nil
	default:
		return bad(fmt.Sprintf("is a %s: only files, directories and links are unpacked", typeName(hd.Typeflag)))
	}
	if err := w.img.Chown(name, uid, gid); err != nil {
		return err
	}
	if err := w.img.Chmod(name, mode); err != nil { // after Chown, which clears set-id bits
		return err
	}
	if hd.Typeflag == tar.TypeReg {
		return w.img.Chtimes(name, time.Time{}, hd.ModTime)
	}
	return nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "fifo"
	}
	return fmt.Sprintf("tar entry of type %q", t)
}
