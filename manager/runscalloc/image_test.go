package runscalloc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/internal/runsc"
)

func TestWithImage(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "usr/local/bin"), 0o755)
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "usr/local/bin/fusebox-sandbox"), []byte("ELF"), 0o755)
	os.WriteFile(filepath.Join(dir, "usr/local/bin/not-executable"), []byte("x"), 0o644)
	os.Symlink("fusebox-sandbox", filepath.Join(dir, "usr/local/bin/server"))
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("nonroot:x:65532:65532::/:/bin/sh\n"), 0o644)
	base := Template{Bundle: runsc.BundleSpec{MemoryLimitBytes: 1 << 30, Env: []string{"GODEBUG=x=1"}}, ServerArgs: []string{"-max-output=1"}}
	cfg := v1.Config{Entrypoint: []string{"/usr/local/bin/fusebox-sandbox"}, Cmd: []string{"-ignored"}, User: "nonroot",
		Env: []string{"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8"}, WorkingDir: "/workspace/"}

	got, err := withImage(base, &rootfs.Root{Dir: dir, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	b := got.Bundle
	if !slices.Equal(got.Entrypoint, cfg.Entrypoint) || b.RootFS != dir || b.EtcDir != "" || b.UID != 65532 || b.GID != 65532 ||
		b.Cwd != "/workspace" || b.MemoryLimitBytes != 1<<30 ||
		!slices.Equal(got.ServerArgs, []string{"-env=PATH=/usr/local/bin:/usr/bin", "-env=LANG=C.UTF-8", "-max-output=1"}) {
		t.Fatalf("template %+v", got)
	}
	if want := []string{"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8", "GODEBUG=x=1"}; !slices.Equal(b.Env, want) {
		t.Errorf("env %q, want the image's, then the template's: %q", b.Env, want)
	}
	if len(base.Bundle.Env) != 1 {
		t.Errorf("withImage changed its argument's env: %q", base.Bundle.Env)
	}

	for _, tc := range []struct {
		name string
		mod  func(*v1.Config)
		err  string
	}{
		{"no entrypoint", func(c *v1.Config) { c.Entrypoint = nil }, "has no entrypoint"},
		{"entrypoint missing", func(c *v1.Config) { c.Entrypoint = []string{"/usr/bin/fusebox-sandbox"} }, "not in the image"},
		{"entrypoint not executable", func(c *v1.Config) { c.Entrypoint = []string{"/usr/local/bin/not-executable"} }, "not an executable file"},
		{"relative entrypoint", func(c *v1.Config) { c.Entrypoint = []string{"fusebox-sandbox"} }, "not an absolute path"},
		{"unknown user", func(c *v1.Config) { c.User = "ghost" }, `no user "ghost"`},
		{"entrypoint through a link", func(c *v1.Config) { c.Entrypoint = []string{"/usr/local/bin/server"} }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			tc.mod(&c)
			_, err := withImage(base, &rootfs.Root{Dir: dir, Config: c})
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
		})
	}
}

func TestNewRefusesABadImage(t *testing.T) {
	runscBin := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(runscBin, []byte("#!/bin/sh\n"), 0o755)
	notLayout := t.TempDir()
	for _, tc := range []struct{ image, err string }{
		{notLayout, "not an OCI image layout"},
		{"127.0.0.1:5000", "without a repository path"},
	} {
		_, err := New(Options{Runsc: runscBin, StateDir: t.TempDir(), Image: tc.image})
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("image %s: %v, want %q", tc.image, err, tc.err)
		}
	}
	if _, err := New(Options{Runsc: runscBin, StateDir: t.TempDir()}); err == nil {
		t.Error("New without SandboxBinary or Image succeeded")
	}
}
