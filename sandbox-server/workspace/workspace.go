// Package workspace implements the sandbox server's native filesystem primitives (write, read,
// stat, list, mkdir, remove, rename, symlink, find, grep) jailed at the workspace root.
//
// Every path a client sends is first checked lexically by Resolve and then resolved by the
// kernel beneath a descriptor of the workspace root (openat2 with RESOLVE_BENEATH on Linux,
// see root_linux.go), so "..", absolute paths and symlinks cannot leave the workspace, even
// when a symlink is swapped in concurrently: nothing is resolved with a plain os function and
// opened later, and the final step of every change is a single-name *at system call on the
// parent directory's descriptor. Writes are atomic (temp file in the same directory, then
// rename).
package workspace

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/fusebox-dev/fusebox/proto/fusebox/sandbox/v1"
)

// Defaults for zero Options limits.
const (
	DefaultMaxFileBytes   = 1 << 30
	DefaultMaxBatchBytes  = 4<<20 - 64<<10 // gRPC's default 4 MiB message minus framing slack
	DefaultMaxListEntries = 100000
	DefaultMaxGrepMatches = 10000
	DefaultMaxFindResults = 100000
)

const (
	maxNameBytes = 255  // NAME_MAX
	maxPathBytes = 4096 // PATH_MAX
	// maxWalkDepth bounds how deep walks (List, Find, Grep, ReadPlan) descend: each level holds
	// a directory descriptor open, and a hostile tree could be arbitrarily deep.
	maxWalkDepth = 256
	// defaultFileMode and defaultDirMode apply when a request's mode is zero.
	defaultFileMode = 0o644
	defaultDirMode  = 0o755
	// tempPrefix names in-flight atomic writes (TempPrefix).
	tempPrefix = TempPrefix
)

// TempPrefix starts the names of in-flight atomic writes: a file is written under such a name
// in its directory, then renamed into place.
const TempPrefix = ".fusebox-tmp-"

// Options configures Open.
type Options struct {
	// Dir is the host path of the workspace root. It must exist and be a directory. Required.
	Dir string
	// MountPath is the absolute path at which commands see the workspace (e.g. "/workspace").
	// An absolute client path under it is accepted and made relative; any other absolute path
	// is an escape. Required.
	MountPath string
	// MaxFileBytes bounds a single file read or write (DefaultMaxFileBytes if 0).
	MaxFileBytes int64
	// MaxBatchBytes bounds the file data of one WriteFiles or ReadFiles call
	// (DefaultMaxBatchBytes if 0).
	MaxBatchBytes int64
	// MaxListEntries, MaxGrepMatches and MaxFindResults are the server-side caps of List, Grep
	// and Find (defaults above if 0). MaxFindResults also caps the files of one read plan.
	MaxListEntries, MaxGrepMatches, MaxFindResults int
}

// Workspace serves filesystem requests inside one workspace root. It is safe for concurrent use.
type Workspace struct {
	root        *rootDir
	mount       string // cleaned MountPath
	mountPrefix string // mount with a trailing slash

	maxFileBytes, maxBatchBytes     int64
	maxList, maxGrep, maxFind       int
	umask                           uint32 // the process umask, as observed by a probe in Open
	umaskKnown                      bool   // false: always chmod written files
	writeWorkers, minFilesPerWorker int    // WriteFiles worker pool sizing
}

// Open opens the workspace at opts.Dir. It refuses a missing Dir or MountPath rather than
// defaulting them: both decide what clients can reach.
func Open(opts Options) (*Workspace, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("opening workspace: %w: Dir is required", ErrInvalidArgument)
	}
	if opts.MountPath == "" || !path.IsAbs(opts.MountPath) {
		return nil, fmt.Errorf("opening workspace: %w: MountPath must be an absolute path, got %q", ErrInvalidArgument, opts.MountPath)
	}
	if opts.MaxFileBytes < 0 || opts.MaxBatchBytes < 0 || opts.MaxListEntries < 0 || opts.MaxGrepMatches < 0 || opts.MaxFindResults < 0 {
		return nil, fmt.Errorf("opening workspace: %w: negative limit", ErrInvalidArgument)
	}
	fi, err := os.Stat(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("opening workspace %q: %w", opts.Dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("opening workspace %q: not a directory", opts.Dir)
	}
	root, err := openRootDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("opening workspace %q: %w", opts.Dir, err)
	}
	w := &Workspace{
		root:              root,
		mount:             path.Clean(opts.MountPath),
		maxFileBytes:      orDefault(opts.MaxFileBytes, DefaultMaxFileBytes),
		maxBatchBytes:     orDefault(opts.MaxBatchBytes, DefaultMaxBatchBytes),
		maxList:           orDefault(opts.MaxListEntries, DefaultMaxListEntries),
		maxGrep:           orDefault(opts.MaxGrepMatches, DefaultMaxGrepMatches),
		maxFind:           orDefault(opts.MaxFindResults, DefaultMaxFindResults),
		writeWorkers:      min(4, runtime.GOMAXPROCS(0)),
		minFilesPerWorker: 32,
	}
	w.mountPrefix = strings.TrimSuffix(w.mount, "/") + "/"
	w.umask, w.umaskKnown = w.probeUmask()
	return w, nil
}

func orDefault[T int | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// probeUmask learns which permission bits file creation strips (the umask, or a default ACL on
// the root) by creating and removing one temp file, so that writes can skip the fchmod when
// the requested mode survives creation unchanged. A read-only workspace yields ok == false.
func (w *Workspace) probeUmask() (umask uint32, ok bool) {
	d, err := w.root.openDir(".")
	if err != nil {
		return 0, false
	}
	defer d.close()
	tmp, f, err := d.createTemp(0o777)
	if err != nil {
		return 0, false
	}
	defer d.discard(tmp)
	_, mode, err := f.stat()
	f.Close()
	if err != nil {
		return 0, false
	}
	return 0o777 &^ uint32(mode.Perm()), true
}

// Close releases the workspace root. In-flight calls finish first.
func (w *Workspace) Close() error {
	return w.root.close()
}

// Resolve validates a client path and returns it as a clean path relative to the workspace
// root ("." for the root itself). It does no I/O: symlinks are checked when the path is
// resolved beneath the root.
func (w *Workspace) Resolve(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("resolving path: %w: empty", ErrInvalidPath)
	case len(p) > maxPathBytes:
		return "", fmt.Errorf("resolving %q: %w: longer than %d bytes", short(p), ErrInvalidPath, maxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("resolving %q: %w: contains a NUL byte", short(p), ErrInvalidPath)
	}
	var rel string
	if path.IsAbs(p) {
		c := path.Clean(p)
		switch {
		case c == w.mount:
			rel = "."
		case strings.HasPrefix(c, w.mountPrefix):
			rel = c[len(w.mountPrefix):]
		default:
			return "", fmt.Errorf("resolving %q: %w: absolute path not under %s", short(p), ErrEscape, w.mount)
		}
	} else {
		rel = path.Clean(p)
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("resolving %q: %w", short(p), ErrEscape)
		}
	}
	for name := range strings.SplitSeq(rel, "/") {
		if len(name) > maxNameBytes {
			return "", fmt.Errorf("resolving %q: %w: name longer than %d bytes", short(p), ErrInvalidPath, maxNameBytes)
		}
	}
	return rel, nil
}

// resolveOrRoot is Resolve where an empty path means the workspace root.
func (w *Workspace) resolveOrRoot(p string) (string, error) {
	if p == "" {
		return ".", nil
	}
	return w.Resolve(p)
}

// resolveNonRoot is Resolve for operations that cannot apply to the workspace root itself.
func (w *Workspace) resolveNonRoot(op, p string) (string, error) {
	rel, err := w.Resolve(p)
	if err != nil {
		return "", err
	}
	if rel == "." {
		return "", fmt.Errorf("%s %q: %w: the workspace root itself", op, short(p), ErrInvalidPath)
	}
	return rel, nil
}

// short cuts p for error messages.
func short(p string) string {
	const n = 120
	if len(p) <= n {
		return p
	}
	return p[:n] + "..."
}

// parseMode validates a client mode (permission bits plus setuid, setgid and sticky) and
// substitutes def for zero.
func parseMode(m, def uint32) (uint32, error) {
	if m == 0 {
		return def, nil
	}
	if m&^0o7777 != 0 {
		return 0, fmt.Errorf("%w: mode %#o has bits other than 07777", ErrInvalidArgument, m)
	}
	return m, nil
}

// goMode converts Unix permission bits to an fs.FileMode.
func goMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// unixMode converts an fs.FileMode's permission and special bits to Unix bits.
func unixMode(fm fs.FileMode) uint32 {
	m := uint32(fm.Perm())
	if fm&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fm&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fm&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

// needChmod reports whether a file created with perm m would end up with other bits than m.
func (w *Workspace) needChmod(m uint32) bool {
	return !w.umaskKnown || m&0o7000 != 0 || m&w.umask != 0
}

func fileType(fm fs.FileMode) sandboxv1.FileType {
	switch {
	case fm.IsRegular():
		return sandboxv1.FileType_FILE_TYPE_FILE
	case fm.IsDir():
		return sandboxv1.FileType_FILE_TYPE_DIR
	case fm&fs.ModeSymlink != 0:
		return sandboxv1.FileType_FILE_TYPE_SYMLINK
	default:
		return sandboxv1.FileType_FILE_TYPE_OTHER
	}
}

// toFileInfo describes fi, found at rel; target is a symlink's stored target.
func toFileInfo(rel string, fi fs.FileInfo, target string) *sandboxv1.FileInfo {
	return &sandboxv1.FileInfo{
		Path:          rel,
		Type:          fileType(fi.Mode()),
		Size:          uint64(max(fi.Size(), 0)),
		Mode:          unixMode(fi.Mode()),
		Modified:      timestamppb.New(fi.ModTime()),
		SymlinkTarget: target,
	}
}

// joinRel joins a name to a relative directory path, where "." is the root.
func joinRel(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}
