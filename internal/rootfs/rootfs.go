package rootfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sys/unix"
)

// Names inside a cache directory: <hex>/ is one unpacked image (rootDir, recordFile),
// .tmp-* are unpacks in progress (or interrupted), lockFile serialises unpackers.
const (
	rootDir    = "root"
	recordFile = "image.json"
	tmpPrefix  = ".tmp-"
	lockFile   = ".lock"
)

// Root is an unpacked image.
type Root struct {
	// Dir is the root filesystem: sandboxes use it read-only and never write to it.
	Dir string
	// Digest is the image's manifest digest, which names the directory.
	Digest v1.Hash
	// Config is the image's runtime configuration (Entrypoint, User, Env, WorkingDir).
	Config v1.Config
}

// record is what recordFile holds beside an unpacked root.
type record struct {
	Digest string    `json:"digest"`
	Source string    `json:"source,omitempty"`
	Config v1.Config `json:"config"`
}

// Prepare returns the unpacked root of src's image in cacheDir, unpacking it first unless a
// complete root of the same digest is already there. A reference by digest whose root is
// there is not fetched again, so a registry need not be reachable to restart.
func Prepare(ctx context.Context, src *Source, cacheDir string, log *slog.Logger) (*Root, error) {
	if h, ok := src.Digest(); ok {
		if r, err := lookup(cacheDir, h); err != nil || r != nil {
			return r, err
		}
	}
	img, err := src.Image(ctx)
	if err != nil {
		return nil, err
	}
	r, err := unpack(ctx, img, cacheDir, src.Arg, log)
	var te *transport.Error
	if err != nil && src.Ref != nil && errors.As(err, &te) {
		return nil, src.pullError(err) // a layer the registry refused
	}
	return r, err
}

// Unpack returns the unpacked root of img in cacheDir, unpacking it first unless a complete
// root of the same digest is already there.
func Unpack(ctx context.Context, img v1.Image, cacheDir string, log *slog.Logger) (*Root, error) {
	return unpack(ctx, img, cacheDir, "", log)
}

func unpack(ctx context.Context, img v1.Image, cacheDir, source string, log *slog.Logger) (_ *Root, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("reading the image's digest: %w", err)
	}
	if h.Algorithm != "sha256" {
		return nil, fmt.Errorf("image digest %s: only sha256 digests are supported", h)
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating image cache directory: %w", err)
	}
	if r, err := lookup(cacheDir, h); err != nil || r != nil {
		return r, err
	}
	unlock, err := lock(filepath.Join(cacheDir, lockFile))
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Another unpacker may have finished while this one waited.
	if r, err := lookup(cacheDir, h); err != nil || r != nil {
		return r, err
	}
	// With the lock held, any temporary directory is an interrupted unpack's.
	if err := removeTemps(cacheDir); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config of image %s: %w", h, err)
	}
	if err := checkPlatform(cf); err != nil {
		return nil, fmt.Errorf("image %s: %w", h, err)
	}
	tmp, err := os.MkdirTemp(cacheDir, tmpPrefix+h.Hex[:12]+"-")
	if err != nil {
		return nil, fmt.Errorf("creating a directory to unpack into: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	root := filepath.Join(tmp, rootDir)
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	log.Info("unpacking image", "digest", h.String(), "into", filepath.Join(cacheDir, h.Hex))
	start := time.Now()
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("reading the layers of image %s: %w", h, err)
	}
	archives := make([]opener, len(layers))
	for i, l := range layers {
		archives[i] = l.Uncompressed
	}
	st, err := writeLayers(ctx, archives, root, func(st treeStats) {
		log.Info("unpacking image", "digest", h.String(), "files", st.files, "bytes", st.bytes)
	})
	if err != nil {
		return nil, fmt.Errorf("unpacking image %s: %w", h, err)
	}
	rec := record{Digest: h.String(), Source: source, Config: cf.Config}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, recordFile), append(data, '\n'), 0o600); err != nil {
		return nil, err
	}
	// Everything on disk before the rename makes the root visible: a crash leaves either a
	// temporary directory or a complete root.
	if err := syncFS(tmp); err != nil {
		return nil, err
	}
	final := filepath.Join(cacheDir, h.Hex)
	if err := os.Rename(tmp, final); err != nil {
		return nil, fmt.Errorf("moving the unpacked image into place: %w", err)
	}
	log.Info("unpacked image", "digest", h.String(), "files", st.files, "dirs", st.dirs, "links", st.links,
		"bytes", st.bytes, "skipped_devices", st.devices, "took", time.Since(start).Round(time.Millisecond))
	return &Root{Dir: filepath.Join(final, rootDir), Digest: h, Config: cf.Config}, nil
}

// lookup returns the complete root of digest h in cacheDir, nil if there is none, or an
// error if something other than a complete root has its name.
func lookup(cacheDir string, h v1.Hash) (*Root, error) {
	dir := filepath.Join(cacheDir, h.Hex)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%s is not a complete unpacked image (%s): remove it and start again", dir, fmt.Sprintf(why, args...))
	}
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return nil, bad("%v", err)
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, bad("%s: %v", recordFile, err)
	}
	if rec.Digest != h.String() {
		return nil, bad("it records digest %s", rec.Digest)
	}
	root := filepath.Join(dir, rootDir)
	if info, err := os.Lstat(root); err != nil || !info.IsDir() {
		return nil, bad("no %s directory", rootDir)
	}
	return &Root{Dir: root, Digest: h, Config: rec.Config}, nil
}

// removeTemps removes the temporary directories of interrupted unpacks.
func removeTemps(cacheDir string) error {
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.RemoveAll(filepath.Join(cacheDir, e.Name())); err != nil {
				return fmt.Errorf("removing an interrupted unpack: %w", err)
			}
		}
	}
	return nil
}

// lock takes an exclusive lock on path (created if missing) until unlock is called; the
// kernel drops it if the process dies.
func lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// syncFS flushes the filesystem holding dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
