package runscalloc

import (
	"errors"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// TestDefaultTemplate: the default template is DefaultLimits' (a CPU weight, no quota) and
// its bundle passes the bundle's own checks.
func TestDefaultTemplate(t *testing.T) {
	b := DefaultTemplate().Bundle
	want := runsc.BundleSpec{MemoryLimitBytes: 1 << 30, CPUShares: 1024, WorkspaceSizeBytes: 512 << 20, TmpSizeBytes: 128 << 20,
		ProcessLimit: 512, PidsLimit: 3072}
	if b.MemoryLimitBytes != want.MemoryLimitBytes || b.CPUShares != want.CPUShares || b.CPUQuota != 0 ||
		b.WorkspaceSizeBytes != want.WorkspaceSizeBytes || b.TmpSizeBytes != want.TmpSizeBytes ||
		b.ProcessLimit != want.ProcessLimit || b.PidsLimit != want.PidsLimit {
		t.Fatalf("default bundle limits = %+v, want %+v", b, want)
	}
	b.Dir, b.Args, b.EtcDir = t.TempDir(), []string{"/bin/true"}, t.TempDir()
	if err := runsc.WriteBundle(b); err != nil {
		t.Fatalf("the default template's bundle is refused: %v", err)
	}
}

func TestLimitsTemplate(t *testing.T) {
	tests := []struct {
		name    string
		l       Limits
		wantErr string // empty: valid
		check   func(t *testing.T, b runsc.BundleSpec)
	}{
		{name: "zero is the default", l: Limits{}, check: func(t *testing.T, b runsc.BundleSpec) {
			if b.CPUShares != 1024 || b.MemoryLimitBytes != 1<<30 || b.ProcessLimit != 512 || b.WorkspaceSizeBytes != 512<<20 {
				t.Errorf("bundle %+v", b)
			}
		}},
		{name: "all set", l: Limits{CPUs: 2.5, CPUQuota: 1.5, MemoryBytes: 4 << 30, Processes: 2000, WorkspaceBytes: 3 << 30},
			check: func(t *testing.T, b runsc.BundleSpec) {
				if b.CPUShares != 2560 || b.CPUQuota != 1.5 || b.MemoryLimitBytes != 4<<30 || b.ProcessLimit != 2000 ||
					b.PidsLimit != HostPidsBackstop(2000) || b.WorkspaceSizeBytes != 3<<30 || b.TmpSizeBytes != 128<<20 {
					t.Errorf("bundle %+v", b)
				}
			}},
		{name: "small memory shrinks /tmp", l: Limits{MemoryBytes: 256 << 20, WorkspaceBytes: 128 << 20},
			check: func(t *testing.T, b runsc.BundleSpec) {
				if b.TmpSizeBytes != 32<<20 {
					t.Errorf("/tmp %d, want 32 MiB", b.TmpSizeBytes)
				}
			}},
		{name: "fractional weight", l: Limits{CPUs: 0.25}, check: func(t *testing.T, b runsc.BundleSpec) {
			if b.CPUShares != 256 {
				t.Errorf("shares %d, want 256", b.CPUShares)
			}
		}},
		{name: "negative cpus", l: Limits{CPUs: -1}, wantErr: "--sandbox-cpus"},
		{name: "too many cpus", l: Limits{CPUs: 300}, wantErr: "--sandbox-cpus"},
		{name: "negative quota", l: Limits{CPUQuota: -1}, wantErr: "--sandbox-cpu-quota"},
		{name: "tiny quota", l: Limits{CPUQuota: 0.001}, wantErr: "--sandbox-cpu-quota"},
		{name: "tiny memory", l: Limits{MemoryBytes: 64 << 20, WorkspaceBytes: 8 << 20}, wantErr: "--sandbox-memory 64MiB is below the 128MiB minimum"},
		{name: "negative memory", l: Limits{MemoryBytes: -1}, wantErr: "--sandbox-memory"},
		{name: "few pids", l: Limits{Processes: 3}, wantErr: "--sandbox-pids 3"},
		{name: "tiny workspace", l: Limits{WorkspaceBytes: 1000}, wantErr: "--sandbox-workspace 1000B"},
		{name: "workspace fills the memory", l: Limits{MemoryBytes: 1 << 30, WorkspaceBytes: 1 << 30}, wantErr: "raise --sandbox-memory or lower --sandbox-workspace"},
		{name: "workspace over the default memory", l: Limits{WorkspaceBytes: 2 << 30}, wantErr: "--sandbox-memory 1GiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := tt.l.Template()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalidLimits) {
					t.Fatalf("Template() = %v, want ErrInvalidLimits naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Template(): %v", err)
			}
			tt.check(t, tmpl.Bundle)
			b := tmpl.Bundle
			b.Dir, b.Args, b.EtcDir = t.TempDir(), []string{"/bin/true"}, t.TempDir()
			if err := runsc.WriteBundle(b); err != nil {
				t.Errorf("the bundle of valid limits is refused: %v", err)
			}
		})
	}
}
