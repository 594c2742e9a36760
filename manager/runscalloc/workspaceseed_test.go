package runscalloc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// TestWithWorkspaceSeed: an image's non-empty /workspace is bound at workspaceSeedDir with
// the server told to copy it; a missing or empty one changes nothing; one that is a link, a
// file, holds a fifo or does not fit the workspace limit is refused, naming the image.
func TestWithWorkspaceSeed(t *testing.T) {
	digest := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("a", 64)}
	base := Template{Bundle: runsc.BundleSpec{WorkspaceSizeBytes: 1 << 20, MemoryLimitBytes: 1 << 30}, ServerArgs: []string{"-x"}}
	for _, tc := range []struct {
		name  string
		make  func(t *testing.T, ws string)
		limit int64 // WorkspaceSizeBytes, if not base's
		seed  bool  // bound and copied
		err   string
	}{
		{name: "no /workspace", make: func(t *testing.T, ws string) {}},
		{name: "empty", make: func(t *testing.T, ws string) { mkdir(t, ws) }},
		{name: "files", seed: true, make: func(t *testing.T, ws string) {
			mkdir(t, filepath.Join(ws, "sub"))
			writeFile(t, filepath.Join(ws, "sub", "hello.txt"), 1<<20) // exactly the limit
			os.Symlink("/etc/passwd", filepath.Join(ws, "link"))       // not followed, not counted
		}},
		{name: "only a directory", seed: true, make: func(t *testing.T, ws string) { mkdir(t, filepath.Join(ws, "src")) }},
		{name: "over the limit", err: "sandbox image " + digest.String() + ": its /workspace holds 2 MiB, over the workspace limit of 1 MiB (limits.workspace",
			make: func(t *testing.T, ws string) {
				mkdir(t, filepath.Join(ws, "a"))
				writeFile(t, filepath.Join(ws, "a", "big"), 2<<20)
			}},
		{name: "just over", err: "holds 1.0 MiB (1048577 bytes), over the workspace limit of 1 MiB",
			make: func(t *testing.T, ws string) { mkdir(t, ws); writeFile(t, filepath.Join(ws, "f"), 1<<20+1) }},
		{name: "over half the memory without a workspace limit", limit: -1, err: "its /workspace holds 600 MiB, over the workspace limit of 512 MiB",
			make: func(t *testing.T, ws string) { mkdir(t, ws); writeFile(t, filepath.Join(ws, "f"), 600<<20) }},
		{name: "a link", err: "sandbox image " + digest.String() + `: its /workspace: ` + "DIR/workspace" + ` is a symbolic link (to "/srv"), not a directory`,
			make: func(t *testing.T, ws string) { os.Symlink("/srv", ws) }},
		{name: "a file", err: "workspace is not a directory", make: func(t *testing.T, ws string) { writeFile(t, ws, 1) }},
		{name: "a fifo", err: "its /workspace holds what cannot be copied into the workspace: d/pipe is a fifo: not a directory, regular file or symbolic link",
			make: func(t *testing.T, ws string) {
				mkdir(t, filepath.Join(ws, "d"))
				if err := syscall.Mkfifo(filepath.Join(ws, "d", "pipe"), 0o644); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.make(t, filepath.Join(dir, "workspace"))
			tm := base
			if tc.limit < 0 {
				tm.Bundle.WorkspaceSizeBytes = 0 // runsc's default: half the memory
			}
			got, err := withWorkspaceSeed(tm, &rootfs.Root{Dir: dir, Digest: digest})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), strings.ReplaceAll(tc.err, "DIR", dir)) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantMounts, wantArgs := []runsc.Mount(nil), []string{"-x"}
			if tc.seed {
				wantMounts = []runsc.Mount{{Source: filepath.Join(dir, "workspace"), Destination: workspaceSeedDir, ReadOnly: true}}
				wantArgs = []string{"-x", "-workspace-seed=" + workspaceSeedDir}
			}
			if !slices.Equal(got.Bundle.Mounts, wantMounts) || !slices.Equal(got.ServerArgs, wantArgs) || got.Bundle.SeedWorkspace != tc.seed {
				t.Errorf("mounts %+v, args %q, seeding %v; want %+v, %q, %v", got.Bundle.Mounts, got.ServerArgs, got.Bundle.SeedWorkspace, wantMounts, wantArgs, tc.seed)
			}
			if len(base.ServerArgs) != 1 || base.Bundle.Mounts != nil {
				t.Errorf("withWorkspaceSeed changed its argument: %+v", base)
			}
		})
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 bytes", 1000: "1000 bytes", 1 << 10: "1 KiB", 1536: "1.5 KiB", 700 << 20: "700 MiB",
		512<<20 + 1: "512.0 MiB", 3 << 29: "1.5 GiB", 2 << 30: "2 GiB",
	} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

// writeFile writes a sparse file of size bytes (the measure reads sizes, not blocks).
func writeFile(t *testing.T, p string, size int64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}
