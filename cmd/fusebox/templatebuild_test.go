package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTemplateBuildBadInput: flags that cannot work are refused, naming what is wrong, before
// anything is pulled or run.
func TestTemplateBuildBadInput(t *testing.T) {
	dir := t.TempDir()
	df := filepath.Join(dir, "Dockerfile")
	if err := os.WriteFile(df, []byte("FROM /nonexistent\nRUN true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sandbox := filepath.Join(dir, "fusebox-sandbox")
	if err := os.WriteFile(sandbox, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	out := filepath.Join(dir, "out")
	common := []string{"-f", df, "--tag", "app", "--cache", cache, "--runsc", "/nonexistent/runsc", dir}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"egress without a port", []string{"--out", out, "--egress", "pypi.org", "--sandbox-binary", sandbox},
			[]string{`--egress "pypi.org"`, "want host:port"}},
		{"egress as a URL", []string{"--out", out, "--egress", "127.0.0.1:8000", "--egress", "https://pypi.org:443", "--sandbox-binary", sandbox},
			[]string{`--egress "https://pypi.org:443"`, "not a URL"}},
		{"egress without fusebox-sandbox", []string{"--out", out, "--egress", "pypi.org:443", "--sandbox-binary", filepath.Join(dir, "missing")},
			[]string{"fusebox-sandbox not found at " + filepath.Join(dir, "missing"), "--sandbox-binary"}},
		{"neither out nor push", nil, []string{"--out", "--push"}},
		{"push with a digest", []string{"--push", "127.0.0.1:5000/t/app@sha256:" + strings.Repeat("0", 64)},
			[]string{"--push", "by its digest"}},
		{"push without a registry", []string{"--push", "templates/app:1"}, []string{"--push", "naming the registry"}},
		{"insecure push off loopback", []string{"--push", "registry.example.com/t/app:1", "--insecure"},
			[]string{"--push", "loopback registry only", "registry.example.com"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := templateBuildCmd()
			var stderr strings.Builder
			cmd.SetOut(&stderr)
			cmd.SetErr(&stderr)
			cmd.SetArgs(append(append([]string{}, c.args...), common...))
			err := cmd.Execute()
			if err == nil {
				t.Fatalf("accepted; output:\n%s", stderr.String())
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if _, err := os.Stat(cache); err == nil {
				t.Error("the cache directory was made: the build started")
			}
		})
	}
}
