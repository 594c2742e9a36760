package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ErrMmdebstrap is wrapped when mmdebstrap, which makes the Debian userlands, is missing.
var ErrMmdebstrap = errors.New("mmdebstrap missing")

// rootfsFormat changes whenever normalize changes what it writes, so that cached layers of
// an older format are not reused.
const rootfsFormat = "fusebox-rootfs-3"

// rootfsSpec is a Debian userland made by mmdebstrap.
type rootfsSpec struct {
	// Variant is mmdebstrap's --variant (minbase, essential, extract, ...).
	Variant string
	// Suite is the Debian suite, e.g. bookworm.
	Suite string
	// Packages are passed to --include, sorted and deduplicated.
	Packages []string
	// SandboxUser adds the sandbox user (65532) to etc/passwd and etc/group, home /workspace.
	SandboxUser bool
}

// rootfs is a cached, normalised userland layer.
type rootfs struct {
	layer v1.Layer
	// dpkgStatus is the userland's var/lib/dpkg/status (for the SBOM).
	dpkgStatus []byte
	// cached reports whether the layer came from the cache.
	cached bool
}

// rootfsMeta is what the cache stores beside the layer.
type rootfsMeta struct {
	Key      string   `json:"key"`
	Inputs   []string `json:"inputs"`
	Sources  []string `json:"sources"`
	Mmdebstr string   `json:"mmdebstrap"`
}

// aptSources returns the machine's apt source files (sources.list and the .list/.sources
// files of sources.list.d), located through the apt configuration, never a fixed path.
func aptSources() ([]string, error) {
	out, err := exec.Command("apt-config", "shell", "LIST", "Dir::Etc::sourcelist/f", "PARTS", "Dir::Etc::sourceparts/d").Output()
	if err != nil {
		return nil, fmt.Errorf("reading the apt configuration (apt-config shell): %w: the sandbox userland comes from the Debian mirror the machine's apt sources name", err)
	}
	vals := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok {
			vals[k] = strings.Trim(v, "'")
		}
	}
	var files []string
	if l := vals["LIST"]; l != "" {
		if fi, err := os.Stat(l); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
			files = append(files, l)
		}
	}
	if d := vals["PARTS"]; d != "" {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if n := e.Name(); !e.IsDir() && (strings.HasSuffix(n, ".list") || strings.HasSuffix(n, ".sources")) {
				files = append(files, filepath.Join(d, n))
			}
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no apt sources in the apt configuration (%s, %s): configure the Debian mirror to build from in apt's sources", vals["LIST"], vals["PARTS"])
	}
	return files, nil
}

// mmdebstrapVersion returns mmdebstrap's version line, or ErrMmdebstrap.
func mmdebstrapVersion() (string, string, error) {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", "", fmt.Errorf("%w: the sandbox and node installer userlands are made with mmdebstrap: install the Debian package mmdebstrap (apt-get install mmdebstrap)", ErrMmdebstrap)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", "", fmt.Errorf("running %s --version: %w", bin, err)
	}
	return bin, strings.TrimSpace(string(out)), nil
}

// debianArch is dpkg's name of the build architecture.
func debianArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "amd64"
	case "arm64":
		return "arm64"
	}
	return runtime.GOARCH
}

// buildRootfs returns the userland layer of spec from the cache, or makes it with mmdebstrap
// and caches it. The cache key hashes every input: variant, suite, packages, architecture,
// the apt sources' contents, mmdebstrap's version, the epoch, the Go release (its gzip) and
// the normalisation format. The cache entry is written to a temporary directory and renamed
// into place, so a failed or interrupted build leaves no entry behind.
func buildRootfs(spec rootfsSpec, cacheDir string, epoch time.Time, progress io.Writer) (*rootfs, error) {
	bin, version, err := mmdebstrapVersion()
	if err != nil {
		return nil, err
	}
	sources, err := aptSources()
	if err != nil {
		return nil, err
	}
	pkgs := slices.Clone(spec.Packages)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	key, inputs, err := rootfsKey(spec, pkgs, version, epoch, sources)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cacheDir, "rootfs", key)
	if r, err := loadRootfs(dir); err == nil {
		fmt.Fprintf(progress, "  userland %s (%s, %d packages): cached in %s\n", spec.Variant, spec.Suite, len(pkgs), dir)
		return r, nil
	}

	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("creating the image cache %s: %w (set --cache or $FUSEBOX_CACHE to a writable directory)", cacheDir, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-"+key[:12]+"-")
	if err != nil {
		return nil, fmt.Errorf("creating the image cache %s: %w (set --cache or $FUSEBOX_CACHE to a writable directory)", cacheDir, err)
	}
	defer os.RemoveAll(tmp) // after the rename, there is nothing left to remove
	start := time.Now()
	fmt.Fprintf(progress, "  userland %s (%s, %d packages): mmdebstrap (a few minutes cold)\n", spec.Variant, spec.Suite, len(pkgs))
	rawTar := filepath.Join(tmp, "mmdebstrap.tar")
	if err := mmdebstrap(bin, spec, pkgs, sources, epoch, rawTar); err != nil {
		return nil, err
	}
	layerPath := filepath.Join(tmp, "layer.tar.gz")
	status, err := normalizeRootfs(rawTar, layerPath, spec, epoch)
	if err != nil {
		return nil, fmt.Errorf("normalising the userland made by mmdebstrap: %w", err)
	}
	if err := os.Remove(rawTar); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "dpkg-status"), status, 0o644); err != nil {
		return nil, err
	}
	meta, _ := json.MarshalIndent(rootfsMeta{Key: key, Inputs: inputs, Sources: sources, Mmdebstr: bin}, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), meta, 0o644); err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(dir); statErr != nil { // another build may have won the race
			return nil, fmt.Errorf("caching the userland in %s: %w", dir, err)
		}
	}
	fmt.Fprintf(progress, "  userland built in %s, cached in %s\n", time.Since(start).Round(time.Second), dir)
	r, err := loadRootfs(dir)
	if err != nil {
		return nil, err
	}
	r.cached = false
	return r, nil
}

// rootfsKey returns the cache key of a userland and the inputs it hashes besides the apt
// sources' contents.
func rootfsKey(spec rootfsSpec, pkgs []string, version string, epoch time.Time, sources []string) (key string, inputs []string, err error) {
	inputs = []string{
		"format=" + rootfsFormat,
		"variant=" + spec.Variant,
		"suite=" + spec.Suite,
		"arch=" + debianArch(),
		"packages=" + strings.Join(pkgs, ","),
		fmt.Sprintf("sandboxUser=%v", spec.SandboxUser),
		"mmdebstrap=" + version,
		fmt.Sprintf("epoch=%d", epoch.Unix()),
		"go=" + runtime.Version(),
	}
	h := sha256.New()
	for _, in := range inputs {
		fmt.Fprintln(h, in)
	}
	for _, s := range sources {
		b, err := os.ReadFile(s)
		if err != nil {
			return "", nil, fmt.Errorf("reading apt sources %s: %w", s, err)
		}
		fmt.Fprintf(h, "source %d\n", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), inputs, nil
}

// mmdebstrap runs mmdebstrap (bin) to write the userland of spec with pkgs from sources as a
// tarball at out.
func mmdebstrap(bin string, spec rootfsSpec, pkgs, sources []string, epoch time.Time, out string) error {
	args := []string{"--quiet", "--variant=" + spec.Variant, "--architectures=" + debianArch(), "--format=tar"}
	if len(pkgs) > 0 {
		args = append(args, "--include="+strings.Join(pkgs, ","))
	}
	args = append(args, spec.Suite, out)
	args = append(args, sources...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch.Unix()))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mmdebstrap %s %s with packages %s: %w: %s", spec.Variant, spec.Suite, strings.Join(pkgs, ","), err, lastLines(stderr.String(), 15))
	}
	return nil
}

// loadRootfs opens a cache entry.
func loadRootfs(dir string) (*rootfs, error) {
	status, err := os.ReadFile(filepath.Join(dir, "dpkg-status"))
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "layer.tar.gz")
	if _, err := os.Stat(p); err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromFile(p)
	if err != nil {
		return nil, err
	}
	return &rootfs{layer: l, dpkgStatus: status, cached: true}, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// offsetReader tracks the offset of an unbuffered reader, so that the data offset of each tar
// entry is known after tar.Reader.Next.
type offsetReader struct {
	f   *os.File
	off int64
}

func (r *offsetReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	r.off += int64(n)
	return n, err
}

func (r *offsetReader) Seek(offset int64, whence int) (int64, error) {
	n, err := r.f.Seek(offset, whence)
	r.off = n
	return n, err
}

// tarEntry is an entry of mmdebstrap's tarball and where its data starts.
type tarEntry struct {
	hdr *tar.Header
	off int64
}

// Contents that replace the machine's own files copied in by mmdebstrap: the image must not
// carry the build machine's resolver, host name or apt mirror.
var (
	emptyResolvConf = []byte{}
	imageHostname   = []byte("localhost\n")
)

// normalizeRootfs rewrites mmdebstrap's tarball into a reproducible, gzipped layer at out and
// returns the userland's dpkg status file:
//   - entries sorted by name (mmdebstrap writes dev/ first), names without "./";
//   - times clamped to epoch, user and group names dropped (numeric owners stay), extended
//     attributes (file capabilities) kept;
//   - hard links rewritten so that the first of a group in name order holds the data;
//   - device nodes left out (container runtimes provide /dev), dev/ itself kept;
//   - the machine's apt sources left out (no mirror host in the image), etc/resolv.conf
//     emptied, etc/hostname set to localhost;
//   - with SandboxUser, the sandbox user 65532 added to etc/passwd and etc/group.
func normalizeRootfs(in, out string, spec rootfsSpec, epoch time.Time) ([]byte, error) {
	f, err := os.Open(in)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := readTarEntries(f)
	if err != nil {
		return nil, err
	}
	n := &normalizer{f: f, spec: spec, epoch: epoch}
	n.groupLinks(entries)
	err = writeLayer(out, func(tw *tar.Writer) error {
		for _, e := range entries {
			h, data, err := n.entry(e)
			if err != nil {
				return err
			}
			if err := tw.WriteHeader(h); err != nil {
				return fmt.Errorf("writing %s: %w", h.Name, err)
			}
			if data != nil {
				if _, err := io.CopyN(tw, data, h.Size); err != nil {
					return fmt.Errorf("writing %s: %w", h.Name, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return n.status, nil
}

// readTarEntries reads the headers of mmdebstrap's tarball f, and where each entry's data
// starts, sorted by name, with names without "./" and device nodes and apt sources left out.
func readTarEntries(f *os.File) ([]tarEntry, error) {
	or := &offsetReader{f: f}
	tr := tar.NewReader(or)
	var entries []tarEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag == tar.TypeDir {
			name = strings.TrimSuffix(name, "/")
		}
		if name == "" || name == "." {
			continue
		}
		switch {
		case h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock || h.Typeflag == tar.TypeFifo:
			continue
		case strings.HasPrefix(name, "etc/apt/sources.list.d/") || name == "etc/apt/sources.list":
			continue
		}
		h.Name = name
		if h.Typeflag == tar.TypeLink {
			h.Linkname = strings.TrimPrefix(h.Linkname, "./")
		}
		entries = append(entries, tarEntry{hdr: h, off: or.off})
	}
	slices.SortFunc(entries, func(a, b tarEntry) int { return strings.Compare(a.hdr.Name, b.hdr.Name) })
	return entries, nil
}

// writeLayer writes a gzipped tar file at out with write.
func writeLayer(out string, write func(*tar.Writer) error) error {
	o, err := os.Create(out)
	if err != nil {
		return err
	}
	defer o.Close()
	bw := bufio.NewWriterSize(o, 1<<20)
	zw, err := gzip.NewWriterLevel(bw, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	if err := write(tw); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return o.Close()
}

// normalizer rewrites the entries of mmdebstrap's tarball f one by one.
type normalizer struct {
	f     *os.File
	spec  rootfsSpec
	epoch time.Time
	// firstOf maps a hard link's target in mmdebstrap's tarball to the first name of its
	// group in sorted order, which gets the data.
	firstOf map[string]string
	// dataOf maps a hard link's target to its entry, the one with data.
	dataOf map[string]tarEntry
	// status is the userland's dpkg status file, once its entry has been rewritten.
	status []byte
}

// groupLinks finds the hard-link groups of the sorted entries.
func (n *normalizer) groupLinks(entries []tarEntry) {
	n.firstOf, n.dataOf = map[string]string{}, map[string]tarEntry{}
	for _, e := range entries {
		if e.hdr.Typeflag == tar.TypeLink {
			t := e.hdr.Linkname
			cur, ok := n.firstOf[t]
			if !ok {
				cur = t
			}
			n.firstOf[t] = min(cur, e.hdr.Name)
		}
	}
	for _, e := range entries {
		if _, ok := n.firstOf[e.hdr.Name]; ok {
			n.dataOf[e.hdr.Name] = e
		}
	}
}

// entry returns e's header in the layer's form and the reader of its data, nil for none.
func (n *normalizer) entry(e tarEntry) (*tar.Header, io.Reader, error) {
	h := clean(e.hdr, n.epoch)
	switch h.Typeflag {
	case tar.TypeLink:
		target := e.hdr.Linkname
		first := n.firstOf[target]
		src, ok := n.dataOf[target]
		if !ok {
			return nil, nil, fmt.Errorf("hard link %s to %s, which is not in the tarball", h.Name, target)
		}
		if h.Name != first {
			h.Linkname = first
			return h, nil, nil
		}
		// This link is the first of its group: it takes the data.
		h = clean(src.hdr, n.epoch)
		h.Name = e.hdr.Name
		return h, io.NewSectionReader(n.f, src.off, src.hdr.Size), nil
	case tar.TypeReg:
		if first, ok := n.firstOf[h.Name]; ok && first != h.Name {
			// The original target comes after one of its links: it becomes a link.
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			return h, nil, nil
		}
		content, err := n.content(e)
		if err != nil {
			return nil, nil, err
		}
		if content == nil {
			return h, io.NewSectionReader(n.f, e.off, e.hdr.Size), nil
		}
		h.Size = int64(len(content))
		return h, bytes.NewReader(content), nil
	}
	return h, nil, nil
}

// content returns what replaces the data of the regular file e, or nil to keep it, and keeps
// the dpkg status file.
func (n *normalizer) content(e tarEntry) ([]byte, error) {
	read := func() ([]byte, error) {
		b := make([]byte, e.hdr.Size)
		_, err := n.f.ReadAt(b, e.off)
		return b, err
	}
	switch e.hdr.Name {
	case "etc/resolv.conf":
		return emptyResolvConf, nil
	case "etc/hostname":
		return imageHostname, nil
	case "etc/passwd", "etc/group":
		if !n.spec.SandboxUser {
			return nil, nil
		}
		b, err := read()
		if err != nil {
			return nil, err
		}
		line := "sandbox:x:65532:65532:fusebox sandbox:/workspace:/bin/bash\n"
		if e.hdr.Name == "etc/group" {
			line = "sandbox:x:65532:\n"
		}
		return append(b, line...), nil
	case "var/lib/dpkg/status":
		b, err := read()
		n.status = b
		return nil, err
	}
	return nil, nil
}

// clean returns a copy of h in the layer's canonical form.
func clean(h *tar.Header, epoch time.Time) *tar.Header {
	c := &tar.Header{
		Typeflag: h.Typeflag,
		Name:     h.Name,
		Linkname: h.Linkname,
		Size:     h.Size,
		Mode:     h.Mode,
		Uid:      h.Uid,
		Gid:      h.Gid,
		ModTime:  h.ModTime.UTC().Truncate(time.Second),
		Format:   tar.FormatPAX,
	}
	if c.ModTime.After(epoch) {
		c.ModTime = epoch
	}
	if c.Typeflag == tar.TypeDir {
		c.Name += "/"
	}
	if c.Typeflag != tar.TypeReg {
		c.Size = 0
	}
	for k, v := range h.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			if c.PAXRecords == nil {
				c.PAXRecords = map[string]string{}
			}
			c.PAXRecords[k] = v
		}
	}
	return c
}
