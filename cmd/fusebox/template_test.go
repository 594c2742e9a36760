package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/templates"
)

// TestTemplateValidate: a good file prints each template with its hash and pool; a bad one
// fails naming the file, the entry and the field.
func TestTemplateValidate(t *testing.T) {
	dir := t.TempDir()
	digest := "@sha256:" + strings.Repeat("ab", 32)
	good := filepath.Join(dir, "good.yaml")
	body := "templates:\n- name: py\n  image: localhost:5000/py" + digest + "\n  pool: {min: 1, max: 4, estimator: ewma}\n"
	if err := os.WriteFile(good, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, err := templates.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	cmd := templateValidateCmd()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetArgs([]string{good})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "py        "+specs[0].Hash()[:12]+"  ewma 1-4  localhost:5000/py"+digest) {
		t.Errorf("validate printed:\n%s", out.String())
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("templates:\n- name: py\n  image: localhost:5000/py:latest\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = templateValidateCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{bad})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "templates[0] (py): image") {
		t.Errorf("a bad file: %v", err)
	}
}
