package runscalloc

import (
	"errors"
	"fmt"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// Limits are the resources each sandbox of a template gets: what fusebox local up's
// --sandbox-cpus, --sandbox-cpu-quota, --sandbox-memory, --sandbox-pids and
// --sandbox-workspace set. The zero value of a field means its DefaultLimits value, except
// CPUQuota, whose zero means no quota.
type Limits struct {
	// CPUs is the sandbox's CPU weight, in cores: cpu.shares of CPUs × 1024 (the host
	// cgroup). It is not a cap: a sandbox uses any idle CPU, and only when every CPU is busy
	// do sandboxes get CPU time in proportion to their weights. A CFS quota throttles a
	// sandbox in stalls the size of a slow call (docs/performance.md, "CPU limits"); a
	// weight cannot.
	CPUs float64
	// CPUQuota, if positive, is a hard cap in cores (a CFS quota per 100 ms period), on top of
	// the weight; gVisor then also shows the sandbox that many CPUs (at least 2).
	CPUQuota float64
	// MemoryBytes is the host cgroup memory limit of the whole sandbox: gVisor's kernel and
	// the memory-backed workspace and /tmp count in it. A sandbox that reaches it is killed
	// by the host.
	MemoryBytes int64
	// Processes is how many tasks (processes and threads) the commands may have at once:
	// RLIMIT_NPROC inside gVisor, so a fork beyond it fails with EAGAIN. The host pids limit
	// is derived from it (HostPidsBackstop).
	Processes int64
	// WorkspaceBytes caps the /workspace tmpfs: a write beyond it fails with ENOSPC.
	WorkspaceBytes int64
}

// DefaultLimits are the limits of the default template: a weight of 1 CPU and no quota,
// 1 GiB, 512 tasks, a 512 MiB workspace.
var DefaultLimits = Limits{CPUs: 1, MemoryBytes: 1 << 30, Processes: DefaultProcessLimit, WorkspaceBytes: 512 << 20}

// Bounds of the limits Template accepts.
const (
	// MinMemoryBytes leaves room for gVisor's kernel, the server and a small workspace.
	MinMemoryBytes = 128 << 20
	// MaxCPUs is the largest weight cgroup v1's cpu.shares can express (262144 / 1024).
	MaxCPUs = 256
	// MaxTmpBytes is /tmp's cap when the memory allows it (else an eighth of the memory).
	MaxTmpBytes = 128 << 20
)

// ErrInvalidLimits is wrapped by every error Template returns for a limit out of bounds.
var ErrInvalidLimits = errors.New("invalid sandbox limits")

// Template returns the template with l's limits (defaults applied) and a host-derived root,
// or an error wrapping ErrInvalidLimits that names the flag setting the bad value.
func (l Limits) Template() (Template, error) {
	d := DefaultLimits
	if l.CPUs == 0 {
		l.CPUs = d.CPUs
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Processes == 0 {
		l.Processes = d.Processes
	}
	if l.WorkspaceBytes == 0 {
		l.WorkspaceBytes = d.WorkspaceBytes
	}
	bad := func(format string, a ...any) (Template, error) {
		return Template{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidLimits}, a...)...)
	}
	switch {
	case l.CPUs < 2.0/1024 || l.CPUs > MaxCPUs:
		return bad("--sandbox-cpus %g is outside 0.002 to %d (a weight in cores)", l.CPUs, MaxCPUs)
	case l.CPUQuota < 0 || (l.CPUQuota > 0 && l.CPUQuota < 0.01):
		return bad("--sandbox-cpu-quota %g must be 0 (no quota) or at least 0.01 cores", l.CPUQuota)
	case l.MemoryBytes < MinMemoryBytes:
		return bad("--sandbox-memory %s is below the %s minimum (gVisor's kernel and the server live in it)", formatBytes(l.MemoryBytes), formatBytes(MinMemoryBytes))
	case l.Processes < 16:
		return bad("--sandbox-pids %d is below 16 (a shell and a build need a few tasks each)", l.Processes)
	case l.WorkspaceBytes < 1<<20:
		return bad("--sandbox-workspace %s is below 1 MiB", formatBytes(l.WorkspaceBytes))
	}
	tmp := min(MaxTmpBytes, l.MemoryBytes/8)
	if l.WorkspaceBytes+tmp > l.MemoryBytes*7/8 {
		return bad("--sandbox-workspace %s and /tmp's %s take more than 7/8 of --sandbox-memory %s: their files are the sandbox's memory, and a sandbox that reaches its memory limit is killed; raise --sandbox-memory or lower --sandbox-workspace",
			formatBytes(l.WorkspaceBytes), formatBytes(tmp), formatBytes(l.MemoryBytes))
	}
	return Template{Bundle: runsc.BundleSpec{MemoryLimitBytes: l.MemoryBytes, CPUShares: int64(l.CPUs*1024 + 0.5), CPUQuota: l.CPUQuota,
		WorkspaceSizeBytes: l.WorkspaceBytes, TmpSizeBytes: tmp,
		ProcessLimit: l.Processes, PidsLimit: HostPidsBackstop(l.Processes)}}, nil
}

// formatBytes prints n in the largest binary unit that divides it (1GiB, 768MiB, 1000B).
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}
