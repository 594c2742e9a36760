// Package runscalloc is the local Allocator: each unit is a fusebox-sandbox server in its own
// gVisor container (runsc, --network=none --host-uds=all), with its workspace in the
// sandbox's own memory, a read-only root filesystem, memory/CPU/pids limits, and init, data
// and egress unix sockets in a per-sandbox host directory bind-mounted at /run/fusebox.
//
// Egress: for an allocation with an egress allowlist, BindEgress serves an allowlisting HTTP
// proxy (package egress) on the sandbox's egress.sock; the sandbox server, told the allowlist
// by InitializeTLS, then relays 127.0.0.1:3128 to it and gives commands HTTP_PROXY and
// HTTPS_PROXY. A pool sandbox, or one allocated without an allowlist, has neither: no socket
// on the host, no relay inside, no proxy variables, no network at all.
//
// Root filesystem: with Options.Image, the sandbox image unpacked once (package rootfs) and
// shared read-only by every sandbox, whose server is the image's own entrypoint; without it,
// a root assembled from the host's /usr and a sanitised /etc, with the fusebox-sandbox
// binary (that file only) bound at /opt/fusebox.
//
// Layout under StateDir: runsc/ (runsc's --root), etc/ (the sanitised /etc shared read-only by
// all sandboxes with a host-derived root), rootfs/<digest>/ (unpacked images; those of images
// no longer used stay until removed by hand), sandboxes/<id>/ (bundle, sock/, server.log,
// unit.json, annotations.json).
package runscalloc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fusebox-dev/fusebox/internal/fastpath"
	"github.com/fusebox-dev/fusebox/internal/jsonfile"
	"github.com/fusebox-dev/fusebox/internal/localsandbox"
	"github.com/fusebox-dev/fusebox/internal/runsc"
	"github.com/fusebox-dev/fusebox/manager"
	"github.com/fusebox-dev/fusebox/manager/egress"
)

// Template is how sandboxes of one template are made.
type Template struct {
	// Bundle carries the limits and, optionally, an unpacked image as RootFS.
	Bundle runsc.BundleSpec
	// ServerArgs are extra fusebox-sandbox flags (limits).
	ServerArgs []string
	// Entrypoint, with an image as RootFS, is the server's path and leading arguments
	// inside it (localsandbox.Options.Entrypoint); empty: SandboxBinary, bound in.
	Entrypoint []string
	// Image, if set, is the template's own image, pinned by digest (a registry reference
	// or an OCI layout DIR@sha256:HEX: templates.Spec.Image), unpacked into StateDir/rootfs
	// once per digest and shared read-only. Unlike Options.Image it needs nothing of
	// fusebox: the server is SandboxBinary, bound in read-only, and the image's entrypoint
	// is not used; the commands get the image's environment (under Bundle.Env), working
	// directory (unless Bundle.Cwd) and user (unless User).
	Image string
	// User, with Image, runs the commands instead of the image's user: "UID[:GID]" or
	// "NAME[:GROUP]", looked up in the image.
	User string
	// ReadyTimeout bounds the wait for a new sandbox's init socket (zero:
	// localsandbox.DefaultReadyTimeout); a template with warm-up commands needs theirs too.
	ReadyTimeout time.Duration
}

// DefaultTemplate is DefaultLimits' template: a weight of 1 CPU with no quota, 1 GiB (a
// 512 MiB workspace and a 128 MiB /tmp in it), 512 tasks for the commands, the host's /usr
// as a read-only root.
func DefaultTemplate() Template {
	t, err := DefaultLimits.Template()
	if err != nil {
		panic(err) // DefaultLimits are valid: TestDefaultTemplate
	}
	return t
}

// DefaultProcessLimit is how many tasks (processes and threads) the commands of a sandbox may
// have at once: a fork beyond it fails with EAGAIN inside the sandbox (runsc.BundleSpec.ProcessLimit).
const DefaultProcessLimit = 512

// HostPidsBackstop is the host pids limit for a sandbox whose commands may have processLimit
// tasks: gVisor's own host threads (sentry, gofer, systrap stubs) count there, and reaching it
// kills the whole sandbox, so it sits well above what processLimit tasks cost.
func HostPidsBackstop(processLimit int64) int64 { return 4*processLimit + 1024 }

// Options configure the allocator. Runsc, StateDir and SandboxBinary or Image are required.
type Options struct {
	// Runsc is the pinned runsc binary; the Runtime's root is StateDir/runsc.
	Runsc    string
	StateDir string
	// SandboxBinary is a static fusebox-sandbox build, for templates with a host-derived
	// root.
	SandboxBinary string
	// Image, if set, is the sandbox image (an OCI image layout directory, or a registry
	// reference HOST[:PORT]/PATH@sha256:... or :TAG: see rootfs.ParseSource) that becomes
	// the root filesystem of every template without a RootFS of its own: unpacked once into
	// StateDir/rootfs, its entrypoint runs the server (the allocator's flags appended), as
	// its user, with its environment and working directory.
	Image     string
	Templates map[string]Template
	// IdleTTL is how long a pool sandbox waits for its InitializeTLS before it exits (it must
	// outlast a unit's stay in the warm pool).
	IdleTTL time.Duration
	Logger  *slog.Logger
	// Egress configures the per-sandbox proxies (tests inject dialers).
	Egress egress.ProxyOptions
	// KeepAwake keeps each sandbox server's Go runtime monitor awake: faster allocations,
	// for a little idle CPU per sandbox (see localsandbox.KeepAwakeGODEBUG; fusebox
	// local up turns it on unless told not to).
	KeepAwake bool
	// FastPath, if set, switches the latency accelerators (internal/fastpath): KeepAwake is
	// KeepAwake's condition too. Nil: all of them, keep-awake as KeepAwake says.
	FastPath *fastpath.Switches
	// GrantEndpoints lets local users other than the manager's reach the sandboxes they
	// allocate (a manager whose socket a group shares, --listen-group): see GrantEndpoint.
	GrantEndpoints bool
}

// fastPath is the accelerators in effect.
func (o Options) fastPath() fastpath.Switches {
	s := fastpath.All()
	if o.FastPath != nil {
		s = *o.FastPath
	}
	s.KeepAwake = s.KeepAwake && o.KeepAwake
	return s
}

// Allocator runs units as local gVisor sandboxes.
type Allocator struct {
	o  Options
	rt *runsc.Runtime

	mu      sync.Mutex // guards proxies, exits
	proxies map[string]*egress.Proxy
	exits   exits

	tmplMu    sync.RWMutex // guards templates
	templates map[string]Template
}

var (
	_ manager.Allocator    = (*Allocator)(nil)
	_ manager.Annotator    = (*Allocator)(nil)
	_ manager.EgressBinder = (*Allocator)(nil)
	_ manager.ExitWatcher  = (*Allocator)(nil)
)

// New is NewContext with a context that never ends.
func New(o Options) (*Allocator, error) { return NewContext(context.Background(), o) }

// NewContext checks o, prepares StateDir (unpacking o.Image, which ctx bounds) and returns
// the allocator.
func NewContext(ctx context.Context, o Options) (*Allocator, error) {
	if o.Runsc == "" || o.StateDir == "" || (o.SandboxBinary == "" && o.Image == "") {
		return nil, errors.New("runscalloc: Runsc, StateDir and SandboxBinary or Image are required")
	}
	for _, p := range []string{o.Runsc, o.SandboxBinary} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o111 == 0 {
			return nil, fmt.Errorf("runscalloc: %s is not an executable file", p)
		}
	}
	dir, err := filepath.Abs(o.StateDir)
	if err != nil {
		return nil, err
	}
	o.StateDir = dir
	if len(o.Templates) == 0 {
		o.Templates = map[string]Template{manager.DefaultTemplate: DefaultTemplate()}
	}
	if o.IdleTTL <= 0 {
		o.IdleTTL = 24 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Egress.Logger == nil {
		o.Egress.Logger = o.Logger
	}
	if o.Image != "" {
		root, err := prepareImage(ctx, o.Image, filepath.Join(dir, "rootfs"), o.Logger)
		if err != nil {
			return nil, err
		}
		templates := map[string]Template{}
		for name, t := range o.Templates {
			if t.Bundle.RootFS == "" {
				if t, err = withImage(t, root); err != nil {
					return nil, err
				}
			}
			templates[name] = t
		}
		o.Templates = templates
	}
	o.Templates = maps.Clone(o.Templates) // the images' roots are filled in below
	for name, t := range o.Templates {
		if t.Image == "" {
			continue
		}
		if o.Templates[name], err = prepareTemplate(ctx, o, name, t); err != nil {
			return nil, err
		}
	}
	for name, t := range o.Templates {
		if t.Bundle.RootFS == "" && o.SandboxBinary == "" {
			return nil, fmt.Errorf("runscalloc: template %q has a host-derived root, which needs SandboxBinary", name)
		}
	}
	for _, d := range []string{"runsc", "sandboxes"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
	}
	if o.GrantEndpoints {
		if err := grantDirs(dir); err != nil {
			return nil, err
		}
	}
	etc := filepath.Join(dir, "etc")
	hostRoot := slices.ContainsFunc(slices.Collect(maps.Values(o.Templates)), func(t Template) bool { return t.Bundle.RootFS == "" })
	if _, err := os.Stat(etc); hostRoot && errors.Is(err, fs.ErrNotExist) {
		tmp := etc + ".tmp"
		os.RemoveAll(tmp)
		if err := runsc.WriteSanitizedEtc(tmp); err != nil {
			return nil, fmt.Errorf("writing sanitised /etc: %w", err)
		}
		if err := os.Rename(tmp, etc); err != nil {
			return nil, err
		}
	}
	rt := &runsc.Runtime{Binary: o.Runsc, Root: filepath.Join(dir, "runsc")}
	// A manager killed while it created a sandbox can leave that sandbox running unrecorded,
	// where neither adoption nor a destroy finds it.
	if err := killOrphans(ctx, rt, o.Logger); err != nil {
		return nil, err
	}
	// From here on the templates are the allocator's own (SetTemplate, RemoveTemplate).
	templates := o.Templates
	o.Templates = nil
	return &Allocator{o: o, rt: rt, proxies: map[string]*egress.Proxy{}, templates: templates}, nil
}

// prepareTemplate returns t, a template with an image of its own (Template.Image), with that
// image unpacked into o.StateDir/rootfs (or found there) as its root, and the server bound in.
func prepareTemplate(ctx context.Context, o Options, name string, t Template) (Template, error) {
	if o.SandboxBinary == "" {
		return Template{}, fmt.Errorf("runscalloc: template %q has an image of its own, which needs SandboxBinary", name)
	}
	root, err := prepareImage(ctx, t.Image, filepath.Join(o.StateDir, "rootfs"), o.Logger)
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	if t, err = withTemplateImage(t, root); err != nil {
		return Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	return t, nil
}

// PrepareTemplate readies t, a template with an image of its own (FromSpec's), for
// SetTemplate: its image is pulled or read, checked and unpacked into the layer store, which
// ctx bounds. Nothing changes for the templates being served.
func (a *Allocator) PrepareTemplate(ctx context.Context, name string, t Template) (Template, error) {
	if t.Image == "" {
		return Template{}, fmt.Errorf("runscalloc: template %q has no image of its own", name)
	}
	return prepareTemplate(ctx, a.o, name, t)
}

// SetTemplate makes Create make template name as t (PrepareTemplate's) from now on: a new
// template, or a new content for one. Units made before keep what they were made of.
func (a *Allocator) SetTemplate(name string, t Template) {
	a.tmplMu.Lock()
	defer a.tmplMu.Unlock()
	a.templates[name] = t
}

// RemoveTemplate makes Create refuse template name from now on (ErrUnknownTemplate); units
// made of it serve on, and are destroyed as any other. Its unpacked layers stay in the store
// for a template that shares them.
func (a *Allocator) RemoveTemplate(name string) {
	a.tmplMu.Lock()
	defer a.tmplMu.Unlock()
	delete(a.templates, name)
}

// template returns template name as Create makes it.
func (a *Allocator) template(name string) (Template, bool) {
	a.tmplMu.RLock()
	defer a.tmplMu.RUnlock()
	t, ok := a.templates[name]
	return t, ok
}

// orphanWait bounds the wait for a previous manager's runsc creations to end on their own
// before its orphans are looked for (runsc.Runtime.KillOrphans).
const orphanWait = time.Minute

// killOrphans kills the sandbox processes under rt's root that runsc does not record.
func killOrphans(ctx context.Context, rt *runsc.Runtime, log *slog.Logger) error {
	killed, err := rt.KillOrphans(ctx, orphanWait)
	if err != nil {
		return fmt.Errorf("looking for sandboxes runsc does not record: %w", err)
	}
	for _, p := range killed {
		log.Warn("killed a sandbox process runsc does not record (a creation cut off)", "pid", p.Pid, "command", p.Command, "bundle", p.Bundle)
	}
	return nil
}

// Runtime returns the runsc runtime (every call uses the same global flags).
func (a *Allocator) Runtime() *runsc.Runtime { return a.rt }

// Shutdown releases what runsc keeps under the state directory between containers (its
// gofers' empty network namespace, a bind mount: see runsc.Runtime.ReleaseRoot) when no
// container is left, so that a stopped manager's state directory can be removed. With
// containers left (bound sandboxes, which the next manager on this state directory adopts)
// it changes nothing. It stops watching for sandboxes that end (WatchExits) either way.
// Call it after the manager's Close.
func (a *Allocator) Shutdown(ctx context.Context) error {
	a.unwatchAll()
	if err := killOrphans(ctx, a.rt, a.o.Logger); err != nil {
		return err
	}
	states, err := a.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("listing containers: %w", err)
	}
	if len(states) > 0 {
		return nil
	}
	return a.rt.ReleaseRoot()
}

// Templates returns the template names.
func (a *Allocator) Templates() []string {
	a.tmplMu.RLock()
	defer a.tmplMu.RUnlock()
	return slices.Sorted(maps.Keys(a.templates))
}

func (a *Allocator) Name() string { return "runsc" }

// GVisorWarmUp is how long a gVisor sandbox takes, after it starts, to serve at full speed:
// gVisor calibrates a sandbox's clock from two samples taken a second apart, and until then
// its vDSO cannot serve clock reads, each of which is then a system call (figures in
// docs/performance.md).
const GVisorWarmUp = time.Second

// Capabilities: egress through the per-sandbox proxy, leases beside the bundles, creations on
// this host, and gVisor's warm-up.
func (a *Allocator) Capabilities() manager.Capabilities {
	return manager.Capabilities{Egress: true, Adoption: true, Exits: true,
		CreatesOnHost: true, WarmUp: GVisorWarmUp}
}

func (a *Allocator) dir(id string) string { return filepath.Join(a.o.StateDir, "sandboxes", id) }

// socket is the host path of unit id's socket name (init.sock, data.sock, egress.sock), in the
// directory the sandbox sees at localsandbox.SocketDir.
func (a *Allocator) socket(id, name string) string { return filepath.Join(a.dir(id), "sock", name) }

// ServerLog returns the path of unit id's sandbox server log (its standard error, JSON lines),
// which exists until the unit is destroyed.
func (a *Allocator) ServerLog(id string) string {
	return filepath.Join(a.dir(id), localsandbox.LogName)
}

type unitFile struct {
	ID       string    `json:"id"`
	Template string    `json:"template"`
	Created  time.Time `json:"created"`
}

func (a *Allocator) info(id string, u unitFile) manager.UnitInfo {
	return manager.UnitInfo{ID: id, Template: u.Template, Created: u.Created,
		InitAddr: "unix://" + a.socket(id, "init.sock"), DataAddr: "unix://" + a.socket(id, "data.sock")}
}

// Create starts a sandbox (with no egress: see BindEgress).
func (a *Allocator) Create(ctx context.Context, id, template string) (_ manager.UnitInfo, err error) {
	if !runsc.ValidID(id) {
		return manager.UnitInfo{}, fmt.Errorf("runscalloc: %w: %q", runsc.ErrInvalidID, id)
	}
	t, ok := a.template(template)
	if !ok {
		return manager.UnitInfo{}, fmt.Errorf("%w: %q", manager.ErrUnknownTemplate, template)
	}
	dir := a.dir(id)
	defer func() {
		if err != nil {
			if derr := a.Destroy(context.WithoutCancel(ctx), id); derr != nil {
				a.o.Logger.Error("cleaning up a failed create", "id", id, "err", derr)
				err = fmt.Errorf("%w (%w: %v)", err, manager.ErrRemains, derr)
			}
		}
	}()
	u := unitFile{ID: id, Template: template, Created: time.Now().UTC()}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return manager.UnitInfo{}, fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := jsonfile.Write(filepath.Join(dir, "unit.json"), u); err != nil {
		return manager.UnitInfo{}, err
	}
	// The lease's first write (Annotate) comes during an allocation, beside sFuse: made now,
	// its file costs it no inode (jsonfile.Prepare).
	if err := jsonfile.Prepare(filepath.Join(dir, "annotations.json")); err != nil {
		return manager.UnitInfo{}, err
	}
	spec := t.Bundle
	if spec.RootFS == "" && spec.EtcDir == "" {
		spec.EtcDir = filepath.Join(a.o.StateDir, "etc")
	}
	fast := a.o.fastPath()
	args := append(slices.Clone(t.ServerArgs), "-idle-ttl="+a.o.IdleTTL.String(), "-egress-socket="+localsandbox.SocketDir+"/egress.sock")
	sb, err := localsandbox.Start(ctx, localsandbox.Options{Runtime: a.rt, ID: id, Dir: dir,
		SandboxBinary: a.o.SandboxBinary, Entrypoint: t.Entrypoint, ServerArgs: args, Bundle: spec, KeepAwake: fast.KeepAwake,
		ReadyTimeout: t.ReadyTimeout})
	if err != nil {
		return manager.UnitInfo{}, err
	}
	a.watch(id, sb.Pid)
	return a.info(id, u), nil
}

// proxy returns unit id's egress proxy, serving it on the unit's egress.sock if it is not
// served yet (after a manager restart, for instance).
func (a *Allocator) proxy(id string) (*egress.Proxy, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p, ok := a.proxies[id]; ok {
		return p, nil
	}
	path := a.socket(id, "egress.sock")
	if isSocket(path) {
		os.Remove(path) // left by a previous manager
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("serving egress proxy for %s: %w", id, err)
	}
	// The sandbox server's relay connects as the command user (see localsandbox.Start): the
	// socket must be writable by others. Host users other than root cannot reach it (the
	// unit's directory is private); inside, it is the same proxy the relay leads to.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("serving egress proxy for %s: %w", id, err)
	}
	p := egress.NewProxy(a.o.Egress)
	go p.Serve(ln)
	a.proxies[id] = p
	return p, nil
}

// BindEgress sets unit id's allowlist: a non-empty one is served by the unit's egress proxy
// (started now, or again after a manager restart); an empty one means no proxy and no socket.
func (a *Allocator) BindEgress(ctx context.Context, id string, allow []string) error {
	al, err := egress.ParseAllowlist(allow)
	if err != nil {
		return err
	}
	if _, err := os.Stat(a.dir(id)); err != nil {
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	}
	if len(al.Entries()) == 0 {
		a.stopProxy(id)
		return nil
	}
	p, err := a.proxy(id)
	if err != nil {
		return err
	}
	p.SetAllowlist(al)
	return nil
}

// stopProxy closes unit id's egress proxy, if it runs, and removes its socket.
func (a *Allocator) stopProxy(id string) {
	a.mu.Lock()
	p := a.proxies[id]
	delete(a.proxies, id)
	a.mu.Unlock()
	if p != nil {
		p.Close() // closes the listener, which unlinks its socket
		return
	}
	if path := a.socket(id, "egress.sock"); isSocket(path) {
		os.Remove(path) // left by a previous manager
	}
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().Type() == fs.ModeSocket
}

// Annotate stores annotations beside the unit's bundle.
func (a *Allocator) Annotate(ctx context.Context, id string, ann map[string]string) error {
	if _, err := os.Stat(a.dir(id)); err != nil {
		return fmt.Errorf("%w: %s", manager.ErrUnitNotFound, id)
	}
	return jsonfile.Write(filepath.Join(a.dir(id), "annotations.json"), ann)
}

// Destroy stops the proxy, kills and deletes the container and removes its directory.
func (a *Allocator) Destroy(ctx context.Context, id string) error {
	if !runsc.ValidID(id) {
		return fmt.Errorf("runscalloc: %w: %q", runsc.ErrInvalidID, id)
	}
	a.stopProxy(id)
	a.unwatch(id)
	var errs []error
	if err := a.rt.Remove(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("deleting container %s: %w", id, err))
	}
	if err := os.RemoveAll(a.dir(id)); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", a.dir(id), err))
	}
	if err := os.Remove(a.grantPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing %s: %w", a.grantPath(id), err))
	}
	return errors.Join(errs...)
}

// List returns every unit with a directory or a container under this allocator's root.
func (a *Allocator) List(ctx context.Context) ([]manager.UnitInfo, error) {
	ids := map[string]bool{}
	states, err := a.rt.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing runsc containers: %w", err)
	}
	for _, s := range states {
		ids[s.ID] = true
		if runsc.ValidID(s.ID) {
			a.watchListed(s.ID, s)
		}
	}
	entries, err := os.ReadDir(filepath.Join(a.o.StateDir, "sandboxes"))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if runsc.ValidID(e.Name()) {
			ids[e.Name()] = true
		}
	}
	var out []manager.UnitInfo
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		var u unitFile
		if err := jsonfile.Read(filepath.Join(a.dir(id), "unit.json"), &u); err != nil {
			u = unitFile{ID: id} // a container without its record: listed so it gets destroyed
		}
		info := a.info(id, u)
		var ann map[string]string
		if jsonfile.Read(filepath.Join(a.dir(id), "annotations.json"), &ann) == nil {
			info.Annotations = ann
		}
		out = append(out, info)
	}
	return out, nil
}
