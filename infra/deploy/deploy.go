// Package deploy runs infra.Program through the Pulumi Automation API as an inline program:
// it needs the Pulumi CLI and the Kubernetes provider plugin, not the Go language host. The
// project settings come from infra/Pulumi.yaml and each stack's configuration from
// stacks/Pulumi.<stack>.yaml, exactly as a standard `cd infra && pulumi up -s STACK` reads
// them, so both ways deploy the same thing.
package deploy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/blang/semver"
	"github.com/pulumi/pulumi/sdk/v3/go/auto"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optdestroy"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optpreview"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optup"
	"github.com/pulumi/pulumi/sdk/v3/go/common/workspace"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/infra/preflight"
)

// CLIVersion is the Pulumi CLI fusebox pins (make tools builds it).
const CLIVersion = "3.274.1"

// Op is what to do with a stack.
type Op string

// The operations.
const (
	Preview Op = "preview"
	Up      Op = "up"
	Destroy Op = "destroy"
)

// Options configure a run. Stack, RepoDir and Tools are required.
type Options struct {
	Stack string
	// RepoDir is the repository root (holding infra/Pulumi.yaml and stacks/).
	RepoDir string
	// Tools is a directory with bin/pulumi (the CLI) and home/ (PULUMI_HOME with the
	// Kubernetes provider plugin installed), as `make tools` prepares it.
	Tools string
	// Backend is the state backend URL; empty means $PULUMI_BACKEND_URL, else
	// file://$HOME/.fusebox/pulumi-state.
	Backend string
	// Env is added to the Pulumi CLI's environment (KUBECONFIG, PULUMI_CONFIG_PASSPHRASE...).
	Env map[string]string
	// Progress receives the CLI's progress output.
	Progress io.Writer
	// RenderDir, for Up only, makes the Kubernetes provider write every object as a YAML
	// manifest under RenderDir (1-manifest/, 0-crd/) instead of applying it: its
	// renderYamlToDirectory mode, which needs no cluster. The run's Pulumi state is throwaway
	// (a temporary backend, whatever Backend says), so the stack's real state never records
	// objects that were only rendered. Stacks that install Cilium with Helm cannot be rendered.
	RenderDir string
	// Cluster is read by preflight (preflight.Check) before anything changes: by Up before
	// it starts the CLI (the program then skips it: infra.ErrChecked), and by the program in
	// every other run (infra.NewProgram); nil reads the cluster of $KUBECONFIG (Env's, else
	// the process's).
	Cluster *preflight.Cluster

	checked bool // preflight passed before the CLI started
}

// Result is what a run changed and, for up, the stack's outputs.
type Result struct {
	Changes map[string]int
	Outputs map[string]any
}

// Run performs op on the stack: it reads the project and the stack file, checks the cluster
// before an up, points the pinned Pulumi CLI at the state backend, selects the stack in a
// temporary working directory holding a copy of the stack file, and runs op there.
func Run(ctx context.Context, op Op, o Options) (Result, error) {
	if o.Stack == "" || o.RepoDir == "" || o.Tools == "" {
		return Result{}, errors.New("deploy: Stack, RepoDir and Tools are required")
	}
	stackFile, proj, err := o.project()
	if err != nil {
		return Result{}, err
	}
	if op == Up && o.RenderDir == "" {
		// Before the CLI or the provider touch anything: refuse a cluster that cannot take
		// the stack, naming the setting.
		if err := o.preflight(ctx, stackFile); err != nil {
			return Result{}, err
		}
		o.checked = true
	}
	cmd, err := auto.NewPulumiCommand(&auto.PulumiCommandOptions{Root: o.Tools, Version: semver.MustParse(CLIVersion)})
	if err != nil {
		return Result{}, fmt.Errorf("pulumi CLI in %s (run make tools): %w", o.Tools, err)
	}
	if o.RenderDir != "" && op != Up {
		return Result{}, fmt.Errorf("deploy: rendering manifests (RenderDir) is an up without a cluster; not for %s", op)
	}
	backend, cleanup, err := o.backend()
	if err != nil {
		return Result{}, err
	}
	defer cleanup()
	work, err := os.MkdirTemp("", "fusebox-pulumi-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	stack, err := o.selectStack(ctx, stackFile, proj, work, cmd, o.cliEnv(backend))
	if err != nil {
		return Result{}, err
	}
	return o.run(ctx, op, stack)
}

// project returns the stack file and the project settings of an inline program: no main,
// and the stack file read from the (temporary) project directory, a copy of the reviewed
// file in stacks/, never written back.
func (o Options) project() (string, workspace.Project, error) {
	stackFile := filepath.Join(o.RepoDir, "stacks", "Pulumi."+o.Stack+".yaml")
	if _, err := os.Stat(stackFile); err != nil {
		return "", workspace.Project{}, fmt.Errorf("stack %q: %w (stacks live in %s)", o.Stack, err, filepath.Join(o.RepoDir, "stacks"))
	}
	proj, err := loadProject(filepath.Join(o.RepoDir, "infra", "Pulumi.yaml"))
	if err != nil {
		return "", workspace.Project{}, err
	}
	proj.Main, proj.StackConfigDir = "", ""
	return stackFile, proj, nil
}

// preflight checks the cluster (o.Cluster, else $KUBECONFIG's) against the stack file.
func (o Options) preflight(ctx context.Context, stackFile string) error {
	c, err := infra.LoadStackFile(stackFile, o.Stack)
	if err != nil {
		return err
	}
	cl, err := o.cluster(nil) // o.checked is not yet set
	if err != nil {
		return fmt.Errorf("preflight of %s: %w", o.Stack, err)
	}
	if err := preflight.Check(ctx, c.Preflight(o.Stack), cl); err != nil {
		return fmt.Errorf("up of %s: %w", o.Stack, err)
	}
	if cl.ServerVersion != nil {
		if err := preflight.CheckAMI(ctx, c.AMIPreflight(o.Stack), cl.ServerVersion, nil, o.progress()); err != nil {
			return fmt.Errorf("up of %s: %w", o.Stack, err)
		}
	}
	return nil
}

// cluster is the cluster preflight reads, here and inside the program (infra.NewProgram):
// o.Cluster, else the cluster of $KUBECONFIG (Env's, else the process's). The inline program
// runs in this process, whose environment is not the CLI's Env, so it is given the same
// cluster rather than reading its own; after Up's own check it returns infra.ErrChecked.
func (o Options) cluster(*pulumi.Context) (preflight.Cluster, error) {
	if o.checked {
		return preflight.Cluster{}, infra.ErrChecked
	}
	if o.Cluster != nil {
		return *o.Cluster, nil
	}
	cs, err := infra.KubeClient(o.Env["KUBECONFIG"], "")
	if err != nil {
		return preflight.Cluster{}, err
	}
	return preflight.FromClients(cs), nil
}

// backend is the state backend URL: a throwaway one when rendering (cleanup removes it),
// else Backend, $PULUMI_BACKEND_URL or ~/.fusebox/pulumi-state. The directory of a file
// backend is created: the CLI refuses one that does not exist.
func (o Options) backend() (backend string, cleanup func(), err error) {
	cleanup = func() {}
	backend = o.Backend
	if o.RenderDir != "" {
		state, err := os.MkdirTemp("", "fusebox-render-state-")
		if err != nil {
			return "", cleanup, err
		}
		cleanup = func() { os.RemoveAll(state) }
		backend = "file://" + state
	}
	if backend == "" {
		backend = os.Getenv("PULUMI_BACKEND_URL")
	}
	if backend == "" {
		home, _ := os.UserHomeDir()
		backend = "file://" + filepath.Join(home, ".fusebox", "pulumi-state")
	}
	if dir, ok := fileBackendDir(backend); ok {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", cleanup, fmt.Errorf("creating the state directory of backend %s: %w", backend, err)
		}
	}
	return backend, cleanup, nil
}

// cliEnv is the Pulumi CLI's environment: the tools' plugins only, no update check, an empty
// passphrase unless one is given (no secrets in fusebox's stack files), then Env.
func (o Options) cliEnv(backend string) map[string]string {
	env := map[string]string{
		"PULUMI_HOME":                                 filepath.Join(o.Tools, "home"),
		"PULUMI_BACKEND_URL":                          backend,
		"PULUMI_SKIP_UPDATE_CHECK":                    "true",
		"PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
	}
	if _, ok := os.LookupEnv("PULUMI_CONFIG_PASSPHRASE"); !ok {
		if _, ok := os.LookupEnv("PULUMI_CONFIG_PASSPHRASE_FILE"); !ok {
			env["PULUMI_CONFIG_PASSPHRASE"] = ""
		}
	}
	for k, v := range o.Env {
		env[k] = v
	}
	return env
}

// selectStack copies the stack file into work and selects (or creates) the stack there, with
// infra.Program as its inline program; when rendering, it points the stack's Kubernetes
// provider at RenderDir.
func (o Options) selectStack(ctx context.Context, stackFile string, proj workspace.Project, work string, cmd auto.PulumiCommand, env map[string]string) (auto.Stack, error) {
	cfg, err := os.ReadFile(stackFile)
	if err != nil {
		return auto.Stack{}, err
	}
	if err := os.WriteFile(filepath.Join(work, "Pulumi."+o.Stack+".yaml"), cfg, 0o600); err != nil {
		return auto.Stack{}, err
	}
	stack, err := auto.UpsertStackInlineSource(ctx, o.Stack, proj.Name.String(), infra.NewProgram(o.cluster),
		auto.Project(proj), auto.WorkDir(work), auto.Pulumi(cmd), auto.EnvVars(env))
	if err != nil {
		return auto.Stack{}, fmt.Errorf("selecting stack %s: %w", o.Stack, err)
	}
	if o.RenderDir != "" {
		dir, err := filepath.Abs(o.RenderDir)
		if err != nil {
			return auto.Stack{}, err
		}
		// The default Kubernetes provider reads kubernetes:* from the stack's configuration
		// (the temporary copy, not the reviewed file).
		if err := stack.SetConfig(ctx, "kubernetes:renderYamlToDirectory", auto.ConfigValue{Value: dir}); err != nil {
			return auto.Stack{}, fmt.Errorf("configuring the Kubernetes provider to render into %s: %w", dir, err)
		}
	}
	return stack, nil
}

// run performs op on the selected stack and reports its changes and, for up, its outputs.
func (o Options) run(ctx context.Context, op Op, stack auto.Stack) (Result, error) {
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	var res Result
	switch op {
	case Preview:
		r, err := stack.Preview(ctx, optpreview.ProgressStreams(progress))
		if err != nil {
			return Result{}, fmt.Errorf("preview of %s: %w", o.Stack, err)
		}
		res.Changes = changes(r.ChangeSummary)
	case Up:
		r, err := stack.Up(ctx, optup.ProgressStreams(progress))
		if err != nil {
			return Result{}, fmt.Errorf("up of %s: %w", o.Stack, err)
		}
		res.Changes = summary(r.Summary.ResourceChanges)
		res.Outputs = map[string]any{}
		for k, v := range r.Outputs {
			res.Outputs[k] = v.Value
		}
	case Destroy:
		r, err := stack.Destroy(ctx, optdestroy.ProgressStreams(progress))
		if err != nil {
			return Result{}, fmt.Errorf("destroy of %s: %w", o.Stack, err)
		}
		res.Changes = summary(r.Summary.ResourceChanges)
	default:
		return Result{}, fmt.Errorf("deploy: unknown operation %q", op)
	}
	return res, nil
}

// summary copies an update's resource changes (nil when it reports none).
func summary(m *map[string]int) map[string]int {
	if m == nil {
		return nil
	}
	out := map[string]int{}
	for k, v := range *m {
		out[k] = v
	}
	return out
}

// fileBackendDir returns the directory of a file:// backend URL ("file:///abs", "file://~/dir",
// "file://rel"; query options dropped), and false for any other backend.
func fileBackendDir(backend string) (string, bool) {
	rest, ok := strings.CutPrefix(backend, "file://")
	if !ok {
		return "", false
	}
	rest, _, _ = strings.Cut(rest, "?")
	if rest == "" {
		return "", false
	}
	if rest == "~" || strings.HasPrefix(rest, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", false
		}
		rest = filepath.Join(home, strings.TrimPrefix(rest, "~"))
	}
	return filepath.Clean(rest), true
}

func changes[K ~string](m map[K]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[string(k)] = v
	}
	return out
}

// loadProject reads Pulumi.yaml.
func loadProject(path string) (workspace.Project, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return workspace.Project{}, fmt.Errorf("reading project settings: %w", err)
	}
	var p workspace.Project
	if err := yaml.Unmarshal(b, &p); err != nil {
		return workspace.Project{}, fmt.Errorf("parsing %s: %w", path, err)
	}
	if p.Name == "" {
		return workspace.Project{}, fmt.Errorf("%s has no project name", path)
	}
	return p, nil
}
