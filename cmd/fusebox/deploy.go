package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/infra/deploy"
)

// defaultTools is where `make tools` lays out the Pulumi CLI and provider.
const defaultTools = "/var/cache/fusebox/pulumi-v3.274.1-k8s-4.25.0"

// findRepo walks up from the working directory to the directory holding infra/Pulumi.yaml.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "infra", "Pulumi.yaml")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no infra/Pulumi.yaml here or above: run from the fusebox repository or pass --repo")
		}
		dir = parent
	}
}

func deployCmds() []*cobra.Command {
	var cmds []*cobra.Command
	for _, op := range []struct {
		op    deploy.Op
		short string
	}{
		{deploy.Preview, "Show what `up` would change in a stack's cluster"},
		{deploy.Up, "Install or update fusebox in a stack's cluster (gVisor, Karpenter, Cilium policies, admission policies, manager)"},
		{deploy.Destroy, "Remove everything `up` installed in a stack's cluster"},
	} {
		cmds = append(cmds, deployCmd(op.op, op.short))
	}
	return cmds
}

// deployFlags are the flags of preview, up and destroy.
type deployFlags struct {
	op         deploy.Op
	o          deploy.Options
	kubeconfig string
}

// deployCmd is the command that runs op on a stack.
func deployCmd(op deploy.Op, short string) *cobra.Command {
	f := &deployFlags{op: op}
	cmd := &cobra.Command{
		Use:   string(op) + " --stack STACK",
		Short: short,
		Long: short + `.

Runs the Pulumi program in infra/ (infra.Program) through the Automation API with the stack's
configuration from stacks/Pulumi.<stack>.yaml; it needs the Pulumi CLI and the Kubernetes
provider (make tools), not the Go language host. State goes to $PULUMI_BACKEND_URL or
~/.fusebox/pulumi-state; the cluster is the one in $KUBECONFIG (or --kubeconfig).

Preview needs no cluster: with an unreachable or missing kubeconfig the Kubernetes provider
skips its cluster checks and shows what would be created, and preflight is skipped with a
warning. up --render-dir DIR writes the objects as YAML manifests under DIR instead (the
provider's renderYamlToDirectory mode).

Before it changes anything, the program checks the cluster (infra/preflight; the same check
refuses a direct pulumi up) and refuses, naming the setting: gVisor missing (GKE Sandbox's
RuntimeClass on gke), no FQDN support for the network policy flavour (GKE FQDNNetworkPolicy;
Cilium's DNS proxy, off in AWS-CNI chaining mode and on AKS without Advanced Container
Networking Services), a Cilium older than 1.16, Cilium's socketLB.hostNamespaceOnly not set,
an image pull secret that does not exist, no node labelled fusebox.dev/pool=sandbox on local,
too few nodes for the manager's rollout, a DNS setup other than fusebox:clusterDNS. A preview
of a reachable cluster refuses the same. See docs/deploy.md and docs/network-policy.md.`,
		Example: "  fusebox " + string(op) + " --stack eks-dev",
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.register(cmd)
	return cmd
}

func (f *deployFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.o.Stack, "stack", "s", "", "stack name (stacks/Pulumi.<stack>.yaml)")
	fl.StringVar(&f.o.RepoDir, "repo", "", "repository root (default: found from the working directory)")
	fl.StringVar(&f.o.Tools, "tools", envOr("FUSEBOX_PULUMI_TOOLS", defaultTools), "directory laid out by make tools (bin/pulumi, home/)")
	fl.StringVar(&f.o.Backend, "backend", "", "Pulumi state backend URL (a file://DIR that does not exist is created)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the target cluster (default $KUBECONFIG)")
	if f.op == deploy.Up {
		fl.StringVar(&f.o.RenderDir, "render-dir", "", "write the objects as YAML manifests under this directory instead of applying them (no cluster needed; throwaway state)")
	}
}

// run runs the operation with the Pulumi CLI's progress on stdout, then prints a summary.
func (f *deployFlags) run(cmd *cobra.Command) error {
	o := &f.o
	if o.Stack == "" {
		return errors.New("--stack is required (one of the stacks/Pulumi.<stack>.yaml files)")
	}
	if o.RepoDir == "" {
		dir, err := findRepo()
		if err != nil {
			return err
		}
		o.RepoDir = dir
	}
	if f.kubeconfig != "" {
		o.Env = map[string]string{"KUBECONFIG": f.kubeconfig}
	}
	o.Progress = os.Stdout
	fmt.Fprintf(os.Stderr, "fusebox: %s of stack %s\n", f.op, o.Stack)
	res, err := deploy.Run(cmd.Context(), f.op, *o)
	if err != nil {
		return err
	}
	printDeploySummary(res, o.RenderDir)
	return nil
}

// printDeploySummary prints what changed, where rendered manifests went, and the outputs.
func printDeploySummary(res deploy.Result, renderDir string) {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(res.Changes)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, res.Changes[k]))
	}
	if len(parts) == 0 {
		parts = []string{"no changes"} // e.g. destroy of a stack that holds nothing
	}
	fmt.Printf("\nsummary: %s\n", strings.Join(parts, ", "))
	if renderDir != "" {
		fmt.Printf("manifests written under %s (1-manifest/, 0-crd/); nothing was applied to a cluster\n", renderDir)
	}
	if len(res.Outputs) > 0 {
		fmt.Println("outputs:")
		for _, k := range slices.Sorted(maps.Keys(res.Outputs)) {
			fmt.Printf("  %s: %v\n", k, res.Outputs[k])
		}
	}
}
