package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

// promoteFlags are promote's flags.
type promoteFlags struct {
	o      infra.PromoteOptions
	repo   string
	verify bool
	reg    registryFlags
}

func promoteCmd() *cobra.Command {
	var f promoteFlags
	cmd := &cobra.Command{
		Use:   "promote --from STACK --to STACK [--dry-run]",
		Short: "Copy a stack's release (image digests, gVisor release) into another stack's file",
		Long: `Copy the release-defining values of one stack file into another, for CI promotion
across stacks (e.g. eks-dev → eks-prod), and print each changed key (old → new).

Images carry their digest and keep the target's registry: the target's fusebox:registry
(written by fusebox release), else the repository its own value names. So a prod mirror is
never replaced by the dev registry: mirror the digests there first, and check with --verify,
which asks the target's registry for every promoted digest before anything is written.

Promoted: every image under fusebox:images and any other fusebox: key ending in "image"
(e.g. gvisor.installerImage, which carries runsc on aks), all pinned by digest;
fusebox:gvisor.version (eks). Everything else is environment-specific and left alone: cloud,
namespaces, pool sizes, manager settings, node pool settings, Cilium, egress, and
gvisor.binaryBaseURL (the environment's mirror).

The target file is edited as a YAML node tree: its comments and key order stay. Refused, with
the key and the file named: a source image without a digest (or an unpinned gVisor release); a
key present in one stack but missing in the other; stacks of different clouds, unless every
promoted key is used on both clouds (images are cloud-neutral).
With --dry-run nothing is written. Review and commit the change like any other.`,
		Example: "  fusebox promote --from eks-dev --to eks-prod --dry-run\n  fusebox promote --from eks-dev --to eks-prod --verify --ca-file prod-ca.pem",
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.register(cmd)
	return cmd
}

func (f *promoteFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.o.From, "from", "", "source stack (stacks/Pulumi.<stack>.yaml)")
	fl.StringVar(&f.o.To, "to", "", "target stack, whose file is edited")
	fl.BoolVar(&f.o.DryRun, "dry-run", false, "print the changes, write nothing")
	fl.BoolVar(&f.verify, "verify", false, "check that every promoted digest is in the target stack's registry before writing")
	f.reg.register(cmd)
	fl.StringVar(&f.repo, "repo", "", "repository root (default: found from the working directory)")
}

// run promotes, with --verify asking the target's registry for each digest first, and
// prints each changed key.
func (f *promoteFlags) run(cmd *cobra.Command) error {
	o := &f.o
	if o.From == "" || o.To == "" {
		return errors.New("--from and --to are required (stacks/Pulumi.<stack>.yaml names)")
	}
	if f.repo == "" {
		dir, err := findRepo()
		if err != nil {
			return err
		}
		f.repo = dir
	}
	o.StacksDir = filepath.Join(f.repo, "stacks")
	if f.verify {
		o.Verify = func(ref string) error {
			repository, _, _ := strings.Cut(ref, "@")
			r, err := registry.Open(cmd.Context(), repository, f.reg.options())
			if err != nil {
				return err
			}
			return r.Check(ref)
		}
	}
	changes, err := infra.Promote(*o)
	if err != nil {
		return err
	}
	printPromotion(cmd.OutOrStdout(), *o, changes)
	return nil
}

// printPromotion prints each changed key (old → new) and what happened to the target file.
func printPromotion(out io.Writer, o infra.PromoteOptions, changes []infra.Change) {
	fmt.Fprintf(out, "promote %s → %s\n", o.From, o.To)
	for _, c := range changes {
		fmt.Fprintf(out, "  %s: %s → %s\n", c.Key, c.Old, c.New)
	}
	target := filepath.Join(o.StacksDir, "Pulumi."+o.To+".yaml")
	switch {
	case len(changes) == 0:
		fmt.Fprintf(out, "no changes: %s already has %s's release\n", target, o.From)
	case o.DryRun:
		fmt.Fprintf(out, "%d key(s) would change; dry run: %s not written\n", len(changes), target)
	default:
		fmt.Fprintf(out, "%d key(s) changed in %s\n", len(changes), target)
	}
}
