package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/image/registry"
)

// The pinned gVisor binaries that the node installer image carries (make runsc shim).
const (
	gvisorModuleVersion = "v0.0.0-20260905035102-160fafc42237"
	defaultImageCache   = "/var/cache/fusebox"
)

func cacheRoot() string {
	if v := os.Getenv("FUSEBOX_CACHE"); v != "" {
		return v
	}
	return defaultImageCache
}

func defaultImageRunsc() string {
	if v := os.Getenv("FUSEBOX_RUNSC"); v != "" {
		return v
	}
	return filepath.Join(cacheRoot(), "runsc-"+gvisorModuleVersion, "runsc")
}

func defaultImageShim() string {
	if v := os.Getenv("FUSEBOX_SHIM"); v != "" {
		return v
	}
	return filepath.Join(cacheRoot(), "shim-"+gvisorModuleVersion, "containerd-shim-runsc-v1")
}

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build fusebox's OCI images (manager, sandbox, gVisor node installer) and push them by digest",
	}
	cmd.AddCommand(imageBuildCmd(), imagePushCmd())
	return cmd
}

// imageConfig is the file given with --config: what a user changes to make their own
// sandbox image.
type imageConfig struct {
	Sandbox struct {
		// Packages are Debian packages added to the sandbox userland.
		Packages []string `json:"packages"`
	} `json:"sandbox"`
}

func readImageConfig(path string) (*imageConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	var c imageConfig
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("image config %s: %v (want `sandbox: {packages: [jq, ...]}`)", path, err)
	}
	return &c, nil
}

// buildFlags are the flags of `image build`, also taken by `release`.
type buildFlags struct {
	o        image.BuildOptions
	packages []string
	config   string
	repo     string
}

func (b *buildFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&b.o.Out, "out", "bin/images", "directory that receives one OCI image layout per image, OUT/<name>/")
	f.StringSliceVar(&b.o.Images, "image", nil, "image to build ("+strings.Join(image.Names, ", ")+"); repeat or comma-separate; default all")
	f.StringSliceVar(&b.packages, "packages", nil, "extra Debian packages for the sandbox image, comma-separated")
	f.StringVar(&b.config, "config", "", "image config file (YAML: sandbox.packages: [...]) adding Debian packages to the sandbox image")
	f.StringVar(&b.o.ManagerPackage, "manager-package", image.DefaultManagerPackage, "main package of the manager binary")
	f.StringVar(&b.o.Runsc, "runsc", defaultImageRunsc(), "pinned runsc for the gvisor-installer image (make runsc)")
	f.StringVar(&b.o.Shim, "shim", defaultImageShim(), "pinned containerd-shim-runsc-v1 for the gvisor-installer image (make shim)")
	f.StringVar(&b.o.CacheDir, "cache", cacheRoot(), "cache of the Debian userlands ($FUSEBOX_CACHE)")
	f.StringVar(&b.repo, "repo", "", "repository root (default: found from the working directory)")
}

// options resolves the flags into BuildOptions.
func (b *buildFlags) options(cmd *cobra.Command) (image.BuildOptions, error) {
	o := b.o
	if err := image.CheckNames(o.Images); err != nil {
		return o, err
	}
	repo := b.repo
	if repo == "" {
		dir, err := findRepo()
		if err != nil {
			return o, err
		}
		repo = dir
	}
	o.ModuleDir = repo
	if !filepath.IsAbs(o.Out) {
		o.Out = filepath.Join(repo, o.Out)
	}
	o.ExtraPackages = slices.Clone(b.packages)
	if b.config != "" {
		c, err := readImageConfig(b.config)
		if err != nil {
			return o, err
		}
		o.ExtraPackages = append(o.ExtraPackages, c.Sandbox.Packages...)
	}
	o.Progress = cmd.ErrOrStderr()
	return o, nil
}

func imageBuildCmd() *cobra.Command {
	var b buildFlags
	cmd := &cobra.Command{
		Use:   "build [--out DIR] [--image NAME ...] [--tar] [--packages P,...] [--config FILE]",
		Short: "Build the images into OCI image layouts, reproducibly, without a Docker daemon",
		Long: `Builds fusebox's images and writes each as an OCI image layout, OUT/<name>/, with its SPDX
SBOM (OUT/<name>/sbom.spdx.json: the Go modules of its binaries and its Debian packages), and
prints each image's name and digest.

  manager           the static manager binary (/usr/local/bin/fusebox-manager) and CA
                    certificates, user 65532, nothing else
  sandbox           a Debian 12 userland made with mmdebstrap from the Debian mirror of this
                    machine's apt sources (bash, coreutils, curl, git, python3 with pip and
                    venv, ...), fusebox-sandbox as entrypoint, user 65532, /workspace
  gvisor-installer  the AKS node installer script with a small userland (bash, curl,
                    coreutils, util-linux), and the pinned runsc and containerd-shim-runsc-v1

Two builds of the same commit give the same digests: every time is SOURCE_DATE_EPOCH (default
2026-01-01T00:00:00Z), entries are sorted, owners numeric, gzip deterministic. The Debian
userland is cached in --cache, keyed by its inputs (packages, suite, architecture, the apt
sources' contents, mmdebstrap's version): a rebuild with nothing changed takes seconds.
Needs the Go toolchain, and mmdebstrap (Debian package mmdebstrap) for the sandbox and the
node installer. Add Debian packages to your sandbox image with --packages or --config.`,
		Example: `  fusebox image build
  fusebox image build --image sandbox --packages jq,nodejs --tar
  fusebox image build --config sandbox-image.yaml --out /tmp/images`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := b.options(cmd)
			if err != nil {
				return err
			}
			built, err := image.Build(o)
			if err != nil {
				return err
			}
			printBuilt(cmd, built)
			return nil
		},
	}
	b.register(cmd)
	cmd.Flags().BoolVar(&b.o.Tar, "tar", false, "also write OUT/<name>.tar, an archive that `ctr images import` takes")
	return cmd
}

func printBuilt(cmd *cobra.Command, built []image.Built) {
	out := cmd.OutOrStdout()
	for _, b := range built {
		fmt.Fprintf(out, "%-17s %s  %s\n", b.Name, b.Digest, b.Dir)
		if b.Tar != "" {
			fmt.Fprintf(out, "%-17s archive %s (ctr images import names it %s)\n", "", b.Tar, image.RefName(b.Name))
		}
	}
}

// registryFlags are how `image push`, `release` and `promote --verify` reach a registry.
type registryFlags struct {
	caFile   string
	insecure bool
}

func (r *registryFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&r.caFile, "ca-file", "", "PEM CA bundle trusted for the registry's TLS certificate, besides the system roots")
	f.BoolVar(&r.insecure, "insecure", false, "plain HTTP (loopback registries only)")
}

func (r *registryFlags) options() registry.Options {
	return registry.Options{CAFile: r.caFile, Insecure: r.insecure}
}

func imagePushCmd() *cobra.Command {
	var reg registryFlags
	var ref, layoutDir, repo string
	var names []string
	cmd := &cobra.Command{
		Use:   "push --registry HOST[:PORT]/PATH [--layout DIR] [--image NAME ...]",
		Short: "Push built images by digest to an OCI distribution registry",
		Long: `Pushes the images of --layout (what fusebox image build wrote) to HOST[:PORT]/PATH/<name>
by digest (no tag), checks that each digest is then in the registry, and prints each
REPOSITORY@sha256:... reference. Credentials come from the Docker config
($DOCKER_CONFIG/config.json, credential helpers), as docker login writes them. The registry's
TLS certificate is verified against the system roots and --ca-file; --insecure (plain HTTP) is
allowed for a loopback registry only.`,
		Example: `  fusebox image push --registry 127.0.0.1:5000/fusebox --ca-file ca.pem`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ref == "" {
				return errors.New("--registry HOST[:PORT]/PATH is required")
			}
			r, err := registry.Open(cmd.Context(), ref, reg.options())
			if err != nil {
				return err
			}
			dir, err := layoutPath(repo, layoutDir)
			if err != nil {
				return err
			}
			if len(names) == 0 {
				names = presentImages(dir)
			}
			imgs, err := image.LoadAll(dir, names)
			if err != nil {
				return err
			}
			refs, err := pushAll(cmd, r, imgs)
			if err != nil {
				return err
			}
			for _, n := range image.Names {
				if refs[n] != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "%-17s %s\n", n, refs[n])
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&ref, "registry", "", "registry and repository path, HOST[:PORT]/PATH; images go to HOST[:PORT]/PATH/<name>")
	f.StringVar(&layoutDir, "layout", "bin/images", "directory of the image layouts (fusebox image build --out)")
	f.StringSliceVar(&names, "image", nil, "image to push; default every image in --layout")
	f.StringVar(&repo, "repo", "", "repository root, against which a relative --layout is taken (default: the working directory)")
	reg.register(cmd)
	return cmd
}

// layoutPath resolves a relative layout directory against repo (or the working directory).
func layoutPath(repo, dir string) (string, error) {
	if filepath.IsAbs(dir) || repo == "" {
		return filepath.Abs(dir)
	}
	return filepath.Join(repo, dir), nil
}

// presentImages lists the images with a layout in dir, in build order; all names when none
// is there (so that the error names what is missing).
func presentImages(dir string) []string {
	var names []string
	for _, n := range image.Names {
		if _, err := os.Stat(filepath.Join(dir, n, "index.json")); err == nil {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return image.Names
	}
	return names
}

// pushAll pushes each image, then checks that every digest is in the registry.
func pushAll(cmd *cobra.Command, r *registry.Registry, imgs map[string]v1.Image) (map[string]string, error) {
	refs := map[string]string{}
	for _, n := range image.Names {
		img, ok := imgs[n]
		if !ok {
			continue
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "pushing %s to %s\n", n, r.Repository(n))
		ref, err := r.Push(n, img)
		if err != nil {
			return nil, err
		}
		refs[n] = ref
	}
	for _, n := range image.Names {
		if refs[n] == "" {
			continue
		}
		if err := r.Check(refs[n]); err != nil {
			return nil, fmt.Errorf("after the push: %w", err)
		}
	}
	return refs, nil
}
