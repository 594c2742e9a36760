package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fusebox-dev/fusebox/cmd/internal/daemoncmd"
	"github.com/fusebox-dev/fusebox/internal/templatebuild"
	"github.com/fusebox-dev/fusebox/manager/egress"
)

func templateBuildCmd() *cobra.Command {
	var (
		o         templatebuild.Options
		buildArgs []string
		push      string
		reg       registryFlags
	)
	cmd := &cobra.Command{
		Use:   "build -f Dockerfile --tag NAME [--out DIR] [--push REGISTRY/REPO[:TAG]] [--egress HOST:PORT ...] [--build-arg K=V ...] [CONTEXT]",
		Short: "Build a template's image from a Dockerfile, each RUN step in a gVisor sandbox",
		Long: `Builds an OCI image from a Dockerfile without Docker and writes it as an OCI image layout
(DIR/index.json names it NAME), then prints the reference a templates file takes as a
template's image: DIR@sha256:<digest>.

The base image (FROM) is an OCI layout (/abs/dir@sha256:...) or a registry reference; one not
pinned by digest is resolved once and the digest it resolved to is printed. Each RUN step runs
in a fresh gVisor sandbox (runsc) with no network, within --step-memory and --step-tasks, its
writable root a copy of the image being built. With --egress, the RUN steps reach those
destinations (HOST:PORT: a name, *.wildcard or IP literal, as an allocation's allowlist) and
nothing else, through an allowlisting proxy on this host that their sandboxes reach through
fusebox-sandbox (--sandbox-binary) as HTTP_PROXY and HTTPS_PROXY; a name that resolves to a
loopback or private address is refused: allowlist such a server by its IP (127.0.0.1:8080).
A step refused a destination sees a 403 saying why. COPY and ADD read the build context (CONTEXT,
default .), and refuse a source that leaves it, by .. or by a link; .dockerignore is honoured.
Supported instructions: FROM, RUN, COPY, ADD (local files; a tar archive, plain, gzip or
bzip2, is unpacked), ENV, WORKDIR, USER, ARG, LABEL; anything else is refused with its line
before anything runs.

The same Dockerfile, context, build arguments and epoch (SOURCE_DATE_EPOCH, else a fixed
date) give the same image digest. Steps are cached under --cache: a rebuild runs only the
steps from the first changed one; the egress allowlist is part of a RUN step's cache key.
Beside the image, DIR/fusebox-build.json records the Dockerfile's digest, the base image's
digest, the build arguments and the egress allowlist; the image's annotations carry the
digests and the allowlist too.

With --push, the image is also pushed to REGISTRY/REPO by digest (and TAG, if given), and the
reference by digest is printed; without --out, the layout is only a temporary one. The
registry's TLS certificate is verified against the system roots and --ca-file; --insecure
(plain HTTP) is allowed for a loopback registry only. Credentials come from the Docker config.`,
		Example: `  fusebox template build -f Dockerfile --tag python --out images/python .
  fusebox template build -f ml.Dockerfile --tag ml --out images/ml --build-arg TORCH=2.4 ctx/
  fusebox template build -f Dockerfile --tag py --egress pypi.org:443 --egress files.pythonhosted.org:443 \
      --push registry.example.com/templates/py:3.12 .`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Dockerfile == "" {
				return fmt.Errorf("no Dockerfile: pass -f Dockerfile")
			}
			if o.Tag == "" {
				return fmt.Errorf("--tag is required: the image's name")
			}
			if o.Out == "" && push == "" {
				return fmt.Errorf("--out DIR (the OCI layout directory to write) or --push REGISTRY/REPO[:TAG] is required")
			}
			for _, e := range o.Egress {
				if _, err := egress.ParseAllowlist([]string{e}); err != nil {
					return fmt.Errorf("--egress %q: %w", e, err)
				}
			}
			if len(o.Egress) > 0 {
				if _, err := os.Stat(o.SandboxBinary); err != nil {
					return fmt.Errorf("fusebox-sandbox not found at %s: --egress needs it to relay the RUN steps' traffic: build it with `make build` or pass --sandbox-binary", o.SandboxBinary)
				}
			}
			if push != "" {
				if err := templatebuild.CheckPush(push, templatebuild.PushOptions{Insecure: reg.insecure}); err != nil {
					return fmt.Errorf("--push: %w", err)
				}
			}
			if o.Out == "" {
				// Only the push is wanted: the layout is written beside the cache, then removed.
				if err := os.MkdirAll(o.CacheDir, 0o700); err != nil {
					return fmt.Errorf("creating the cache directory: %w", err)
				}
				tmp, err := os.MkdirTemp(o.CacheDir, "push-")
				if err != nil {
					return fmt.Errorf("creating the layout to push: %w", err)
				}
				defer os.RemoveAll(tmp)
				o.Out = filepath.Join(tmp, "layout")
			}
			o.Context = "."
			if len(args) == 1 {
				o.Context = args[0]
			}
			o.BuildArgs = map[string]string{}
			for _, kv := range buildArgs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--build-arg %q: want NAME=VALUE", kv)
				}
				o.BuildArgs[k] = v
			}
			o.Progress = cmd.ErrOrStderr()
			b, err := templatebuild.New(o)
			if err != nil {
				return err
			}
			res, err := b.Build(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "built %s: %d steps, %d RUN steps run, %d cached, %d layers over the base %s\n",
				o.Tag, res.Steps, res.Ran, res.Cached, res.Layers, res.Base)
			if push == "" {
				fmt.Fprintln(cmd.OutOrStdout(), res.Reference)
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pushing %s to %s\n", res.Digest, push)
			ref, err := templatebuild.Push(cmd.Context(), res, push,
				templatebuild.PushOptions{CAFile: reg.caFile, Insecure: reg.insecure})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), ref)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Dockerfile, "file", "f", "", "the Dockerfile")
	f.StringVar(&o.Tag, "tag", "", "the image's name in the layout (org.opencontainers.image.ref.name)")
	f.StringVar(&o.Out, "out", "", "the OCI image layout directory to write (an existing layout there is replaced); optional with --push")
	f.StringArrayVar(&o.Egress, "egress", nil, "a destination HOST:PORT the RUN steps may reach through the build's egress proxy (a name, *.wildcard or IP literal); repeat for several; none: no network")
	f.StringVar(&o.SandboxBinary, "sandbox-binary", daemoncmd.SiblingBinary("fusebox-sandbox"), "the static fusebox-sandbox that relays the RUN steps' egress (with --egress)")
	f.StringVar(&push, "push", "", "also push the image to REGISTRY/REPO[:TAG], by digest, and print that reference")
	reg.register(cmd)
	f.StringArrayVar(&buildArgs, "build-arg", nil, "a build argument NAME=VALUE for the Dockerfile's ARG; repeat for several")
	f.StringVar(&o.CacheDir, "cache", filepath.Join(cacheRoot(), "template-build"), "the unpacked base images and the step cache ($FUSEBOX_CACHE/template-build)")
	f.StringVar(&o.Runsc, "runsc", defaultImageRunsc(), "the pinned runsc the RUN steps run with (make runsc)")
	f.Var(&byteQuantity{&o.StepMemory}, "step-memory", "each RUN step's memory (a Kubernetes quantity: 4Gi, 512Mi); a step that needs more is stopped and fails the build (default 4Gi)")
	f.Int64Var(&o.StepTasks, "step-tasks", templatebuild.DefaultStepTasks, "the tasks (processes and threads) a RUN step may have at once; a fork beyond it fails in the step")
	return cmd
}

// byteQuantity is a flag of a byte count written as a Kubernetes quantity.
type byteQuantity struct{ n *int64 }

func (q *byteQuantity) String() string {
	if q.n == nil || *q.n == 0 {
		return ""
	}
	return resource.NewQuantity(*q.n, resource.BinarySI).String()
}

func (q *byteQuantity) Set(s string) error {
	v, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("want a quantity such as 4Gi or 512Mi: %w", err)
	}
	*q.n = v.Value()
	return nil
}

func (q *byteQuantity) Type() string { return "quantity" }
