package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"

	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/infra"
	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

// releaseFlags are release's flags: the build's (or --layout), the registry's, and which
// stacks to write.
type releaseFlags struct {
	b         buildFlags
	reg       registryFlags
	ref       string // --registry
	layoutDir string
	stacks    []string
	dryRun    bool
}

func releaseCmd() *cobra.Command {
	var f releaseFlags
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
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.register(cmd)
	return cmd
}

func (f *releaseFlags) register(cmd *cobra.Command) {
	f.b.register(cmd)
	f.reg.register(cmd)
	fl := cmd.Flags()
	fl.Lookup("image").Hidden = true // the stacks' clouds decide which images a release needs
	fl.StringVar(&f.ref, "registry", "", "registry and repository path, HOST[:PORT]/PATH; images go to HOST[:PORT]/PATH/<name>")
	fl.StringArrayVar(&f.stacks, "stack", nil, "stack to release into (stacks/Pulumi.<stack>.yaml); repeat for several")
	fl.StringVar(&f.layoutDir, "layout", "", "push the layouts in this directory (fusebox image build --out) instead of building")
	fl.BoolVar(&f.dryRun, "dry-run", false, "build and push, write no stack file")
}

// run checks everything it can first, then builds (or loads) the images the stacks need,
// pushes them, and writes their digests into the stack files.
func (f *releaseFlags) run(cmd *cobra.Command) error {
	if f.ref == "" {
		return errors.New("--registry HOST[:PORT]/PATH is required (the images go to HOST[:PORT]/PATH/<name>)")
	}
	if len(f.stacks) == 0 {
		return errors.New("--stack is required (one of the stacks/Pulumi.<stack>.yaml files; repeat it for several)")
	}
	repo := f.b.repo
	if repo == "" {
		dir, err := findRepo()
		if err != nil {
			return err
		}
		repo = dir
	}
	f.b.repo = repo
	stacksDir := filepath.Join(repo, "stacks")
	// Everything that can be checked is checked before anything is built or pushed.
	clouds, err := infra.CheckReleaseStacks(stacksDir, f.stacks)
	if err != nil {
		return err
	}
	names := neededImages(f.stacks, clouds)
	r, err := registry.Open(cmd.Context(), f.ref, f.reg.options())
	if err != nil {
		return err
	}
	imgs, err := f.images(cmd, repo, names)
	if err != nil {
		return err
	}
	refs, err := pushAll(cmd, r, imgs)
	if err != nil {
		return fmt.Errorf("%w (no stack file written)", err)
	}
	out := cmd.OutOrStdout()
	if f.dryRun {
		for _, n := range names {
			fmt.Fprintf(out, "%-17s %s\n", n, refs[n])
		}
		fmt.Fprintln(out, "dry run: no stack file written")
		return nil
	}
	changes, err := infra.WriteRelease(stacksDir, f.stacks, r.String(), infra.ReleaseImages(refs))
	if err != nil {
		return err
	}
	printReleaseChanges(out, stacksDir, f.stacks, changes)
	return nil
}

// neededImages are the images the stacks' clouds need, each once, in image.Names' order.
func neededImages(stacks []string, clouds map[string]components.Cloud) []string {
	var names []string
	for _, s := range stacks {
		for _, n := range infra.NeededImages(clouds[s]) {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.SortFunc(names, func(a, b string) int { return slices.Index(image.Names, a) - slices.Index(image.Names, b) })
	return names
}

// images loads names from --layout, or builds them and loads what the build wrote.
func (f *releaseFlags) images(cmd *cobra.Command, repo string, names []string) (map[string]v1.Image, error) {
	if f.layoutDir != "" {
		dir, err := layoutPath(repo, f.layoutDir)
		if err != nil {
			return nil, err
		}
		return image.LoadAll(dir, names)
	}
	f.b.o.Images = names
	o, err := f.b.options(cmd)
	if err != nil {
		return nil, err
	}
	built, err := image.Build(o)
	if err != nil {
		return nil, err
	}
	printBuilt(cmd, built)
	return image.LoadAll(o.Out, names)
}

// printReleaseChanges prints, per stack file, each key the release changed (old → new).
func printReleaseChanges(out io.Writer, stacksDir string, stacks []string, changes map[string][]infra.Change) {
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
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
