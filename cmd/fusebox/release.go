package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

func releaseCmd() *cobra.Command {
	var b buildFlags
	var reg registryFlags
	var ref, layoutDir string
	var stacks []string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "release --registry HOST[:PORT]/PATH --stack S [--stack S2 ...] [--layout DIR]",
		Short: "Build and push the images, then pin their digests in stack files",
		Long: `Builds the images (or takes them from --layout, what fusebox image build wrote), pushes them
by digest to HOST[:PORT]/PATH/<name>, checks that every digest is then in the registry, and
writes into each stacks/Pulumi.<stack>.yaml:

  fusebox:registry: HOST[:PORT]/PATH
  fusebox:images: {manager: HOST[:PORT]/PATH/manager@sha256:..., sandbox: ...}
  fusebox:gvisor.installerImage: HOST[:PORT]/PATH/gvisor-installer@sha256:...  (eks and aks stacks)

Each file is edited as a YAML node tree (its comments and key order stay) and replaced
atomically. Nothing is written when a stack is unknown, a build or push fails, or a digest is
not in the registry afterwards. Review and commit the change; fusebox promote then carries the
digests to other stacks and keeps each stack's own registry.`,
		Example: `  fusebox release --registry 127.0.0.1:5000/fusebox --ca-file ca.pem --stack eks-dev
  fusebox release --registry 127.0.0.1:5000/fusebox --stack eks-dev --stack aks-dev --layout bin/images`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ref == "" {
				return errors.New("--registry HOST[:PORT]/PATH is required (the images go to HOST[:PORT]/PATH/<name>)")
			}
			if len(stacks) == 0 {
				return errors.New("--stack is required (one of the stacks/Pulumi.<stack>.yaml files; repeat it for several)")
			}
			repo := b.repo
			if repo == "" {
				dir, err := findRepo()
				if err != nil {
					return err
				}
				repo = dir
			}
			b.repo = repo
			stacksDir := filepath.Join(repo, "stacks")
			// Everything that can be checked is checked before anything is built or pushed.
			clouds, err := infra.CheckReleaseStacks(stacksDir, stacks)
			if err != nil {
				return err
			}
			var names []string
			for _, s := range stacks {
				for _, n := range infra.NeededImages(clouds[s]) {
					if !slices.Contains(names, n) {
						names = append(names, n)
					}
				}
			}
			slices.SortFunc(names, func(a, b string) int { return slices.Index(image.Names, a) - slices.Index(image.Names, b) })
			r, err := registry.Open(cmd.Context(), ref, reg.options())
			if err != nil {
				return err
			}

			var imgs map[string]v1.Image
			if layoutDir != "" {
				dir, err := layoutPath(repo, layoutDir)
				if err != nil {
					return err
				}
				if imgs, err = image.LoadAll(dir, names); err != nil {
					return err
				}
			} else {
				b.o.Images = names
				o, err := b.options(cmd)
				if err != nil {
					return err
				}
				built, err := image.Build(o)
				if err != nil {
					return err
				}
				printBuilt(cmd, built)
				if imgs, err = image.LoadAll(o.Out, names); err != nil {
					return err
				}
			}
			refs, err := pushAll(cmd, r, imgs)
			if err != nil {
				return fmt.Errorf("%w (no stack file written)", err)
			}
			if dryRun {
				for _, n := range names {
					fmt.Fprintf(cmd.OutOrStdout(), "%-17s %s\n", n, refs[n])
				}
				fmt.Fprintln(cmd.OutOrStdout(), "dry run: no stack file written")
				return nil
			}
			changes, err := infra.WriteRelease(stacksDir, stacks, r.String(), infra.ReleaseImages(refs))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, s := range stacks {
				file := infra.StackFile(stacksDir, s)
				if len(changes[s]) == 0 {
					fmt.Fprintf(out, "%s: already pins this release\n", file)
					continue
				}
				fmt.Fprintf(out, "%s:\n", file)
				for _, c := range changes[s] {
					fmt.Fprintf(out, "  %s: %s → %s\n", c.Key, orNone(c.Old), c.New)
				}
			}
			return nil
		},
	}
	b.register(cmd)
	reg.register(cmd)
	f := cmd.Flags()
	f.Lookup("image").Hidden = true // the stacks' clouds decide which images a release needs
	f.StringVar(&ref, "registry", "", "registry and repository path, HOST[:PORT]/PATH; images go to HOST[:PORT]/PATH/<name>")
	f.StringArrayVar(&stacks, "stack", nil, "stack to release into (stacks/Pulumi.<stack>.yaml); repeat for several")
	f.StringVar(&layoutDir, "layout", "", "push the layouts in this directory (fusebox image build --out) instead of building")
	f.BoolVar(&dryRun, "dry-run", false, "build and push, write no stack file")
	return cmd
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
