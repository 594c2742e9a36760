package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

func promoteCmd() *cobra.Command {
	var o infra.PromoteOptions
	var repo string
	var verify bool
	var reg registryFlags
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
(e.g. gvisor.installerImage), all pinned by digest; fusebox:gvisor.version; the digests under
fusebox:gvisor.sha256. Everything else is environment-specific and left alone: cloud,
namespaces, pool sizes, manager settings, node pool settings, Cilium, egress, and
gvisor.binaryBaseURL (the environment's mirror).

The target file is edited as a YAML node tree: its comments and key order stay. Refused, with
the key and the file named: a source image without a digest (or an unpinned gVisor release, a
malformed checksum); a key present in one stack but missing in the other; stacks of different
clouds, unless every promoted key is used on both clouds (images are cloud-neutral).
With --dry-run nothing is written. Review and commit the change like any other.`,
		Example: "  fusebox promote --from eks-dev --to eks-prod --dry-run\n  fusebox promote --from eks-dev --to eks-prod --verify --ca-file prod-ca.pem",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.From == "" || o.To == "" {
				return errors.New("--from and --to are required (stacks/Pulumi.<stack>.yaml names)")
			}
			if repo == "" {
				dir, err := findRepo()
				if err != nil {
					return err
				}
				repo = dir
			}
			o.StacksDir = filepath.Join(repo, "stacks")
			if verify {
				o.Verify = func(ref string) error {
					repository, _, _ := strings.Cut(ref, "@")
					r, err := registry.Open(cmd.Context(), repository, reg.options())
					if err != nil {
						return err
					}
					return r.Check(ref)
				}
			}
			changes, err := infra.Promote(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
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
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.From, "from", "", "source stack (stacks/Pulumi.<stack>.yaml)")
	f.StringVar(&o.To, "to", "", "target stack, whose file is edited")
	f.BoolVar(&o.DryRun, "dry-run", false, "print the changes, write nothing")
	f.BoolVar(&verify, "verify", false, "check that every promoted digest is in the target stack's registry before writing")
	reg.register(cmd)
	f.StringVar(&repo, "repo", "", "repository root (default: found from the working directory)")
	return cmd
}
