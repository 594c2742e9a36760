package runsc_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// readConfig returns the parsed config.json of bundle dir.
func readConfig(t *testing.T, dir string) *specs.Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// mountAt returns the mount at dest, or nil.
func mountAt(s *specs.Spec, dest string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dest {
			return &s.Mounts[i]
		}
	}
	return nil
}

func TestWriteBundleHostRoot(t *testing.T) {
	sock := t.TempDir()
	dir := filepath.Join(t.TempDir(), "bundle")
	err := runsc.WriteBundle(runsc.BundleSpec{
		Dir:              dir,
		Args:             []string{"/opt/fusebox/fusebox-sandbox", "--listen=/run/fusebox"},
		Env:              []string{"A=b"},
		Mounts:           []runsc.Mount{{Source: sock, Destination: "/run/fusebox"}, {Source: "/usr/bin", Destination: "/opt/fusebox", ReadOnly: true}},
		MemoryLimitBytes: 256 << 20,
		CPUQuota:         1.5,
		CPUShares:        512,
		PidsLimit:        128,
		TmpSizeBytes:     64 << 20,
	})
	if err != nil {
		t.Fatalf("WriteBundle: %v", err)
	}
	s := readConfig(t, dir)

	if s.Root == nil || !s.Root.Readonly || s.Root.Path != "rootfs" {
		t.Errorf("root = %+v, want read-only rootfs", s.Root)
	}
	var nsTypes []specs.LinuxNamespaceType
	for _, ns := range s.Linux.Namespaces {
		nsTypes = append(nsTypes, ns.Type)
	}
	if want := []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace}; !slices.Equal(nsTypes, want) {
		t.Errorf("namespaces = %v, want %v (and no network namespace)", nsTypes, want)
	}

	p := s.Process
	if !p.NoNewPrivileges {
		t.Error("noNewPrivileges is not set")
	}
	if p.User.UID != 0 || p.Cwd != runsc.DefaultWorkspace {
		t.Errorf("user %+v cwd %q, want root in %s", p.User, p.Cwd, runsc.DefaultWorkspace)
	}
	if !slices.Equal(p.Env, []string{runsc.DefaultPath, "A=b"}) {
		t.Errorf("env = %q", p.Env)
	}
	wantCaps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	if c := p.Capabilities; !slices.Equal(c.Bounding, wantCaps) || !slices.Equal(c.Effective, wantCaps) || len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
		t.Errorf("capabilities = %+v", c)
	}

	r := s.Linux.Resources
	if r == nil || r.Memory == nil || *r.Memory.Limit != 256<<20 {
		t.Errorf("memory limit missing: %+v", r)
	}
	if r.CPU == nil || r.CPU.Shares == nil || *r.CPU.Shares != 512 {
		t.Errorf("cpu = %+v, want 512 shares", r.CPU)
	}
	if r.CPU == nil || *r.CPU.Quota != 150_000 || *r.CPU.Period != 100_000 {
		t.Errorf("cpu = %+v, want quota 150000 per 100000", r.CPU)
	}
	if r.Pids == nil || r.Pids.Limit != 128 {
		t.Errorf("pids = %+v", r.Pids)
	}

	for dest, wantType := range map[string]string{"/proc": "proc", "/sys": "sysfs", "/usr": "bind", "/tmp": "tmpfs", "/workspace": "tmpfs", "/run/fusebox": "bind", "/opt/fusebox": "bind"} {
		m := mountAt(s, dest)
		if m == nil || m.Type != wantType {
			t.Errorf("mount at %s = %+v, want type %s", dest, m, wantType)
		}
	}
	if m := mountAt(s, "/tmp"); m != nil && !slices.Contains(m.Options, "size=67108864") {
		t.Errorf("/tmp options %q lack the size", m.Options)
	}
	for dest, ro := range map[string]bool{"/usr": true, "/opt/fusebox": true, "/run/fusebox": false} {
		if m := mountAt(s, dest); m != nil && slices.Contains(m.Options, "ro") != ro {
			t.Errorf("mount at %s options %q, want read-only %v", dest, m.Options, ro)
		}
	}
	// Nothing of the host but the system directories, and no host /etc.
	for _, m := range s.Mounts {
		if m.Type != "bind" || m.Source == sock || m.Destination == "/opt/fusebox" {
			continue
		}
		if !slices.Contains([]string{"/usr", "/bin", "/sbin", "/lib", "/lib64"}, m.Source) || !slices.Contains(m.Options, "ro") {
			t.Errorf("unexpected host mount %+v", m)
		}
	}

	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		want, err := os.Readlink(d)
		if err != nil {
			continue // a directory (bound) or missing on this host
		}
		if got, err := os.Readlink(filepath.Join(rootfs, d)); err != nil || got != want {
			t.Errorf("rootfs%s -> %q (%v), want the host's link -> %q", d, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc/passwd")); err != nil {
		t.Errorf("rootfs has no /etc/passwd: %v", err)
	}
	for _, secret := range []string{"etc/shadow", "etc/gshadow", "etc/sudoers", "etc/ssh", "etc/ssl/private", "etc/machine-id"} {
		if _, err := os.Lstat(filepath.Join(rootfs, secret)); err == nil {
			t.Errorf("rootfs contains %s", secret)
		}
	}
}

func TestWriteBundleOptions(t *testing.T) {
	image := t.TempDir()
	etc := filepath.Join(t.TempDir(), "etc")
	if err := runsc.WriteSanitizedEtc(etc); err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()

	t.Run("image root", func(t *testing.T) {
		dir := t.TempDir() // exists and is empty: accepted
		if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, RootFS: image, Args: []string{"/bin/true"}}); err != nil {
			t.Fatal(err)
		}
		s := readConfig(t, dir)
		if s.Root.Path != image || !s.Root.Readonly {
			t.Errorf("root = %+v, want %s read-only", s.Root, image)
		}
		if m := mountAt(s, "/usr"); m != nil {
			t.Errorf("image root has a host mount %+v", m)
		}
		if _, err := os.Stat(filepath.Join(dir, "rootfs")); err == nil {
			t.Error("image root bundle has a rootfs directory")
		}
	})
	t.Run("shared etc, host workspace, user, netns", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "b")
		err := runsc.WriteBundle(runsc.BundleSpec{
			Dir: dir, EtcDir: etc, WorkspaceHostDir: ws, Workspace: "/w", Cwd: "/w/src",
			UID: 1000, GID: 1000, Hostname: "box", NetNSPath: "/var/run/netns/fbx",
			Args: []string{"/bin/true"},
		})
		if err != nil {
			t.Fatal(err)
		}
		s := readConfig(t, dir)
		if m := mountAt(s, "/etc"); m == nil || m.Source != etc || !slices.Contains(m.Options, "ro") {
			t.Errorf("/etc mount = %+v, want %s read-only", m, etc)
		}
		if _, err := os.Lstat(filepath.Join(dir, "rootfs/etc")); err == nil {
			t.Error("rootfs/etc was copied although EtcDir is set")
		}
		if m := mountAt(s, "/w"); m == nil || m.Source != ws || !slices.Contains(m.Options, "rw") {
			t.Errorf("workspace mount = %+v, want %s read-write", m, ws)
		}
		if p := s.Process; p.User.UID != 1000 || p.User.GID != 1000 || p.Cwd != "/w/src" || len(p.Capabilities.Effective) != 0 || len(p.Capabilities.Permitted) != 0 {
			t.Errorf("process = %+v caps %+v, want uid 1000 with no effective capabilities", p.User, p.Capabilities)
		}
		if s.Hostname != "box" {
			t.Errorf("hostname = %q", s.Hostname)
		}
		if !slices.Contains(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/var/run/netns/fbx"}) {
			t.Errorf("namespaces = %+v, want the network namespace", s.Linux.Namespaces)
		}
		if s.Linux.Resources != nil {
			t.Errorf("resources = %+v, want none", s.Linux.Resources)
		}
	})
	t.Run("workspace tmpfs owned by the user", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "b")
		if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, EtcDir: etc, UID: 1000, GID: 100, Args: []string{"/bin/true"}, WorkspaceSizeBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		m := mountAt(readConfig(t, dir), runsc.DefaultWorkspace)
		if m == nil || m.Type != "tmpfs" || !slices.Contains(m.Options, "uid=1000") || !slices.Contains(m.Options, "gid=100") || !slices.Contains(m.Options, "size=1073741824") {
			t.Errorf("workspace = %+v", m)
		}
	})
}

// Limits that must fail inside the sandbox: the memory-backed filesystems are capped below
// the memory limit by default, the commands' process count is RLIMIT_NPROC (enforced by
// gVisor), and a server that runs its commands as another user keeps only the capabilities
// that needs.
func TestWriteBundleLimitsInside(t *testing.T) {
	etc := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "b")
	err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, EtcDir: etc, Args: []string{"/bin/true"},
		MemoryLimitBytes: 1 << 30, ProcessLimit: 300, PidsLimit: 4000, CommandUser: &runsc.User{UID: 65532, GID: 65533}})
	if err != nil {
		t.Fatal(err)
	}
	s := readConfig(t, dir)
	for dest, size := range map[string]string{runsc.DefaultWorkspace: "size=536870912", "/tmp": "size=134217728"} {
		if m := mountAt(s, dest); m == nil || m.Type != "tmpfs" || !slices.Contains(m.Options, size) {
			t.Errorf("%s = %+v, want a tmpfs with %s (a share of the memory limit)", dest, m, size)
		}
	}
	if m := mountAt(s, runsc.DefaultWorkspace); m == nil || !slices.Contains(m.Options, "uid=65532") || !slices.Contains(m.Options, "gid=65533") {
		t.Errorf("workspace = %+v, want it owned by the command user", m)
	}
	p := s.Process
	if p.User.UID != 0 || p.User.GID != 0 {
		t.Errorf("init process user %+v, want root (it switches its commands to the command user)", p.User)
	}
	wantCaps := []string{"CAP_SETGID", "CAP_SETUID", "CAP_SYS_RESOURCE"}
	if c := p.Capabilities; !slices.Equal(c.Bounding, wantCaps) || !slices.Equal(c.Effective, wantCaps) || !slices.Equal(c.Permitted, wantCaps) || len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
		t.Errorf("capabilities = %+v, want %v", c, wantCaps)
	}
	// A server that seeds its workspace with an image's files, owners kept, has what that
	// takes too (and drops it before it serves: package privsep).
	seeding := filepath.Join(t.TempDir(), "seed")
	if err := runsc.WriteBundle(runsc.BundleSpec{Dir: seeding, EtcDir: etc, Args: []string{"/bin/true"},
		CommandUser: &runsc.User{UID: 65532, GID: 65533}, SeedWorkspace: true}); err != nil {
		t.Fatal(err)
	}
	seedCaps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_RESOURCE"}
	if c := readConfig(t, seeding).Process.Capabilities; !slices.Equal(c.Bounding, seedCaps) || !slices.Equal(c.Effective, seedCaps) || !slices.Equal(c.Permitted, seedCaps) {
		t.Errorf("capabilities of a seeding server = %+v, want %v", c, seedCaps)
	}
	if !slices.Contains(p.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: 300, Soft: 300}) {
		t.Errorf("rlimits = %+v, want RLIMIT_NPROC 300", p.Rlimits)
	}
	if r := s.Linux.Resources; r == nil || r.Pids == nil || r.Pids.Limit != 4000 {
		t.Errorf("host pids limit = %+v, want the backstop 4000", r)
	}
	// Without a memory limit the caps are gVisor's defaults (no size option).
	dir = filepath.Join(t.TempDir(), "b")
	if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, EtcDir: etc, Args: []string{"/bin/true"}}); err != nil {
		t.Fatal(err)
	}
	for _, dest := range []string{runsc.DefaultWorkspace, "/tmp"} {
		if m := mountAt(readConfig(t, dir), dest); m == nil || slices.ContainsFunc(m.Options, func(o string) bool { return strings.HasPrefix(o, "size=") }) {
			t.Errorf("%s without a memory limit = %+v, want no size option", dest, m)
		}
	}
}

func TestWriteBundleInvalid(t *testing.T) {
	etc := filepath.Join(t.TempDir(), "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"/bin/true"}
	tests := []struct {
		name string
		spec runsc.BundleSpec
		want string
	}{
		{"no args", runsc.BundleSpec{EtcDir: etc}, "Args is required"},
		{"relative rootfs", runsc.BundleSpec{Args: args, RootFS: "img"}, "not absolute"},
		{"rootfs is a file", runsc.BundleSpec{Args: args, RootFS: file}, "not a directory"},
		{"rootfs and etc", runsc.BundleSpec{Args: args, RootFS: etc, EtcDir: etc}, "EtcDir is only"},
		{"relative mount source", runsc.BundleSpec{Args: args, EtcDir: etc, Mounts: []runsc.Mount{{Source: "x", Destination: "/x"}}}, "not absolute"},
		{"missing mount source", runsc.BundleSpec{Args: args, EtcDir: etc, Mounts: []runsc.Mount{{Source: "/nonexistent", Destination: "/x"}}}, "no such file"},
		{"relative destination", runsc.BundleSpec{Args: args, EtcDir: etc, Mounts: []runsc.Mount{{Source: etc, Destination: "x"}}}, "absolute clean"},
		{"unclean destination", runsc.BundleSpec{Args: args, EtcDir: etc, Mounts: []runsc.Mount{{Source: etc, Destination: "/x/../proc"}}}, "absolute clean"},
		{"reserved destination", runsc.BundleSpec{Args: args, EtcDir: etc, Mounts: []runsc.Mount{{Source: etc, Destination: "/etc"}}}, "reserved"},
		{"duplicate destination", runsc.BundleSpec{Args: args, EtcDir: etc, Mounts: []runsc.Mount{{Source: etc, Destination: "/workspace"}}}, "reserved"},
		{"negative limit", runsc.BundleSpec{Args: args, EtcDir: etc, MemoryLimitBytes: -1}, "negative"},
		{"tiny cpu quota", runsc.BundleSpec{Args: args, EtcDir: etc, CPUQuota: 0.001}, "below 1 ms"},
		{"cpu shares below 2", runsc.BundleSpec{Args: args, EtcDir: etc, CPUShares: 1}, "outside 2 to 262144"},
		{"cpu shares too many", runsc.BundleSpec{Args: args, EtcDir: etc, CPUShares: 300000}, "outside 2 to 262144"},
		{"negative process limit", runsc.BundleSpec{Args: args, EtcDir: etc, ProcessLimit: -1}, "negative"},
		{"filesystems fill the memory", runsc.BundleSpec{Args: args, EtcDir: etc, MemoryLimitBytes: 1 << 30, WorkspaceSizeBytes: 1 << 30}, "below MemoryLimitBytes"},
		{"filesystems reach the memory", runsc.BundleSpec{Args: args, EtcDir: etc, MemoryLimitBytes: 1 << 30, WorkspaceSizeBytes: 768 << 20, TmpSizeBytes: 256 << 20}, "below MemoryLimitBytes"},
		{"command user with a non-root server", runsc.BundleSpec{Args: args, EtcDir: etc, UID: 1000, CommandUser: &runsc.User{UID: 65532, GID: 65532}}, "root init process"},
		{"root command user", runsc.BundleSpec{Args: args, EtcDir: etc, CommandUser: &runsc.User{UID: 0, GID: 65532}}, "must not be root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Dir = t.TempDir()
			err := runsc.WriteBundle(tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("WriteBundle = %v, want an error containing %q", err, tt.want)
			}
			if entries, _ := os.ReadDir(tt.spec.Dir); len(entries) != 0 {
				t.Errorf("bundle dir not left empty: %v", entries)
			}
		})
	}

	t.Run("non-empty dir", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, EtcDir: etc, Args: args})
		if err == nil || !strings.Contains(err.Error(), "not empty") {
			t.Fatalf("WriteBundle = %v, want a refusal", err)
		}
		if data, _ := os.ReadFile(filepath.Join(dir, "config.json")); string(data) != "{}" {
			t.Errorf("existing config.json was changed: %q", data)
		}
	})
}
