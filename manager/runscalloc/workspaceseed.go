package runscalloc

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/sandbox-server/seed"
)

// workspaceSeedDir is where a sandbox sees its image's /workspace, which the workspace tmpfs
// hides: bound read-only beside the bound server, outside the workspace, for the server to
// copy into the workspace at start (fusebox-sandbox -workspace-seed, package
// sandbox-server/seed).
const workspaceSeedDir = "/opt/fusebox/workspace-seed"

// withWorkspaceSeed returns t with the files of root's /workspace copied into each sandbox's
// workspace at start: the directory bound at workspaceSeedDir and the server's
// -workspace-seed flag. An image with no /workspace, or an empty one, leaves t unchanged. It
// refuses an image whose /workspace is not a directory, holds a device, fifo or socket, or
// holds more than the workspace limit, naming the image.
func withWorkspaceSeed(t Template, root *rootfs.Root) (Template, error) {
	dir := filepath.Join(root.Dir, "workspace")
	size, empty, err := measureWorkspace(dir)
	if err != nil {
		return Template{}, fmt.Errorf("sandbox image %s: %w", root.Digest, err)
	}
	if limit := workspaceLimit(t.Bundle); limit > 0 && size > limit {
		return Template{}, fmt.Errorf("sandbox image %s: its /workspace holds %s, over the workspace limit of %s (limits.workspace, or fusebox local up's --sandbox-workspace)",
			root.Digest, overSize(size, limit), humanBytes(limit))
	}
	if empty {
		return t, nil
	}
	t.Bundle.Mounts = append(slices.Clone(t.Bundle.Mounts), runsc.Mount{Source: dir, Destination: workspaceSeedDir, ReadOnly: true})
	t.ServerArgs = append(slices.Clone(t.ServerArgs), "-workspace-seed="+workspaceSeedDir)
	t.Bundle.SeedWorkspace = true
	return t, nil
}

// measureWorkspace returns the total size of the regular files under dir (an image's
// /workspace on the host: seed.Measure) and whether dir is empty or missing.
func measureWorkspace(dir string) (size int64, empty bool, err error) {
	size, empty, err = seed.Measure(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, true, nil
	case errors.Is(err, seed.ErrUnsupported):
		return 0, false, fmt.Errorf("its /workspace holds what cannot be copied into the workspace: %w", err)
	case err != nil:
		return 0, false, fmt.Errorf("its /workspace: %w", err)
	}
	return size, empty, nil
}

// workspaceLimit is the size of the workspace tmpfs b mounts, as runsc.BundleSpec defaults it
// (half the memory limit when WorkspaceSizeBytes is 0), or 0 if it is unknown (gVisor's own
// default, or a host directory as the workspace).
func workspaceLimit(b runsc.BundleSpec) int64 {
	switch {
	case b.WorkspaceHostDir != "":
		return 0
	case b.WorkspaceSizeBytes > 0:
		return b.WorkspaceSizeBytes
	}
	return b.MemoryLimitBytes / 2
}

// humanBytes prints n in the largest binary unit it reaches: whole (512 MiB) when it divides
// n, else with one decimal (1.5 GiB).
func humanBytes(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		switch {
		case n >= u.size && n%u.size == 0:
			return strconv.FormatInt(n/u.size, 10) + " " + u.name
		case n >= u.size:
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// overSize prints size, over limit, with its bytes if it would otherwise read as the limit
// (512.0 MiB against a 512 MiB limit).
func overSize(size, limit int64) string {
	s := humanBytes(size)
	if strings.Replace(s, ".0 ", " ", 1) == humanBytes(limit) {
		return fmt.Sprintf("%s (%d bytes)", s, size)
	}
	return s
}
