// Package golden compares what a test produced with a file under testdata, so that a change
// to a rendered object, a message or a help text fails the test. Set $UPDATE_GOLDEN to write
// the files instead (`UPDATE_GOLDEN=1 go test ./...`), then review their diff.
package golden

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// UpdateEnv names the environment variable that makes File and JSON rewrite their files.
const UpdateEnv = "UPDATE_GOLDEN"

// JSON compares v, as indented JSON with a final newline, with the file at path.
func JSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	File(t, path, append(b, '\n'))
}

// File compares got with the file at path (rewritten instead when $UPDATE_GOLDEN is set).
func File(t testing.TB, path string, got []byte) {
	t.Helper()
	if os.Getenv(UpdateEnv) != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with %s=1 to write it)", err, UpdateEnv)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the test produced: %s", path, firstDiff(string(want), string(got)))
	}
}

// firstDiff describes the first line where want and got differ.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n  want: " + truncate(wl) + "\n  got:  " + truncate(gl)
		}
	}
	return "(no line differs)"
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
