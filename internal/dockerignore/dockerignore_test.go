package dockerignore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExcluded: patterns as Docker's builder reads them: comments, cleaning, *, ?, classes,
// **, directories excluding what is under them, and ! re-including with the last match
// deciding.
func TestExcluded(t *testing.T) {
	m, err := Parse([]byte(`
# build outputs
/build
*.log
**/__pycache__
docs/**/*.tmp
secret?.txt
[ab].cfg
node_modules
!node_modules/keep.js
  ./notes/../private  
*.md
!README.md
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{"build", true}, {"build/out/a.o", true}, {"src/build", false},
		{"app.log", true}, {"sub/app.log", false},
		{"__pycache__/x.pyc", true}, {"a/b/__pycache__/x.pyc", true}, {"a/pycache", false},
		{"docs/x.tmp", true}, {"docs/a/b/x.tmp", true}, {"docs/x.txt", false},
		{"secret1.txt", true}, {"secret12.txt", false},
		{"a.cfg", true}, {"c.cfg", false},
		{"node_modules/lib/x.js", true}, {"node_modules/keep.js", false},
		{"private/key", true},
		{"guide.md", true}, {"README.md", false},
		{"src/main.go", false}, {"Dockerfile", false},
	} {
		if got := m.Excluded(c.path); got != c.want {
			t.Errorf("Excluded(%q) = %v, want %v", c.path, got, c.want)
		}
	}
	if !m.Exceptions() {
		t.Error("Exceptions() = false with ! patterns")
	}
	var none *Matcher
	if none.Excluded("anything") || none.Exceptions() {
		t.Error("the nil Matcher leaves something out")
	}
}

// TestRead: no file, no matcher; a pattern that cannot compile names its line.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	if m, err := Read(dir); m != nil || err != nil {
		t.Fatalf("Read without a file = %v, %v", m, err)
	}
	os.WriteFile(filepath.Join(dir, File), []byte("ok\n[z-a]\n"), 0o644)
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), ".dockerignore:2") {
		t.Errorf("a bad pattern: %v, want its line named", err)
	}
}
