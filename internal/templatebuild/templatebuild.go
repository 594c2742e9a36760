// Package templatebuild builds a template's OCI image from a Dockerfile without Docker: the
// base image is unpacked (package rootfs), each RUN step runs in a fresh gVisor sandbox whose
// writable root is the build's own copy of the root, and what each step changed becomes a
// reproducible layer (package rootdiff). The result is an OCI image layout holding the image
// (tagged with org.opencontainers.image.ref.name) and a build record.
//
// Steps follow the Dockerfile subset of package dockerfile:
//   - FROM names an OCI layout (DIR or DIR@sha256:...) or a registry reference; a reference
//     or layout not pinned by digest is resolved once and the digest is reported. The base
//     image's Env, WorkingDir and User are where the steps start.
//   - RUN runs /bin/sh -c CMD (shell form) or the argv (exec form) as the step's user, in
//     its working directory (created if missing, as Docker does), with its environment, in
//     a sandbox with no network at all, or only the build's egress allowlist (see Egress).
//     Root in the sandbox has Docker's default capabilities but CAP_MKNOD and CAP_NET_RAW,
//     in gVisor's kernel, never the host's; set-id programs do not raise privileges
//     (no_new_privs). A non-zero exit fails the build with
//     the line, the exit code and the end of the step's output (*StepError).
//   - COPY and ADD copy from the build context, read through an os.Root: a source that
//     leaves the context, by .. or by a link, is refused naming the line. Sources may be
//     patterns; a source directory's content is copied (links in it are copied as links).
//     ADD of a tar or compressed file is refused (it would be extracted by Docker): copy it
//     with COPY and unpack it with RUN. A context holding a .dockerignore is refused, since
//     ignoring it would put files in the image that Docker leaves out.
//   - ENV, LABEL, USER and ARG change the configuration only; WORKDIR also creates the
//     directory (owned by the step's user) when it is missing, which makes a layer.
//
// Each filesystem step makes one layer (none if it changed nothing); its times are clamped
// to the build's epoch, so that the same inputs give the same image digest.
//
// The step cache lives under the cache directory: each step's key chains its parent's key
// (the first's is the base image's config digest and the epoch), the step's canonical key
// (dockerfile.Step.Key) and, for COPY and ADD, the digest of the sources' names, types,
// modes and content, for RUN the build's egress allowlist if it has one (a step that could
// fetch something is not the same step without that network). A cached step's layer is
// reused without running it. The root a later step needs after cached steps is rebuilt by
// unpacking the base and the cached layers (rootfs.Unpack) rather than kept per step, which
// would cost a whole root per step.
//
// The shared base root is copied once per build, with `cp -a` (GNU coreutils,
// --reflink=auto where the filesystem can share blocks): it keeps owners, modes, hard links,
// links, times and extended attributes, and has been relied on for this far longer than a
// copy written here would have been. Later steps change that copy in place: the diff needs
// only the snapshot of the state before (rootdiff.Tree), not a second copy, and copying a
// root for each step would cost more than the steps (about 9 s for the 255 MB Debian test
// root here). A failed step leaves the copy half-changed; the build then ends and removes
// it. The unpacked base roots (rootfs.Prepare) lack their set-user-ID and set-group-ID bits
// and device nodes: a step that rewrites such a file records it without them.
//
// # Egress
//
// A build's steps are as untrusted as the code agents run, and have no network, unless the
// build is given an egress allowlist (Options.Egress, "host:port" entries as an allocation's):
// then the build serves one allowlisting proxy (package egress) on a unix socket on the host,
// and each RUN step's sandbox, still with --network=none, gets the socket's directory and
// fusebox-sandbox bound read-only under /dev/fusebox (the mount points gVisor makes for them
// in the step's root are removed after the step, see mountPoints). The step runs under
// `fusebox-sandbox relay-exec`, which relays a loopback port to the socket and gives the
// command HTTP_PROXY and HTTPS_PROXY (as a sandbox's relay does): the step reaches the
// allowlisted destinations through the proxy, and nothing else. The proxy refuses a name that
// resolves to an internal address; an IP-literal entry reaches that address on purpose. The
// allowlist is in each RUN step's cache key, in the build record and in the image's
// annotations.
package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/dockerfile"
	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/rootdiff"
	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// Options configure a Builder.
type Options struct {
	// Dockerfile is the Dockerfile's path, read unless DockerfileData is set.
	Dockerfile string
	// DockerfileData is the Dockerfile itself; nil means read Dockerfile.
	DockerfileData []byte
	// Context is the build context directory COPY and ADD read from. Required.
	Context string
	// BuildArgs are the --build-arg values.
	BuildArgs map[string]string
	// Tag names the image in the layout's index.json (org.opencontainers.image.ref.name).
	// Required.
	Tag string
	// Out is the OCI image layout directory to write; an existing layout there is replaced
	// once the build succeeded. Required.
	Out string
	// CacheDir holds the unpacked base images, the step cache and the build's working roots.
	// Required.
	CacheDir string
	// Runsc is the runsc binary RUN steps run with. Required.
	Runsc string
	// Epoch is the image's creation time and the latest time its layers record; zero means
	// SOURCE_DATE_EPOCH if set, else image.DefaultEpoch.
	Epoch time.Time
	// Progress receives the steps and their output; nil discards them.
	Progress io.Writer
	// Keychain resolves registry credentials for FROM; nil means the Docker config's.
	Keychain authn.Keychain
	// StepMemory bounds the memory of each RUN step's sandbox (gVisor's kernel, the step's
	// processes and what they keep in memory): a step that needs more is killed and fails
	// the build. Zero means DefaultStepMemory.
	StepMemory int64
	// StepTasks bounds the tasks (processes and threads) a RUN step's processes may have at
	// once: a fork beyond it fails inside the sandbox. Zero means DefaultStepTasks.
	StepTasks int64
	// Egress is the build's egress allowlist ("host:port" entries: names, *.wildcards, IP
	// literals, as an allocation's): the RUN steps reach these destinations through an
	// allowlisting proxy and nothing else. Empty: the steps have no network at all.
	Egress []string
	// SandboxBinary is a static fusebox-sandbox, bound read-only into the RUN steps to relay
	// their traffic to the proxy. Required with Egress, unused without.
	SandboxBinary string
}

// Bounds of a RUN step's sandbox when Options leave them out: a step is as untrusted as the
// code agents run, and a package build may take a few GiB.
const (
	DefaultStepMemory int64 = 4 << 30
	DefaultStepTasks  int64 = 4096
)

// minStepMemory is the least memory a step's sandbox can start in.
const minStepMemory = 64 << 20

// Builder builds images from Dockerfiles.
type Builder struct {
	o Options
}

// New checks o and returns a Builder. Every required option is refused empty rather than
// defaulted: the runsc binary is what confines the steps, and the cache and output
// directories are written to.
func New(o Options) (*Builder, error) {
	switch {
	case o.Dockerfile == "" && o.DockerfileData == nil:
		return nil, errors.New("templatebuild: no Dockerfile given")
	case o.Context == "":
		return nil, errors.New("templatebuild: Options.Context (the build context directory) is required")
	case o.Tag == "" || strings.ContainsFunc(o.Tag, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return nil, fmt.Errorf("templatebuild: Options.Tag %q must be a non-empty name without spaces", o.Tag)
	case o.Out == "":
		return nil, errors.New("templatebuild: Options.Out (the OCI layout directory to write) is required")
	case o.CacheDir == "":
		return nil, errors.New("templatebuild: Options.CacheDir is required")
	case o.Runsc == "":
		return nil, errors.New("templatebuild: Options.Runsc (the runsc binary) is required")
	}
	if info, err := os.Stat(o.Context); err != nil || !info.IsDir() {
		return nil, fmt.Errorf("templatebuild: build context %s is not a directory", o.Context)
	}
	if info, err := os.Stat(o.Runsc); err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("templatebuild: runsc %s is missing or not executable: build the pinned one with `make runsc`", o.Runsc)
	}
	if len(o.Egress) > 0 {
		var err error
		if o.Egress, err = parseEgress(o.Egress); err != nil {
			return nil, fmt.Errorf("templatebuild: egress allowlist: %w", err)
		}
		if o.SandboxBinary == "" {
			return nil, errors.New("templatebuild: Options.SandboxBinary (fusebox-sandbox, which relays the steps' egress) is required with an egress allowlist")
		}
		if info, err := os.Stat(o.SandboxBinary); err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			return nil, fmt.Errorf("templatebuild: fusebox-sandbox %s is missing or not executable: the RUN steps' egress needs it (build it with `make build`)", o.SandboxBinary)
		}
	}
	if _, err := exec.LookPath("cp"); err != nil {
		return nil, fmt.Errorf("templatebuild: cp (GNU coreutils) copies the roots between steps: %w", err)
	}
	if o.Epoch.IsZero() {
		e, err := image.Epoch()
		if err != nil {
			return nil, fmt.Errorf("templatebuild: %w", err)
		}
		o.Epoch = e
	}
	o.Epoch = o.Epoch.Truncate(time.Second).UTC()
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	o.Progress = &lockedWriter{w: o.Progress}
	switch {
	case o.StepMemory == 0:
		o.StepMemory = DefaultStepMemory
	case o.StepMemory < minStepMemory:
		return nil, fmt.Errorf("templatebuild: Options.StepMemory %d is below %d bytes, in which no step's sandbox starts", o.StepMemory, int64(minStepMemory))
	}
	switch {
	case o.StepTasks == 0:
		o.StepTasks = DefaultStepTasks
	case o.StepTasks < 16:
		return nil, fmt.Errorf("templatebuild: Options.StepTasks %d is below 16 (a shell and a build need a few tasks each)", o.StepTasks)
	}
	var err error
	if o.SandboxBinary != "" {
		if o.SandboxBinary, err = filepath.Abs(o.SandboxBinary); err != nil {
			return nil, fmt.Errorf("templatebuild: %w", err)
		}
	}
	for _, p := range []*string{&o.Context, &o.Out, &o.CacheDir} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("templatebuild: %w", err)
		}
	}
	return &Builder{o: o}, nil
}

// Result is what a build made.
type Result struct {
	// Digest is the image's manifest digest.
	Digest v1.Hash
	// Dir is the OCI layout written (Options.Out, absolute).
	Dir string
	// Reference is Dir@Digest, as a templates file's image names it.
	Reference string
	// Base is the base image as pinned (a reference or layout by digest).
	Base string
	// BaseDigest is the base image's manifest digest.
	BaseDigest v1.Hash
	// Steps is the number of steps after FROM (ARG excluded).
	Steps int
	// Ran is the number of RUN steps run; Cached the number of filesystem steps taken from
	// the cache.
	Ran, Cached int
	// Layers is the number of layers the steps added.
	Layers int
	// Egress is the egress allowlist the RUN steps had, canonical and sorted; nil for none.
	Egress []string
	// SBOM is the SBOM file written beside the image, listing Packages packages.
	SBOM     string
	Packages int
}

// StepError is a RUN step that exited with a non-zero status.
type StepError struct {
	// Line is the Dockerfile line of the step.
	Line int
	// Instruction is the step as the build shows it.
	Instruction string
	// ExitCode is the command's exit status (128+n if killed by signal n).
	ExitCode int
	// Output is the end of what the command wrote.
	Output string
}

// Error names the line, the step and the exit code, then the end of the output.
func (e *StepError) Error() string {
	msg := fmt.Sprintf("Dockerfile:%d: %s: exit code %d", e.Line, e.Instruction, e.ExitCode)
	if e.Output != "" {
		msg += "; the end of its output:\n" + e.Output
	}
	return msg
}

// buildCaps are the capabilities of a RUN step's root: Docker's default set without
// CAP_MKNOD (a layer may hold no device) and CAP_NET_RAW (there is no network).
var buildCaps = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}

// build is one run of Build.
type build struct {
	o     Options
	stage *dockerfile.Stage
	base  *base
	// baseEnv is the base image's environment, with a PATH.
	baseEnv []string
	cache   *stepCache
	egress  *buildEgress   // nil without an egress allowlist
	work    string         // this build's working directory under the cache, removed at the end
	rt      *runsc.Runtime // under its own root, so that ids never collide with another build's
	cur     *rootState     // the root after the last step
	cfg     v1.Config      // the configuration so far
	steps   []builtStep    // every step so far, layer or not
	res     Result
}

// Build runs the build and writes the image layout. On failure nothing is left of it: the
// working roots are removed and Out is left as it was.
func (b *Builder) Build(ctx context.Context) (_ *Result, err error) {
	o := b.o
	data := o.DockerfileData
	if data == nil {
		if data, err = os.ReadFile(o.Dockerfile); err != nil {
			return nil, fmt.Errorf("reading the Dockerfile: %w", err)
		}
	}
	// Parse errors (an unsupported instruction) come before anything is pulled or run.
	file, err := dockerfile.ParseBytes(data)
	if err != nil {
		return nil, err
	}
	pre, err := file.Expand(dockerfile.ExpandOptions{BuildArgs: o.BuildArgs})
	if err != nil {
		return nil, err
	}
	if err := checkOut(o.Out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the cache directory: %w", err)
	}
	bd := &build{o: o}
	bd.base, err = resolveBase(ctx, pre.From, pre.FromLine, o)
	if err != nil {
		return nil, err
	}
	// As BuildKit does, a base image without PATH gets the default one, in the steps'
	// environment and in the image's.
	bd.baseEnv = slices.Clone(bd.base.cf.Config.Env)
	if !hasEnv(bd.baseEnv, "PATH") {
		bd.baseEnv = append([]string{runsc.DefaultPath}, bd.baseEnv...)
	}
	bd.stage, err = file.Expand(dockerfile.ExpandOptions{
		BuildArgs: o.BuildArgs, BaseEnv: bd.baseEnv, BaseWorkdir: bd.base.cf.Config.WorkingDir,
	})
	if err != nil {
		return nil, err
	}
	if len(bd.stage.UnusedBuildArgs) > 0 {
		fmt.Fprintf(o.Progress, "warning: build arguments no ARG declares: %s\n", strings.Join(bd.stage.UnusedBuildArgs, ", "))
	}
	if bd.work, err = os.MkdirTemp(o.CacheDir, "build-"); err != nil {
		return nil, fmt.Errorf("creating the build's working directory: %w", err)
	}
	defer func() {
		if rmErr := removeAll(bd.work); rmErr != nil && err == nil {
			err = rmErr
		}
	}()
	// runsc's root holds sockets, whose paths are limited in length: a short one in /tmp.
	runscRoot, err := os.MkdirTemp("", "fusebox-build-runsc-")
	if err != nil {
		return nil, fmt.Errorf("creating runsc's state directory: %w", err)
	}
	bd.rt = &runsc.Runtime{Binary: o.Runsc, Root: runscRoot, HostUDS: "none"}
	if len(o.Egress) > 0 {
		if bd.egress, err = startEgress(o.Egress, o.SandboxBinary, o.Progress); err != nil {
			return nil, err
		}
		defer func() {
			if cerr := bd.egress.close(); cerr != nil && err == nil {
				err = cerr
			}
		}()
		// The steps may connect to host sockets in their mounts (and create none): the
		// proxy's is the only one they have.
		bd.rt.HostUDS = "open"
	}
	defer func() {
		if relErr := bd.rt.ReleaseRoot(); relErr == nil {
			os.RemoveAll(runscRoot)
		}
	}()
	bd.cache = &stepCache{dir: filepath.Join(o.CacheDir, "steps")}
	bd.cur = &rootState{dir: bd.base.root.Dir}
	bd.cfg = cloneConfig(bd.base.cf.Config)
	bd.cfg.Env = slices.Clone(bd.baseEnv)
	bd.res = Result{Base: bd.base.pinned, BaseDigest: bd.base.digest, Steps: len(bd.stage.Steps), Egress: o.Egress}
	if err := bd.run(ctx); err != nil {
		return nil, err
	}
	return bd.finish(ctx, file.Digest())
}

// run runs the steps.
func (bd *build) run(ctx context.Context) error {
	key := firstKey(bd.base.configDigest, bd.o.Epoch)
	n := len(bd.stage.Steps)
	for i, s := range bd.stage.Steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		text := instruction(s)
		header := fmt.Sprintf("[%d/%d] %s", i+1, n, text)
		var err error
		switch s.Kind {
		case dockerfile.KindEnv:
			for _, kv := range s.Pairs {
				bd.cfg.Env = setEnv(bd.cfg.Env, kv.Key, kv.Value)
			}
		case dockerfile.KindLabel:
			if bd.cfg.Labels == nil {
				bd.cfg.Labels = map[string]string{}
			}
			for _, kv := range s.Pairs {
				bd.cfg.Labels[kv.Key] = kv.Value
			}
		case dockerfile.KindUser:
			bd.cfg.User = s.User
		case dockerfile.KindWorkdir:
			bd.cfg.WorkingDir = s.Workdir
		}
		switch s.Kind {
		case dockerfile.KindRun, dockerfile.KindCopy, dockerfile.KindAdd, dockerfile.KindWorkdir:
			key, err = bd.fsStep(ctx, i, s, key, header, text)
			if err != nil {
				return err
			}
		default:
			fmt.Fprintln(bd.o.Progress, header)
			key = chainKey(key, s.Key(), "")
			bd.steps = append(bd.steps, builtStep{line: s.Line, text: text, empty: true})
		}
	}
	return nil
}

// fsStep runs (or takes from the cache) a step that may change the filesystem, and returns
// its key.
func (bd *build) fsStep(ctx context.Context, i int, s dockerfile.Step, parent, header, text string) (string, error) {
	var sources *copySources
	extra := ""
	if s.Kind == dockerfile.KindCopy || s.Kind == dockerfile.KindAdd {
		var err error
		if sources, err = collectSources(bd.o.Context, s); err != nil {
			return "", err
		}
		extra = sources.digest
	}
	if s.Kind == dockerfile.KindRun && bd.egress != nil {
		extra = "egress " + strings.Join(bd.egress.allow, " ")
	}
	key := chainKey(parent, s.Key(), extra)
	if rec, ok, err := bd.cache.get(key); err != nil {
		return "", err
	} else if ok {
		fmt.Fprintln(bd.o.Progress, header+" (cached)")
		bd.res.Cached++
		st := builtStep{line: s.Line, text: text, empty: rec.Empty, cached: true}
		if !rec.Empty {
			if st.layer, err = rootdiff.Layer(bd.cache.layerPath(key)); err != nil {
				return "", err
			}
			bd.cur.pending = append(bd.cur.pending, st.layer)
		}
		bd.steps = append(bd.steps, st)
		return key, nil
	}
	fmt.Fprintln(bd.o.Progress, header)
	prev, err := bd.materialize(ctx)
	if err != nil {
		return "", err
	}
	before := prev.tree
	if s.Kind == dockerfile.KindWorkdir {
		if exists, err := isDirIn(prev.dir, s.Workdir); err != nil {
			return "", fmt.Errorf("Dockerfile:%d: WORKDIR %s: %w", s.Line, s.Workdir, err)
		} else if exists {
			if err := bd.cache.put(key, "", true); err != nil {
				return "", err
			}
			bd.steps = append(bd.steps, builtStep{line: s.Line, text: text, empty: true})
			return key, nil
		}
	}
	// The step changes a root of the build's own in place: its snapshot (prev.tree) is
	// what the diff needs of the state before. Only the shared base root is copied first.
	next := prev.dir
	if !prev.owned {
		if next, err = bd.copyRoot(prev.dir, i); err != nil {
			return "", err
		}
		bd.replaceRoot(&rootState{dir: next, owned: true, tree: prev.tree})
	}
	// On failure the root is left half-changed: the build ends, and removes it.
	switch s.Kind {
	case dockerfile.KindRun:
		bd.res.Ran++
		err = bd.runStep(ctx, i, s, text, next)
	case dockerfile.KindCopy, dockerfile.KindAdd:
		err = applyCopy(next, s, sources)
	case dockerfile.KindWorkdir:
		err = makeWorkdir(next, s, s.User, bd.base.cf.Config.User)
	}
	if err != nil {
		return "", err
	}
	tree, empty, err := bd.diff(before, next, key)
	if err != nil {
		return "", fmt.Errorf("Dockerfile:%d: %s: %w", s.Line, text, err)
	}
	bd.cur.tree = tree
	st := builtStep{line: s.Line, text: text, empty: empty}
	if !empty {
		if st.layer, err = rootdiff.Layer(bd.cache.layerPath(key)); err != nil {
			return "", err
		}
	}
	bd.steps = append(bd.steps, st)
	return key, nil
}

// checkOut refuses an output directory that exists and is neither empty nor an OCI layout,
// so that a mistyped --out never replaces something else.
func checkOut(out string) error {
	entries, err := os.ReadDir(out)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("output directory %s: %w", out, err)
	case len(entries) == 0:
		return nil
	}
	if _, err := os.Stat(filepath.Join(out, "oci-layout")); err != nil {
		return fmt.Errorf("output directory %s exists and is not an OCI image layout: not replacing it", out)
	}
	return nil
}

// cloneConfig returns a copy of c whose Env and Labels the build may change.
func cloneConfig(c v1.Config) v1.Config {
	c.Env = slices.Clone(c.Env)
	if c.Labels != nil {
		l := make(map[string]string, len(c.Labels))
		for k, v := range c.Labels {
			l[k] = v
		}
		c.Labels = l
	}
	return c
}

// setEnv sets k=v in env, in place of an earlier value of k.
func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// removeAll removes dir; a root a step left read-only is still removed (as root).
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
