package runsc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Defaults and fixed values of the bundles WriteBundle writes.
const (
	DefaultWorkspace = "/workspace"
	DefaultHostname  = "sandbox"
	DefaultPath      = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	// cpuPeriod is the CFS period CPUQuota is expressed against (100 ms,
	// the kernel's default).
	cpuPeriod uint64 = 100_000
	// noFileLimit is RLIMIT_NOFILE (soft and hard) of the init process:
	// servers and builds need more than the traditional 1024.
	noFileLimit uint64 = 65_536

	// With a memory limit, the memory-backed filesystems default to these
	// shares of it: half for the workspace, an eighth for /tmp. Their files
	// are the sandbox's memory, and a sandbox that reaches its memory limit
	// is killed by the host, so their caps must stay below it (gVisor's own
	// default is half the memory for each).
	workspaceShare = 2
	tmpShare       = 8
)

// hostRootDirs are the host directories a host-derived root is assembled
// from, besides /etc. Each is bound read-only if it is a directory, recreated
// as the same symbolic link if it is one (Debian's /bin -> usr/bin), and
// skipped if missing. Nothing else of the host is visible: not /root, /home,
// /var, /tmp, /work or /run.
var hostRootDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib64"}

// defaultCaps is the capability set of a root init process: the same minimal
// set `runsc spec` writes. Root inside the sandbox has no CAP_DAC_OVERRIDE,
// CAP_CHOWN or CAP_SYS_ADMIN, so file modes bind it like any other user.
var defaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// serverCaps is the capability set of a root init process that runs its
// commands as another user (BundleSpec.CommandUser): CAP_SETUID and
// CAP_SETGID to switch each new command to that user, and CAP_SYS_RESOURCE,
// which exempts the init process from ProcessLimit (gVisor never refuses a
// clone to a holder), so that the commands' processes cannot starve the
// server of threads. A command holds none of them: switching all its user
// ids away from root clears its capabilities.
var serverCaps = []string{"CAP_SETGID", "CAP_SETUID", "CAP_SYS_RESOURCE"}

// seedCaps are serverCaps with what a server that seeds its workspace needs
// for its start alone (BundleSpec.SeedWorkspace): CAP_CHOWN, CAP_DAC_OVERRIDE
// and CAP_FOWNER, to copy a template image's /workspace into the workspace
// with the image's owners and modes (fusebox-sandbox -workspace-seed). It
// drops them from its effective and permitted sets for good before it runs
// anything else (package privsep), as it does every capability but
// serverCaps.
var seedCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_RESOURCE"}

// User is a user and group id inside the sandbox.
type User struct {
	UID, GID uint32
}

// Mount is a bind mount of a host path into the sandbox.
type Mount struct {
	Source      string // absolute host path; must exist
	Destination string // absolute path inside the sandbox
	ReadOnly    bool
}

// BundleSpec describes one sandbox's OCI bundle.
type BundleSpec struct {
	// Dir is the bundle directory to write (config.json, and rootfs/ for a
	// host-derived root). It is created if missing and must be empty if not.
	Dir string
	// RootFS is an unpacked image directory used read-only as the root
	// (package rootfs); several sandboxes may share one.
	// Empty means a root assembled from the host: an empty read-only rootfs
	// directory, read-only binds of /usr and of /bin, /sbin, /lib, /lib64
	// where those are directories (the same symbolic links where they are
	// links), and a sanitised copy of /etc (see WriteSanitizedEtc).
	RootFS string
	// RootWritable makes RootFS (which it requires) the sandbox's writable
	// root, for building an image: writes reach RootFS on the host (gVisor's
	// own root overlay, which would keep them in memory or in a file of its
	// own, is turned off by the rootfs annotations of the config), and
	// neither the workspace nor the /tmp tmpfs is mounted, since what a build
	// step leaves in /tmp or in the workspace belongs to the image as
	// anywhere else (the root's /tmp, if it is a directory, is bound over
	// itself so that gVisor mounts no tmpfs there). The working directory
	// then defaults to /. The sandbox
	// still cannot reach anything of the host outside RootFS and Mounts.
	RootWritable bool
	// EtcDir, with a host-derived root only, is a directory made once with
	// WriteSanitizedEtc and bound read-only at /etc, instead of a fresh copy
	// in each bundle.
	EtcDir string

	// Args is the init process's argv. Required.
	Args []string
	// Env is the init process's environment; DefaultPath is added if it has
	// no PATH.
	Env []string
	// Cwd is the init process's working directory; empty means Workspace.
	Cwd string
	// UID and GID are the init process's user. The default 0 is root of
	// gVisor's kernel, not of the host's, and holds only runsc's minimal
	// capabilities (CAP_AUDIT_WRITE, CAP_KILL, CAP_NET_BIND_SERVICE: no
	// CAP_DAC_OVERRIDE, so file modes bind it); other users get none. The
	// process has no_new_privs either way.
	UID, GID uint32
	// Capabilities, if not nil, replace runsc's minimal set (see UID) as
	// the init process's bounding set and, for root, its effective and
	// permitted sets: a build step running as root needs CAP_CHOWN,
	// CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETUID... as it has under Docker.
	// They are capabilities of gVisor's kernel, not of the host's. Not with
	// CommandUser, which has its own set.
	Capabilities []string
	// CommandUser, if set, is the user the init process runs its commands
	// as (fusebox-sandbox -command-user): the init process must then be root
	// (UID and GID 0) and CommandUser must not be. The init process gets
	// serverCaps instead of the default set, and the workspace tmpfs belongs
	// to CommandUser. Commands then can neither signal nor trace the init
	// process (its real and saved user ids stay root), nor write where only
	// it may (a root-owned socket directory).
	CommandUser *User
	// SeedWorkspace, with CommandUser, gives the init process seedCaps
	// instead of serverCaps: it copies files into the workspace, with their
	// owners, before it serves.
	SeedWorkspace bool

	// Mounts are extra bind mounts (nosuid, nodev), mounted after the
	// workspace and /tmp, for example the per-sandbox socket directory at
	// /run/fusebox and the fusebox-sandbox binary (a single-file bind, so
	// nothing else of its host directory shows) read-only at
	// /opt/fusebox/fusebox-sandbox.
	Mounts []Mount

	// Workspace is where the workspace is mounted; empty means
	// DefaultWorkspace. It is a tmpfs in the sandbox's own memory, owned by
	// UID:GID, unless WorkspaceHostDir is set.
	Workspace string
	// WorkspaceHostDir, if set, is bound read-write at Workspace instead.
	WorkspaceHostDir string
	// WorkspaceSizeBytes caps the workspace tmpfs: a write beyond it fails
	// with ENOSPC inside the sandbox. 0 means half of MemoryLimitBytes, or
	// gVisor's default without a memory limit.
	WorkspaceSizeBytes int64
	// TmpSizeBytes caps the tmpfs at /tmp; 0 means an eighth of
	// MemoryLimitBytes, or gVisor's default without a memory limit. With a
	// memory limit, the two caps together must stay below it.
	TmpSizeBytes int64

	// MemoryLimitBytes, CPUQuota (in cores: 1.5 is 150 ms per 100 ms
	// period) and PidsLimit go to linux.resources; 0 means no limit. runsc
	// applies them to the sandbox's host cgroup, and gVisor sizes the
	// sandbox's memory from the memory limit. The host's pids limit counts
	// gVisor's own host threads (sentry, gofer, systrap stubs), and reaching
	// it kills the whole sandbox: it is a backstop well above what
	// ProcessLimit lets the sandbox's processes cause.
	MemoryLimitBytes int64
	CPUQuota         float64
	PidsLimit        int64
	// CPUShares is linux.resources.cpu.shares (cgroup v1 cpu.shares, 1024 for
	// one core's weight; 2 to 262144, 0 means the cgroup's default of 1024):
	// a weight, not a cap. It only matters when the host's CPUs are all busy,
	// then sandboxes get CPU time in proportion to their shares; an idle host
	// CPU is always theirs to use, so a short command is never throttled.
	CPUShares int64
	// ProcessLimit is RLIMIT_NPROC (soft and hard) of the init process,
	// inherited by its children, and enforced by gVisor inside the sandbox:
	// once a user's processes have created that many tasks (threads count),
	// their fork and clone fail with EAGAIN. A process holding
	// CAP_SYS_RESOURCE is exempt (the init process, with CommandUser). 0
	// means no limit.
	ProcessLimit int64
	// CgroupsPath is linux.cgroupsPath; empty lets runsc use
	// "/<container id>".
	CgroupsPath string

	// Hostname is the sandbox's hostname; empty means DefaultHostname.
	Hostname string
	// NetNSPath is a network namespace (e.g. /var/run/netns/NAME) for a
	// Runtime with Network "sandbox". Empty means no network namespace
	// entry, which is what Network "none" wants.
	NetNSPath string
}

// WriteBundle writes the OCI bundle spec describes: spec.Dir/config.json and,
// for a host-derived root, spec.Dir/rootfs. The config has a read-only root;
// pid, ipc, uts and mount namespaces (a network namespace only with
// NetNSPath); gVisor's own /proc, /sys (read-only) and /dev; tmpfs at /tmp
// and at the workspace; the limits under linux.resources; and
// noNewPrivileges. With RootWritable the root is writable and there is no
// tmpfs at /tmp or at the workspace. On error nothing WriteBundle created is left behind.
func WriteBundle(spec BundleSpec) (err error) {
	if err := spec.validate(); err != nil {
		return err
	}
	undo, err := prepareDir(spec.Dir)
	if err != nil {
		return fmt.Errorf("writing bundle %s: %w", spec.Dir, err)
	}
	defer func() {
		if err != nil {
			undo()
		}
	}()

	var root []specs.Mount
	rootPath := spec.RootFS
	if rootPath == "" {
		rootPath = "rootfs"
		if root, err = writeHostRoot(filepath.Join(spec.Dir, "rootfs"), spec.EtcDir); err != nil {
			return fmt.Errorf("writing bundle %s: %w", spec.Dir, err)
		}
	}
	data, err := json.MarshalIndent(spec.config(rootPath, root), "", "  ")
	if err != nil {
		return fmt.Errorf("writing bundle %s: %w", spec.Dir, err)
	}
	if err := os.WriteFile(filepath.Join(spec.Dir, "config.json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing bundle %s: %w", spec.Dir, err)
	}
	return nil
}

// validate checks spec before anything is written.
func (spec *BundleSpec) validate() error {
	if spec.Dir == "" {
		return badSpec("Dir is required")
	}
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return badSpec("Args is required")
	}
	if err := spec.validatePaths(); err != nil {
		return err
	}
	if err := spec.validateLimits(); err != nil {
		return err
	}
	return spec.validateMounts()
}

func badSpec(format string, args ...any) error {
	return fmt.Errorf("invalid bundle spec: "+format, args...)
}

// validatePaths checks the host paths and the working directory.
func (spec *BundleSpec) validatePaths() error {
	if spec.RootFS != "" {
		if !filepath.IsAbs(spec.RootFS) {
			return badSpec("RootFS %q is not absolute", spec.RootFS)
		}
		if err := isDir(spec.RootFS); err != nil {
			return badSpec("RootFS: %v", err)
		}
		if spec.EtcDir != "" {
			return badSpec("EtcDir is only for a host-derived root (RootFS empty)")
		}
	}
	if spec.RootWritable {
		switch {
		case spec.RootFS == "":
			return badSpec("RootWritable needs RootFS: a host-derived root is never writable")
		case spec.Workspace != "" || spec.WorkspaceHostDir != "" || spec.WorkspaceSizeBytes != 0 || spec.TmpSizeBytes != 0:
			return badSpec("RootWritable mounts no workspace and no /tmp: Workspace, WorkspaceHostDir, WorkspaceSizeBytes and TmpSizeBytes must be empty")
		}
	}
	if spec.EtcDir != "" {
		if !filepath.IsAbs(spec.EtcDir) {
			return badSpec("EtcDir %q is not absolute", spec.EtcDir)
		}
		if err := isDir(spec.EtcDir); err != nil {
			return badSpec("EtcDir: %v", err)
		}
	}
	if spec.Cwd != "" && !filepath.IsAbs(spec.Cwd) {
		return badSpec("Cwd %q is not absolute", spec.Cwd)
	}
	if spec.WorkspaceHostDir != "" {
		if !filepath.IsAbs(spec.WorkspaceHostDir) {
			return badSpec("WorkspaceHostDir %q is not absolute", spec.WorkspaceHostDir)
		}
		if err := isDir(spec.WorkspaceHostDir); err != nil {
			return badSpec("WorkspaceHostDir: %v", err)
		}
	}
	if spec.NetNSPath != "" && !filepath.IsAbs(spec.NetNSPath) {
		return badSpec("NetNSPath %q is not absolute", spec.NetNSPath)
	}
	return nil
}

// validateLimits checks the resource limits and the command user.
func (spec *BundleSpec) validateLimits() error {
	if spec.CPUShares != 0 && (spec.CPUShares < 2 || spec.CPUShares > 262144) {
		return badSpec("CPUShares %d is outside 2 to 262144", spec.CPUShares)
	}
	if spec.MemoryLimitBytes < 0 || spec.CPUQuota < 0 || spec.PidsLimit < 0 || spec.ProcessLimit < 0 ||
		spec.WorkspaceSizeBytes < 0 || spec.TmpSizeBytes < 0 {
		return badSpec("negative limit")
	}
	if spec.MemoryLimitBytes > 0 {
		ws, tmp := spec.memoryFSSizes()
		if ws+tmp >= spec.MemoryLimitBytes {
			return badSpec("WorkspaceSizeBytes + TmpSizeBytes (%d) must stay below MemoryLimitBytes (%d): "+
				"their files are the sandbox's memory, and a sandbox that reaches its memory limit is killed", ws+tmp, spec.MemoryLimitBytes)
		}
	}
	for _, c := range spec.Capabilities {
		if !strings.HasPrefix(c, "CAP_") || strings.ToUpper(c) != c {
			return badSpec("capability %q is not a CAP_ name", c)
		}
	}
	if u := spec.CommandUser; u != nil {
		if spec.Capabilities != nil {
			return badSpec("Capabilities and CommandUser exclude each other: CommandUser has its own set")
		}
		if spec.UID != 0 || spec.GID != 0 {
			return badSpec("CommandUser needs a root init process (UID and GID 0), not %d:%d", spec.UID, spec.GID)
		}
		if u.UID == 0 {
			return badSpec("CommandUser must not be root: commands would share the init process's user and could signal it")
		}
	}
	if spec.CPUQuota > 0 && spec.CPUQuota*float64(cpuPeriod) < 1000 {
		return badSpec("CPUQuota %g is below 1 ms per period", spec.CPUQuota)
	}
	return nil
}

// validateMounts checks the workspace's and the mounts' destinations, and the mounts' sources.
func (spec *BundleSpec) validateMounts() error {
	// Destinations: absolute, clean, distinct, and not over what the
	// bundle itself provides.
	seen := map[string]bool{"/": true, "/proc": true, "/sys": true, "/dev": true, "/tmp": true, "/etc": true}
	for _, d := range hostRootDirs {
		seen[d] = true
	}
	if !spec.RootWritable {
		ws := orDefault(spec.Workspace, DefaultWorkspace)
		if err := checkDest(ws, seen); err != nil {
			return badSpec("Workspace: %v", err)
		}
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) {
			return badSpec("mount source %q is not absolute", m.Source)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return badSpec("mount source: %v", err)
		}
		if err := checkDest(m.Destination, seen); err != nil {
			return badSpec("mount: %v", err)
		}
	}
	return nil
}

// memoryFSSizes returns the caps of the workspace tmpfs (0 with a host
// workspace) and of /tmp, defaults applied; 0 means gVisor's default.
func (spec *BundleSpec) memoryFSSizes() (workspace, tmp int64) {
	workspace, tmp = spec.WorkspaceSizeBytes, spec.TmpSizeBytes
	if workspace == 0 {
		workspace = spec.MemoryLimitBytes / workspaceShare
	}
	if tmp == 0 {
		tmp = spec.MemoryLimitBytes / tmpShare
	}
	if spec.WorkspaceHostDir != "" {
		workspace = 0
	}
	return workspace, tmp
}

// checkDest checks one mount destination and records it in seen.
func checkDest(dest string, seen map[string]bool) error {
	if !filepath.IsAbs(dest) || filepath.Clean(dest) != dest {
		return fmt.Errorf("destination %q is not an absolute clean path", dest)
	}
	if seen[dest] {
		return fmt.Errorf("destination %q is used twice or reserved", dest)
	}
	seen[dest] = true
	return nil
}

// isDir returns an error unless p is a directory.
func isDir(p string) error {
	info, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%s is not a directory", p)
	}
	return nil
}

// prepareDir creates dir, or checks that it is empty, and returns a function
// that removes what WriteBundle writes into it.
func prepareDir(dir string) (undo func(), err error) {
	if err := os.Mkdir(dir, 0o700); err == nil {
		return func() { os.RemoveAll(dir) }, nil
	} else if !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != io.EOF {
		if err == nil {
			return nil, fmt.Errorf("%s is not empty", dir)
		}
		return nil, err
	}
	return func() {
		os.RemoveAll(filepath.Join(dir, "rootfs"))
		os.Remove(filepath.Join(dir, "config.json"))
	}, nil
}

// writeHostRoot creates the rootfs directory of a host-derived root, with
// the symbolic links of hostRootDirs and, unless etcDir is set, a sanitised
// /etc, and returns the bind mounts that complete it.
func writeHostRoot(rootfs, etcDir string) ([]specs.Mount, error) {
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(rootfs, 0o755); err != nil { // undo the umask
		return nil, err
	}
	var mounts []specs.Mount
	for _, d := range hostRootDirs {
		info, err := os.Lstat(d)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, err
		case info.Mode()&os.ModeSymlink != 0:
			// A link such as /bin -> usr/bin resolves the same way inside,
			// where /usr is bound; a link elsewhere dangles.
			target, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			if err := os.Symlink(target, filepath.Join(rootfs, d)); err != nil {
				return nil, err
			}
		case info.IsDir():
			mounts = append(mounts, bindMount(d, d, true))
		}
	}
	if etcDir != "" {
		mounts = append(mounts, bindMount(etcDir, "/etc", true))
	} else if err := WriteSanitizedEtc(filepath.Join(rootfs, "etc")); err != nil {
		return nil, err
	}
	return mounts, nil
}

// bindMount returns a recursive nosuid, nodev bind mount.
func bindMount(source, dest string, readOnly bool) specs.Mount {
	mode := "rw"
	if readOnly {
		mode = "ro"
	}
	return specs.Mount{
		Destination: dest,
		Type:        "bind",
		Source:      source,
		Options:     []string{"rbind", mode, "nosuid", "nodev"},
	}
}

// tmpfsMount returns a nosuid, nodev tmpfs mount; a positive size caps its
// bytes. (runsc passes a tmpfs only mode, size, uid and gid: its inodes are
// capped by gVisor's default, half the host's memory in pages.)
func tmpfsMount(dest string, size int64, extra ...string) specs.Mount {
	opts := append([]string{"nosuid", "nodev"}, extra...)
	if size > 0 {
		opts = append(opts, "size="+strconv.FormatInt(size, 10))
	}
	return specs.Mount{Destination: dest, Type: "tmpfs", Source: "tmpfs", Options: opts}
}

// config returns the OCI config for spec, whose root is rootPath and whose
// host-derived root (if any) needs the bind mounts rootMounts.
func (spec *BundleSpec) config(rootPath string, rootMounts []specs.Mount) *specs.Spec {
	ws := orDefault(spec.Workspace, DefaultWorkspace)

	env := slices.Clone(spec.Env)
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{DefaultPath}, env...)
	}
	capSet := defaultCaps
	if spec.Capabilities != nil {
		capSet = slices.Clone(spec.Capabilities)
	}
	caps := &specs.LinuxCapabilities{Bounding: capSet}
	if spec.UID == 0 {
		caps.Effective, caps.Permitted = capSet, capSet
	}
	owner := User{UID: spec.UID, GID: spec.GID}
	if spec.CommandUser != nil {
		set := serverCaps
		if spec.SeedWorkspace {
			set = seedCaps
		}
		caps = &specs.LinuxCapabilities{Bounding: set, Effective: set, Permitted: set}
		owner = *spec.CommandUser
	}
	rlimits := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: noFileLimit, Soft: noFileLimit}}
	if spec.ProcessLimit > 0 {
		rlimits = append(rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(spec.ProcessLimit), Soft: uint64(spec.ProcessLimit)})
	}
	mounts := spec.mounts(rootMounts, ws, owner)

	namespaces := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
	}
	if spec.NetNSPath != "" {
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.NetNSPath})
	}

	cwd := orDefault(spec.Cwd, ws)
	var annotations map[string]string
	if spec.RootWritable {
		cwd = orDefault(spec.Cwd, "/")
		// gVisor's rootfs hint: a bind of the root with no overlay medium (the empty
		// string is runsc's "no overlay"), so that writes reach the directory.
		annotations = map[string]string{
			"dev.gvisor.spec.rootfs.source":  rootPath,
			"dev.gvisor.spec.rootfs.type":    "bind",
			"dev.gvisor.spec.rootfs.overlay": "",
		}
	}
	return &specs.Spec{
		Version:     specs.Version,
		Annotations: annotations,
		Process: &specs.Process{
			User:            specs.User{UID: spec.UID, GID: spec.GID},
			Args:            slices.Clone(spec.Args),
			Env:             env,
			Cwd:             cwd,
			Capabilities:    caps,
			Rlimits:         rlimits,
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: rootPath, Readonly: !spec.RootWritable},
		Hostname: orDefault(spec.Hostname, DefaultHostname),
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces:  namespaces,
			Resources:   spec.resources(),
			CgroupsPath: spec.CgroupsPath,
		},
	}
}

// mounts returns the sandbox's mounts: /proc and /sys, the host-derived root's rootMounts,
// /tmp, the workspace at ws (owned by owner when it is a tmpfs) and spec's own.
func (spec *BundleSpec) mounts(rootMounts []specs.Mount, ws string, owner User) []specs.Mount {
	wsSize, tmpSize := spec.memoryFSSizes()
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	mounts = append(mounts, rootMounts...)
	if spec.RootWritable {
		// gVisor mounts a tmpfs of its own over an empty /tmp that no mount names, which
		// would drop what a step writes there: the root's own /tmp is bound over itself.
		// Only a directory: a link would be followed on the host.
		tmp := filepath.Join(spec.RootFS, "tmp")
		if info, err := os.Lstat(tmp); err == nil && info.IsDir() {
			mounts = append(mounts, bindMount(tmp, "/tmp", false))
		}
		for _, m := range spec.Mounts {
			mounts = append(mounts, bindMount(m.Source, m.Destination, m.ReadOnly))
		}
		return mounts
	}
	mounts = append(mounts, tmpfsMount("/tmp", tmpSize, "mode=1777"))
	if spec.WorkspaceHostDir != "" {
		mounts = append(mounts, bindMount(spec.WorkspaceHostDir, ws, false))
	} else {
		mounts = append(mounts, tmpfsMount(ws, wsSize, "mode=0755",
			"uid="+strconv.FormatUint(uint64(owner.UID), 10), "gid="+strconv.FormatUint(uint64(owner.GID), 10)))
	}
	for _, m := range spec.Mounts {
		mounts = append(mounts, bindMount(m.Source, m.Destination, m.ReadOnly))
	}
	return mounts
}

// resources returns the sandbox's cgroup limits, nil for none.
func (spec *BundleSpec) resources() *specs.LinuxResources {
	if !(spec.MemoryLimitBytes > 0 || spec.CPUQuota > 0 || spec.CPUShares > 0 || spec.PidsLimit > 0) {
		return nil
	}
	res := &specs.LinuxResources{}
	if spec.MemoryLimitBytes > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &spec.MemoryLimitBytes}
	}
	if spec.CPUQuota > 0 {
		quota, period := int64(spec.CPUQuota*float64(cpuPeriod)), cpuPeriod
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if spec.CPUShares > 0 {
		if res.CPU == nil {
			res.CPU = &specs.LinuxCPU{}
		}
		shares := uint64(spec.CPUShares)
		res.CPU.Shares = &shares
	}
	if spec.PidsLimit > 0 {
		res.Pids = &specs.LinuxPids{Limit: spec.PidsLimit}
	}
	return res
}
