package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/internal/templates"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

func templateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build templates, check a templates file, and list, add or remove a manager's templates",
		Long: `Templates are what sandboxes are made from: an OCI image pinned by digest, limits, env,
working directory, user, warm-up commands and a warm pool (docs/templates.md). A manager
serves those of the templates file it was started with (fusebox local up --templates FILE)
beside the built-in "default", and a local manager those added while it runs (template add;
template remove stops serving one).`,
	}
	cmd.AddCommand(templateValidateCmd(), templateListCmd(), templateShowCmd(), templateAddCmd(), templateRemoveCmd(), templateBuildCmd())
	return cmd
}

func templateValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a templates file and print each template's content hash",
		Long: `Checks a templates file as the manager does (the same schema and validation), without
pulling any image, and prints each template with the hash of its content: a change to the
hash replaces the template's warm sandboxes when a manager starts with the file. An error
names the entry and the field.`,
		Example: `  fusebox template validate templates.yaml`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			specs, err := templates.Parse(b)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "TEMPLATE\tHASH\tPOOL\tIMAGE")
			for _, s := range specs {
				est, lo, hi := s.Pool.Sizes()
				fmt.Fprintf(w, "%s\t%s\t%s %d-%d\t%s\n", s.Name, s.Hash()[:12], est, lo, hi, s.Image)
			}
			return w.Flush()
		},
	}
}

// templatePools asks the manager for its templates' pools.
func templatePools(cmd *cobra.Command, mgr *managerFlags) ([]*managerv1.TemplatePool, error) {
	c, closeConn, err := mgr.dial()
	if err != nil {
		return nil, err
	}
	defer closeConn()
	ps, err := c.PoolStatus(cmd.Context(), &managerv1.PoolStatusRequest{})
	if err != nil {
		return nil, mgr.explain(fmt.Errorf("asking %s: %w", mgr.addr, err))
	}
	if len(ps.Pools) == 0 {
		return nil, fmt.Errorf("%s shows no templates: the caller is not an operator (root, the manager's user, --operator-uids or the policy's operators)", mgr.addr)
	}
	return ps.Pools, nil
}

func templateListCmd() *cobra.Command {
	var mgr managerFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the templates the manager serves, with their pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pools, err := templatePools(cmd, &mgr)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "TEMPLATE\tHASH\tESTIMATOR\tTARGET\tREADY\tBOUND\tIMAGE")
			for _, p := range pools {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", p.Template, orDash(shortHash(p.Hash)), p.Estimator, p.Target,
					p.Units["ready"], p.Units["bound"], orDash(p.Image))
			}
			return w.Flush()
		},
	}
	mgr.register(cmd.Flags())
	return cmd
}

func templateShowCmd() *cobra.Command {
	var mgr managerFlags
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show one template the manager serves: its image, hash, pool and last failure",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pools, err := templatePools(cmd, &mgr)
			if err != nil {
				return err
			}
			i := slices.IndexFunc(pools, func(p *managerv1.TemplatePool) bool { return p.Template == args[0] })
			if i < 0 {
				var names []string
				for _, p := range pools {
					names = append(names, p.Template)
				}
				return fmt.Errorf("no template %q (the manager serves %s)", args[0], strings.Join(names, ", "))
			}
			printTemplate(cmd.OutOrStdout(), pools[i])
			return nil
		},
	}
	mgr.register(cmd.Flags())
	return cmd
}

// printTemplate prints one template's pool, a field a line.
func printTemplate(out io.Writer, p *managerv1.TemplatePool) {
	var states []string
	for _, s := range unitStates {
		states = append(states, fmt.Sprintf("%s %d", s, p.Units[s]))
	}
	failure := "-"
	if p.LastError != "" {
		failure = p.LastError
		if p.LastErrorAt != nil {
			failure = p.LastErrorAt.AsTime().UTC().Format("2006-01-02T15:04:05Z") + ": " + failure
		}
	}
	fmt.Fprintf(out, "template:      %s\nimage:         %s\nhash:          %s\npool:          %s, target %d\nunits:         %s\ndemand:        %.2f/s\nprovisioning:  %v\nlast failure:  %s\n",
		p.Template, orDash(p.Image), orDash(p.Hash), p.Estimator, p.Target, strings.Join(states, ", "), p.DemandPerSecond,
		p.ProvisioningLatency.AsDuration(), failure)
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
