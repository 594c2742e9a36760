package infra

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fusebox-dev/fusebox/infra/preflight"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// ClusterFunc returns the cluster preflight reads for the program running in ctx, or an
// error when there is none to read (ErrNoCluster, or why the kubeconfig is unusable).
type ClusterFunc func(ctx *pulumi.Context) (preflight.Cluster, error)

// ErrNoCluster is returned by a ClusterFunc when the program runs without a cluster (with
// Pulumi's mocks).
var ErrNoCluster = errors.New("no cluster to check")

// ErrChecked is returned by a ClusterFunc whose caller has run the same preflight, on the
// same stack file and cluster, before it started the engine (fusebox up: infra/deploy): the
// program then skips it, with a log line, rather than asking the cluster (and AWS) again.
var ErrChecked = errors.New("preflight already run by the caller")

// NewProgram returns the Pulumi program: it loads the configuration, runs preflight against
// the cluster returned by cluster, then installs (Install). Preflight runs before any
// resource is registered, so a refusal changes nothing, whichever way the program runs:
//
//   - `pulumi up` (and `fusebox up`): the engine runs the program twice, a preview then the
//     update. A refusal fails both; in the update, a cluster preflight cannot read fails too
//     (the provider could not change it either).
//   - `pulumi preview` (and the preview that starts an up): a refusal fails it; a cluster
//     that cannot be read (no kubeconfig, unreachable: preview needs no cluster) is
//     logged as a warning, naming that `pulumi up` checks it, and the preview goes on.
//   - rendering manifests (kubernetes:renderYamlToDirectory, `fusebox up --render-dir`):
//     there is no cluster, and preflight is skipped with a log line saying so.
//   - Pulumi's mocks (pulumi.RunWithMocks, the program's unit tests): Program has no
//     cluster and skips preflight with a log line; NewProgram with a ClusterFunc returning a
//     preflight.Cluster of fakes runs it.
//   - `fusebox up` checks the cluster itself before it starts the engine, and its
//     ClusterFunc returns ErrChecked: the program skips preflight with a log line.
func NewProgram(cluster ClusterFunc) pulumi.RunFunc {
	return func(ctx *pulumi.Context) error {
		c, err := LoadConfig(ctx)
		if err != nil {
			return err
		}
		if err := runPreflight(ctx, c, cluster); err != nil {
			return err
		}
		return Install(ctx, c)
	}
}

// runPreflight checks the cluster before anything changes (see NewProgram).
func runPreflight(ctx *pulumi.Context, c *Config, cluster ClusterFunc) error {
	if dir := config.New(ctx, "kubernetes").Get("renderYamlToDirectory"); dir != "" {
		return ctx.Log.Info(fmt.Sprintf("preflight skipped: rendering manifests into %s, no cluster to check", dir), nil)
	}
	cl, err := cluster(ctx)
	if errors.Is(err, ErrChecked) {
		return ctx.Log.Info("preflight: checked before the engine started (fusebox up)", nil)
	}
	if err == nil {
		err = preflight.Check(ctx.Context(), c.Preflight(ctx.Stack()), cl)
	}
	if err == nil && cl.ServerVersion != nil {
		var notes strings.Builder
		err = preflight.CheckAMI(ctx.Context(), c.AMIPreflight(ctx.Stack()), cl.ServerVersion, nil, &notes)
		if n := strings.TrimSpace(notes.String()); n != "" {
			ctx.Log.Info(n, nil)
		}
	}
	switch {
	case err == nil:
		return ctx.Log.Info("preflight: the cluster can take stack "+ctx.Stack(), nil)
	case errors.Is(err, preflight.ErrRefused):
		return fmt.Errorf("stack %s: %w", ctx.Stack(), err)
	case errors.Is(err, ErrNoCluster) && ctx.RunningWithMocks():
		return ctx.Log.Info("preflight skipped: running with mocks, no cluster to check", nil)
	case ctx.DryRun():
		return ctx.Log.Warn(fmt.Sprintf("preflight skipped in preview: %v; `pulumi up` checks the cluster and refuses what it cannot take before changing anything", err), nil)
	}
	return fmt.Errorf("preflight of stack %s (it checks the cluster before changing anything): %w", ctx.Stack(), err)
}

// KubeconfigCluster reads the cluster the Kubernetes provider deploys to: the stack's
// kubernetes:kubeconfig (a path, or the kubeconfig itself) and kubernetes:context when set,
// else $KUBECONFIG or ~/.kube/config in its current context. With mocks it returns
// ErrNoCluster.
func KubeconfigCluster(ctx *pulumi.Context) (preflight.Cluster, error) {
	if ctx.RunningWithMocks() {
		return preflight.Cluster{}, ErrNoCluster
	}
	k := config.New(ctx, "kubernetes")
	kubeconfig, kubeContext := k.Get("kubeconfig"), k.Get("context")
	var cs kubernetes.Interface
	var err error
	if kubeconfig != "" && !isPathList(kubeconfig) {
		cs, err = kubeClientFromBytes([]byte(kubeconfig), kubeContext)
	} else {
		cs, err = KubeClient(kubeconfig, kubeContext)
	}
	if err != nil {
		return preflight.Cluster{}, err
	}
	return preflight.FromClients(cs), nil
}

// KubeClient is a client of the cluster of kubeconfig (a path list as in $KUBECONFIG; empty:
// $KUBECONFIG, else ~/.kube/config) in context (empty: the current one).
func KubeClient(kubeconfig, context string) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.Precedence = filepath.SplitList(kubeconfig)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig of the target cluster: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

// kubeClientFromBytes is KubeClient for a kubeconfig's contents (kubernetes:kubeconfig may
// hold them).
func kubeClientFromBytes(kubeconfig []byte, context string) (kubernetes.Interface, error) {
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("parsing kubernetes:kubeconfig: %w", err)
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, context, &clientcmd.ConfigOverrides{CurrentContext: context}, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubernetes:kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

// isPathList reports whether s names existing files (a kubeconfig path list) rather than
// holding a kubeconfig.
func isPathList(s string) bool {
	for _, p := range filepath.SplitList(s) {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}
