package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/templates"
)

// TestServedTemplatesKept: the templates saved are those a start without --templates serves;
// nothing saved is none; a damaged file fails the start, naming itself and the way out.
func TestServedTemplatesKept(t *testing.T) {
	dir := t.TempDir()
	c := Config{StateDir: dir}
	log := slog.New(slog.DiscardHandler)
	if got, err := templatesAtStart(c, log); err != nil || got != nil {
		t.Fatalf("nothing saved: %v, %v", got, err)
	}
	specs, err := templates.Parse([]byte("templates:\n- name: web\n  image: /srv/web@sha256:" + strings.Repeat("a", 64) +
		"\n  env: {A: b}\n  pool: {min: 2, max: 4, estimator: ewma}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := saveTemplates(dir, specs); err != nil {
		t.Fatal(err)
	}
	got, err := templatesAtStart(c, log)
	if err != nil || !reflect.DeepEqual(got, specs) || got[0].Hash() != specs[0].Hash() {
		t.Fatalf("after a save: %+v, %v; want %+v", got, err, specs)
	}
	if err := saveTemplates(dir, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := templatesAtStart(c, log); err != nil || len(got) != 0 {
		t.Fatalf("after saving none: %v, %v", got, err)
	}
	path := filepath.Join(dir, servedTemplatesFile)
	if err := os.WriteFile(path, []byte("templates: [{name: Bad}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := templatesAtStart(c, log); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "--templates") {
		t.Errorf("a damaged file: %v", err)
	}
}
