package deploy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/fusebox-dev/fusebox/infra/preflight"
)

// fakeCLI writes a pulumi that answers `pulumi version` with the pinned version and, for any
// other command, records its arguments, the PULUMI_* and KUBECONFIG variables of its
// environment, the files of its working directory and the project's settings into log,
// copies the stack file it finds there to log.stack, then fails. It returns the
// tools directory.
func fakeCLI(t *testing.T, log string) string {
	t.Helper()
	tools := t.TempDir()
	script := `#!/bin/sh
if [ "$1" = version ]; then echo v` + CLIVersion + `; exit 0; fi
{
  echo "args: $*"
  env | grep -E '^(PULUMI_|KUBECONFIG=)' | sort
  for f in *; do echo "file $f"; done
  grep -E '^(name|runtime|main|stackConfigDir):' Pulumi.yaml
  for f in Pulumi.*.yaml; do cp "$f" '` + log + `.stack'; done
} >> '` + log + `'
echo "fake pulumi: refused" >&2
exit 1
`
	if err := os.MkdirAll(filepath.Join(tools, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tools, "bin", "pulumi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return tools
}

// TestRunHandsTheCLI: what Run hands the Pulumi CLI (environment, backend, project and stack
// files in its working directory) and the errors it returns before and after the CLI, per
// operation, are what testdata/run.json holds.
func TestRunHandsTheCLI(t *testing.T) {
	repo := mocktest.ScratchRepo(t, filepath.Join("..", ".."), "local", func(s string) string { return s })
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("PULUMI_BACKEND_URL", "")
	os.Unsetenv("PULUMI_BACKEND_URL")
	t.Setenv("PULUMI_CONFIG_PASSPHRASE", "")
	os.Unsetenv("PULUMI_CONFIG_PASSPHRASE")
	t.Setenv("PULUMI_CONFIG_PASSPHRASE_FILE", "")
	os.Unsetenv("PULUMI_CONFIG_PASSPHRASE_FILE")
	refusing := preflight.Cluster{Namespace: func(context.Context, string) (bool, error) { return false, errors.New("no cluster here") }}
	explicit := filepath.Join(t.TempDir(), "state", "dir")
	render := t.TempDir()
	cases := []struct {
		name string
		op   Op
		o    Options
	}{
		{"preview, default backend", Preview, Options{Stack: "local"}},
		{"preview, explicit backend and env", Preview, Options{Stack: "local", Backend: "file://" + explicit, Env: map[string]string{"KUBECONFIG": "/nonexistent", "PULUMI_CONFIG_PASSPHRASE": "x"}}},
		{"destroy", Destroy, Options{Stack: "local", Backend: "s3://bucket/state"}},
		{"up, render", Up, Options{Stack: "local", RenderDir: render}},
		{"preview, render", Preview, Options{Stack: "local", RenderDir: render}},
		{"up, preflight", Up, Options{Stack: "local", Cluster: &refusing}},
		{"unknown op", Op("refresh"), Options{Stack: "local", Backend: "s3://bucket/state"}},
		{"missing stack", Preview, Options{Stack: "nope"}},
		{"no stack", Preview, Options{}},
	}
	got := map[string]any{}
	for _, c := range cases {
		log := filepath.Join(t.TempDir(), "log")
		o := c.o
		if o.Stack != "" {
			o.RepoDir, o.Tools = repo, fakeCLI(t, log)
		}
		_, err := Run(context.Background(), c.op, o)
		rec := map[string]any{"error": "<nil>"}
		if err != nil {
			rec["error"] = err.Error()
		}
		if b, err := os.ReadFile(log); err == nil {
			rec["cli"] = strings.Split(string(b), "\n")
		}
		if b, err := os.ReadFile(log + ".stack"); err == nil {
			orig, err := os.ReadFile(filepath.Join(repo, "stacks", "Pulumi."+o.Stack+".yaml"))
			rec["stack file is the repository's"] = err == nil && string(b) == string(orig)
		}
		got[c.name] = rec
	}
	if _, err := os.Stat(filepath.Join(home, ".fusebox", "pulumi-state")); err != nil {
		t.Errorf("default backend directory: %v", err)
	}
	if _, err := os.Stat(explicit); err != nil {
		t.Errorf("explicit backend directory: %v", err)
	}
	// Temporary paths differ per run: name them.
	names := map[string]string{repo: "<repo>", home: "<home>", explicit: "<explicit>", render: "<render>"}
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	var scrub func(v any) any
	scrub = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				v[k] = scrub(x)
			}
		case []string:
			for i, s := range v {
				v[i] = scrub(s).(string)
			}
		case string:
			for _, k := range keys {
				v = strings.ReplaceAll(v, k, names[k])
			}
			return tempPath(v)
		}
		return v
	}
	mocktest.GoldenJSON(t, filepath.Join("testdata", "run.json"), scrub(got))
}

// tempPath replaces the random part of paths under the temporary directory.
func tempPath(s string) string {
	tmp := os.TempDir() + "/"
	for {
		i := strings.Index(s, tmp)
		if i < 0 {
			return s
		}
		j := i + len(tmp)
		for j < len(s) && s[j] != '/' && s[j] != ' ' && s[j] != '\n' && s[j] != '"' && s[j] != ':' {
			j++
		}
		name := s[i+len(tmp) : j]
		name = strings.TrimRight(strings.TrimRight(name, "0123456789"), "-")
		s = s[:i] + "<tmp:" + name + ">" + s[j:]
	}
}
