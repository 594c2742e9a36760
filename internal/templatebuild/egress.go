package templatebuild

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/manager/egress"
)

// Where a RUN step with an egress allowlist finds its relay, inside its sandbox. Both are
// under /dev, which inside the sandbox is gVisor's own file system in memory: the mounts hide
// nothing of the image (as /run/fusebox or /opt/fusebox could) and the step cannot write
// beside them on the host. gVisor's file server still makes their mount points in the root
// directory on the host (it binds the sources there in its own mount namespace), which is the
// step's writable root: runStep removes them after the step (see mountPoints).
const (
	// stepEgressDir is where the host directory holding the proxy's socket is bound,
	// read-only: the step can connect to the socket and write nothing there.
	stepEgressDir = "/dev/fusebox/egress"
	// stepSandboxBinary is where fusebox-sandbox is bound, read-only (that one file).
	stepSandboxBinary = "/dev/fusebox/fusebox-sandbox"
	// stepRelayListen is the relay's address, where HTTP_PROXY and HTTPS_PROXY point; the
	// sandboxes' relay listens on the same one.
	stepRelayListen = "127.0.0.1:3128"
	// egressSocket is the proxy's socket in its directory.
	egressSocket = "egress.sock"
)

// buildEgress is the egress of a build's RUN steps: one proxy on the host with the build's
// allowlist, served on a unix socket in a directory of its own, for every step.
type buildEgress struct {
	allow  []string // canonical entries, sorted
	dir    string   // host directory of the socket, removed by close
	binary string   // fusebox-sandbox on the host
	proxy  *egress.Proxy
	served chan error
}

// parseEgress checks the allowlist entries and returns them canonical ("host:port" as
// package egress writes them), sorted and without duplicates, so that the order they were
// given in changes neither the steps' keys nor the record. Each error names its entry.
func parseEgress(entries []string) ([]string, error) {
	a, err := egress.ParseAllowlist(entries)
	if err != nil {
		return nil, err
	}
	out := a.Entries()
	slices.Sort(out)
	return out, nil
}

// startEgress serves a proxy with the allowlist allow on a new socket, its decisions logged
// to progress.
func startEgress(allow []string, binary string, progress io.Writer) (_ *buildEgress, err error) {
	a, err := egress.ParseAllowlist(allow)
	if err != nil {
		return nil, err
	}
	// A short path in /tmp: a unix socket's path is limited in length.
	dir, err := os.MkdirTemp("", "fusebox-build-egress-")
	if err != nil {
		return nil, fmt.Errorf("creating the egress proxy's directory: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	// Searchable by the step's user, whoever it is; only root on the host writes into it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the egress proxy's directory: %w", err)
	}
	path := filepath.Join(dir, egressSocket)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("serving the egress proxy: %w", err)
	}
	// A step may run as any user of its image: connecting needs write permission.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("serving the egress proxy: %w", err)
	}
	log := slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	p := egress.NewProxy(egress.ProxyOptions{Logger: log})
	p.SetAllowlist(a)
	e := &buildEgress{allow: allow, dir: dir, binary: binary, proxy: p, served: make(chan error, 1)}
	go func() { e.served <- p.Serve(ln) }()
	return e, nil
}

// close stops the proxy (ending the tunnels still open) and removes its directory.
func (e *buildEgress) close() error {
	err := e.proxy.Close()
	if serr := <-e.served; serr != nil && !errors.Is(serr, net.ErrClosed) {
		err = errors.Join(err, serr)
	}
	if rmErr := os.RemoveAll(e.dir); rmErr != nil {
		err = errors.Join(err, rmErr)
	}
	if err != nil {
		return fmt.Errorf("stopping the egress proxy: %w", err)
	}
	return nil
}

// wrap returns the step's argv run under fusebox-sandbox's relay-exec mode, which relays
// stepRelayListen to the proxy and runs argv with the proxy variables, and the mounts it
// needs.
func (e *buildEgress) wrap(argv []string) ([]string, []runsc.Mount) {
	out := []string{stepSandboxBinary, "relay-exec",
		"-socket", stepEgressDir + "/" + egressSocket, "-listen", stepRelayListen}
	for _, a := range e.allow {
		out = append(out, "-allow", a)
	}
	out = append(append(out, "--"), argv...)
	return out, []runsc.Mount{
		{Source: e.dir, Destination: stepEgressDir, ReadOnly: true},
		{Source: e.binary, Destination: stepSandboxBinary, ReadOnly: true},
	}
}

// mountPoints are the paths, relative to a step's root, that gVisor's file server may create
// on the host for the relay's mounts, parents first.
var mountPoints = []string{"dev", "dev/fusebox", stepEgressDir[1:], stepSandboxBinary[1:]}

// pathState is what a mount point was before a step: whether it existed, and its times.
type pathState struct {
	rel          string
	exists       bool
	atime, mtime time.Time
}

// mountPointsBefore records the state of the mount points in root before a step.
func mountPointsBefore(root string) ([]pathState, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out []pathState
	for _, rel := range mountPoints {
		info, err := r.Lstat(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			out = append(out, pathState{rel: rel})
			continue
		case err != nil:
			return nil, fmt.Errorf("before the step: %w", err)
		}
		st := info.Sys().(*syscall.Stat_t)
		out = append(out, pathState{rel: rel, exists: true,
			atime: time.Unix(st.Atim.Unix()), mtime: time.Unix(st.Mtim.Unix())})
	}
	return out, nil
}

// restoreMountPoints puts root's mount points back as before (mountPointsBefore's record),
// once the step's sandbox is gone: it removes those the file server created, deepest first,
// and gives the ones that existed their times back, so that the step's layer holds none of
// it. The step itself cannot have written there: its /dev is gVisor's own.
func restoreMountPoints(root string, before []pathState) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, p := range slices.Backward(before) {
		if p.exists {
			continue
		}
		if err := r.Remove(p.rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the mount point /%s after the step: %w", p.rel, err)
		}
	}
	for _, p := range slices.Backward(before) {
		if !p.exists {
			continue
		}
		if err := r.Chtimes(p.rel, p.atime, p.mtime); err != nil {
			return fmt.Errorf("restoring the times of /%s after the step: %w", p.rel, err)
		}
	}
	return nil
}

// lockedWriter serialises writes to w: the steps' output and the egress proxy's decisions
// reach the progress writer from several goroutines.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
