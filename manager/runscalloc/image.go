package runscalloc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/rootfs"
)

// prepareImage unpacks the image src names into cacheDir, or finds it there.
func prepareImage(ctx context.Context, src, cacheDir string, log *slog.Logger) (*rootfs.Root, error) {
	s, err := rootfs.ParseSource(src)
	if err != nil {
		return nil, err
	}
	root, err := rootfs.Prepare(ctx, s, cacheDir, log)
	if err != nil {
		return nil, fmt.Errorf("preparing sandbox image %s: %w", src, err)
	}
	log.Info("sandbox image", "image", src, "digest", root.Digest.String(), "root", root.Dir)
	return root, nil
}

// withImage returns t with root as its root filesystem, honouring the image's
// configuration: its entrypoint runs the server (t's flags appended; the image's Cmd,
// which they replace, is not used), as its user, with its environment before t's (the
// server's and, as -env flags, its commands'), in its working directory.
func withImage(t Template, root *rootfs.Root) (Template, error) {
	cfg := root.Config
	if len(cfg.Entrypoint) == 0 {
		return Template{}, fmt.Errorf("sandbox image %s has no entrypoint: want one that runs fusebox-sandbox (/usr/local/bin/fusebox-sandbox in the images `fusebox image build` makes)", root.Digest)
	}
	if err := checkExecutable(root.Dir, cfg.Entrypoint[0]); err != nil {
		return Template{}, fmt.Errorf("sandbox image %s: entrypoint %s: %w", root.Digest, cfg.Entrypoint[0], err)
	}
	uid, gid, err := root.User()
	if err != nil {
		return Template{}, fmt.Errorf("sandbox image %s: %w", root.Digest, err)
	}
	t.Entrypoint = slices.Clone(cfg.Entrypoint)
	// The server's commands start from its -env flags, not from its own environment.
	t.ServerArgs = append(imageEnvArgs(cfg), t.ServerArgs...)
	b := t.Bundle
	b.RootFS, b.EtcDir = root.Dir, ""
	b.UID, b.GID = uid, gid
	b.Env = append(slices.Clone(cfg.Env), b.Env...)
	if b.Cwd == "" && path.IsAbs(cfg.WorkingDir) {
		b.Cwd = path.Clean(cfg.WorkingDir)
	}
	t.Bundle = b
	return withWorkspaceSeed(t, root)
}

// imageEnvArgs are the image's environment as the server's -env flags: the commands' base
// environment, under the template's own flags, which come after them and so win.
func imageEnvArgs(cfg v1.Config) []string {
	var env []string
	for _, kv := range cfg.Env {
		if k, _, ok := strings.Cut(kv, "="); ok && k != "" {
			env = append(env, "-env="+kv)
		}
	}
	return env
}

// withTemplateImage returns t with root as its root filesystem, for a template's own image
// (Template.Image): the server is SandboxBinary, bound in (no entrypoint); the commands run
// as t.User or the image's user, with the image's environment under t's (the server's -env
// flags: the image's first, so that t's win).
func withTemplateImage(t Template, root *rootfs.Root) (Template, error) {
	cfg := root.Config
	user := t.User
	if user == "" {
		user = cfg.User
	}
	uid, gid, err := root.UserOf(user)
	if err != nil {
		return Template{}, fmt.Errorf("image %s: %w", root.Digest, err)
	}
	t.Entrypoint = nil
	t.ServerArgs = append(imageEnvArgs(cfg), t.ServerArgs...)
	b := t.Bundle
	b.RootFS, b.EtcDir = root.Dir, ""
	b.UID, b.GID = uid, gid
	t.Bundle = b
	return withWorkspaceSeed(t, root)
}

// checkExecutable checks that p (absolute, inside the root dir) is an executable regular
// file, following symbolic links inside the root.
func checkExecutable(dir, p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("not an absolute path")
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	fi, err := r.Stat(strings.TrimPrefix(path.Clean(p), "/"))
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("not in the image")
		}
		return nil // e.g. an absolute link, which only the sandbox resolves
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("not an executable file in the image")
	}
	return nil
}
