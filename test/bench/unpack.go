package bench

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/fusebox-dev/fusebox/internal/rootfs"
)

// UnpackOptions configure the unpack benchmark.
type UnpackOptions struct {
	// Dir is where the image's layers are written and both unpack into (the same disk for
	// both); empty: a directory under /var/tmp.
	Dir string
	// MiB is the image's uncompressed size (default 300), in Layers layers (default 6).
	MiB, Layers int
	// Rounds is how many times each side unpacks, interleaved (default 3).
	Rounds int
	Log    *slog.Logger
}

// UnpackResult is the JSON `fusebox-bench unpack --json` prints.
type UnpackResult struct {
	// The image: its uncompressed and compressed sizes, layers and files.
	ImageMiB      float64 `json:"image_mib"`
	CompressedMiB float64 `json:"compressed_mib"`
	Layers        int     `json:"layers"`
	Files         int     `json:"files"`
	Rounds        int     `json:"rounds"`
	// UnpackS is the median time of rootfs.Unpack into an empty store (every layer read,
	// decompressed, written and synced); TarS the median of `tar -xzf` of the same layer
	// files in order into an empty directory on the same disk, then syncfs, as the unpack's
	// own sync.
	UnpackS float64 `json:"unpack_s"`
	TarS    float64 `json:"tar_s"`
	// VsTar is UnpackS / TarS: the target is at most 1.5.
	VsTar float64 `json:"unpack_vs_tar"`
}

// Unpack measures fusebox's unpacking of an image into its layer store against tar: a
// synthetic image of o.MiB (files from 1 KiB to 4 MiB, half text-like and half random bytes,
// some hard links and symbolic links, in o.Layers layers, the later ones deleting and
// rewriting some of the earlier ones' files), unpacked by rootfs.Unpack and by GNU tar, in
// alternating rounds.
func Unpack(ctx context.Context, o UnpackOptions) (*UnpackResult, error) {
	if o.MiB <= 0 {
		o.MiB = 300
	}
	if o.Layers <= 0 {
		o.Layers = 6
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if _, err := exec.LookPath("tar"); err != nil {
		return nil, fmt.Errorf("the floor needs GNU tar: %w", err)
	}
	parent := o.Dir
	if parent == "" {
		parent = "/var/tmp"
	}
	dir, err := os.MkdirTemp(parent, "fusebox-bench-unpack-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	o.Log.Info("making the image", "mib", o.MiB, "layers", o.Layers)
	paths, files, err := writeLayers(dir, o.MiB<<20, o.Layers)
	if err != nil {
		return nil, err
	}
	var layers []v1.Layer
	r := &UnpackResult{Layers: o.Layers, Files: files, Rounds: o.Rounds}
	for _, p := range paths {
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		r.CompressedMiB += float64(st.Size()) / (1 << 20)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	r.ImageMiB = float64(o.MiB)

	var unpackT, tarT []time.Duration
	for round := range o.Rounds {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Alternate which goes first, so that neither always finds the other's pages cached.
		sides := []func() error{
			func() error {
				store := filepath.Join(dir, fmt.Sprintf("store-%d", round))
				start := time.Now()
				if _, err := rootfs.Unpack(ctx, img, store, nil); err != nil {
					return fmt.Errorf("rootfs.Unpack: %w", err)
				}
				unpackT = append(unpackT, time.Since(start))
				return os.RemoveAll(store)
			},
			func() error {
				out := filepath.Join(dir, fmt.Sprintf("tar-%d", round))
				start := time.Now()
				if err := untar(ctx, paths, out); err != nil {
					return err
				}
				tarT = append(tarT, time.Since(start))
				return os.RemoveAll(out)
			},
		}
		if round%2 == 1 {
			slices.Reverse(sides)
		}
		for _, side := range sides {
			if err := side(); err != nil {
				return nil, err
			}
		}
		o.Log.Info("unpack round", "round", round+1, "unpack", unpackT[round].Round(time.Millisecond), "tar", tarT[round].Round(time.Millisecond))
	}
	r.UnpackS, r.TarS = median(seconds(unpackT)), median(seconds(tarT))
	r.VsTar = round(r.UnpackS / r.TarS)
	return r, nil
}

// untar extracts the gzip layers in order into out with GNU tar (as root it keeps owners and
// modes, as the unpack does), then syncs out's file system.
func untar(ctx context.Context, layers []string, out string) error {
	if err := os.Mkdir(out, 0o755); err != nil {
		return err
	}
	for _, l := range layers {
		if b, err := exec.CommandContext(ctx, "tar", "-xzf", l, "-C", out).CombinedOutput(); err != nil {
			return fmt.Errorf("tar -xzf %s: %w: %s", l, err, b)
		}
	}
	f, err := os.Open(out)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// seconds are ds in seconds.
func seconds(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

// writeLayers writes layers gzip layer files of about total bytes together into dir and
// returns their paths and the number of files. The content is seeded, so every run measures
// the same image.
func writeLayers(dir string, total, layers int) ([]string, int, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"import", "return", "package", "function", "const", "value", "error", "self", "class", "def", "\n", "  ", "{", "}"}
	per := total / layers
	var paths []string
	files := 0
	var written []string // regular files of earlier layers, some deleted or rewritten later
	for l := range layers {
		p := filepath.Join(dir, fmt.Sprintf("layer-%d.tar.gz", l))
		f, err := os.Create(p)
		if err != nil {
			return nil, 0, err
		}
		zw, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
		if err != nil {
			return nil, 0, err
		}
		tw := tar.NewWriter(zw)
		hdr := func(h *tar.Header) error {
			h.ModTime, h.Format = time.Unix(1767225600, 0), tar.FormatPAX
			return tw.WriteHeader(h)
		}
		base := fmt.Sprintf("usr/lib/layer%d", l)
		for _, d := range []string{"usr/", "usr/lib/", base + "/"} {
			if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}); err != nil {
				return nil, 0, err
			}
		}
		// Later layers delete a few earlier files (whiteouts) and rewrite others.
		if l > 0 {
			for i := 0; i < 3 && len(written) > 0; i++ {
				victim := written[rng.IntN(len(written))]
				if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.Join(filepath.Dir(victim), ".wh."+filepath.Base(victim)), Mode: 0o644}); err != nil {
					return nil, 0, err
				}
			}
		}
		size := 0
		for n := 0; size < per; n++ {
			d := fmt.Sprintf("%s/d%02d", base, n/64)
			if n%64 == 0 {
				if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
					return nil, 0, err
				}
			}
			// Sizes as in a userland: most from 1 to 32 KiB, one in twenty from 64 KiB to
			// 4 MiB (about 70 KiB on average).
			sz := 1<<(10+rng.IntN(6)) + rng.IntN(1024)
			if rng.IntN(20) == 0 {
				sz = 1 << (16 + rng.IntN(7))
			}
			data := make([]byte, sz)
			if n%2 == 0 {
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
			} else {
				var b bytes.Buffer
				for b.Len() < sz {
					b.WriteString(words[rng.IntN(len(words))])
					b.WriteByte(' ')
				}
				copy(data, b.Bytes())
			}
			name := fmt.Sprintf("%s/f%05d", d, n)
			if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(sz)}); err != nil {
				return nil, 0, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, 0, err
			}
			written = append(written, name)
			size += sz
			files++
			if n%50 == 7 {
				if err := hdr(&tar.Header{Typeflag: tar.TypeLink, Name: name + ".hard", Linkname: name}); err != nil {
					return nil, 0, err
				}
				if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: name + ".sym", Linkname: filepath.Base(name), Mode: 0o777}); err != nil {
					return nil, 0, err
				}
				files += 2
			}
		}
		if err := tw.Close(); err != nil {
			return nil, 0, err
		}
		if err := zw.Close(); err != nil {
			return nil, 0, err
		}
		if err := f.Close(); err != nil {
			return nil, 0, err
		}
		paths = append(paths, p)
	}
	return paths, files, nil
}
