package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/internal/templates"
	managerv1 "github.com/fusebox-dev/fusebox/proto/fusebox/manager/v1"
)

func templateAddCmd() *cobra.Command {
	var mgr managerFlags
	cmd := &cobra.Command{
		Use:   "add FILE",
		Short: "Serve the templates of a templates file on a running local manager",
		Long: `Adds the templates of a templates file (the schema of fusebox local up --templates; - reads
standard input) to a running local manager, each with its warm pool. A template whose name the
manager serves already is replaced when its content (image, limits, env, working directory,
user, warm-up) changed: its warm sandboxes are destroyed and its pool refills, while sandboxes
agents hold serve on, as they were made, until their lease ends. The same content with other
pool sizes only resizes the pool. Every image is read and unpacked before anything changes: a
bad template changes nothing. The manager keeps the change across restarts on its state
directory (a start with --templates FILE replaces it). Needs an operator (root, the
manager's user or --operator-uids).`,
		Example: `  sudo fusebox template add node.yaml
  sudo fusebox template add - < templates.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readFileArg(cmd, args[0])
			if err != nil {
				return err
			}
			specs, err := templates.Parse(b)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if len(specs) == 0 {
				return fmt.Errorf("%s lists no template", args[0])
			}
			c, closeConn, err := mgr.dial()
			if err != nil {
				return err
			}
			defer closeConn()
			fmt.Fprintf(cmd.ErrOrStderr(), "adding %d template(s) to %s: reading and unpacking their images\n", len(specs), mgr.addr)
			resp, err := c.AddTemplates(cmd.Context(), &managerv1.AddTemplatesRequest{Templates: b})
			if err != nil {
				return mgr.explain(fmt.Errorf("adding templates to %s: %w", mgr.addr, err))
			}
			return printChanges(cmd.OutOrStdout(), resp.Changes...)
		},
	}
	mgr.register(cmd.Flags())
	return cmd
}

func templateRemoveCmd() *cobra.Command {
	var mgr managerFlags
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Stop serving a template on a running local manager",
		Long: `Stops serving a template: its allocations are refused as of an unknown template, its warm
sandboxes are destroyed, and sandboxes agents hold serve on until their lease ends. The
manager keeps the change across restarts on its state directory. "default" is always
served. Needs an operator.`,
		Example: `  sudo fusebox template remove node`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, closeConn, err := mgr.dial()
			if err != nil {
				return err
			}
			defer closeConn()
			resp, err := c.RemoveTemplate(cmd.Context(), &managerv1.RemoveTemplateRequest{Template: args[0]})
			if err != nil {
				return mgr.explain(fmt.Errorf("removing template %s from %s: %w", args[0], mgr.addr, err))
			}
			return printChanges(cmd.OutOrStdout(), resp.Change)
		},
	}
	mgr.register(cmd.Flags())
	return cmd
}

// readFileArg reads the file path names, or standard input for "-".
func readFileArg(cmd *cobra.Command, path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(cmd.InOrStdin())
	}
	return os.ReadFile(path)
}

// printChanges prints what a call did to each template, a line each.
func printChanges(out io.Writer, changes ...*managerv1.TemplateChange) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TEMPLATE\tCHANGE\tHASH\tWARM DESTROYED\tBOUND (SERVE ON)\tIMAGE")
	for _, c := range changes {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", c.Template, c.Change, orDash(shortHash(c.Hash)), c.Drained, c.Bound, orDash(c.Image))
	}
	return w.Flush()
}
