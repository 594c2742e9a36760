package runsc_test

import (
	"errors"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

func TestID(t *testing.T) {
	tests := []struct {
		prefix string
		n      uint64
		want   string
	}{
		{"fbx", 42, "fbx-000000000042"},
		{"fbx", 0, "fbx-000000000000"},
		{"pool1", runsc.MaxIDNumber, "pool1-999999999999"},
	}
	for _, tt := range tests {
		got := runsc.ID(tt.prefix, tt.n)
		if got != tt.want {
			t.Errorf("ID(%q, %d) = %q, want %q", tt.prefix, tt.n, got, tt.want)
		}
		if !runsc.ValidID(got) {
			t.Errorf("ValidID(%q) = false for an id ID made", got)
		}
	}
	// Out of range input yields ids that every call refuses, not a panic.
	for _, id := range []string{runsc.ID("fbx", runsc.MaxIDNumber+1), runsc.ID("Fbx", 1), runsc.ID("", 1)} {
		if runsc.ValidID(id) {
			t.Errorf("ValidID(%q) = true", id)
		}
	}
}

func TestValidID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{"fbx-000000000042", true},
		{"a-000000000000", true},
		{"a1b2c3d4e5f6g7h8-123456789012", true},
		{"", false},
		{"fbx-42", false},                         // not fixed width: a prefix of fbx-420
		{"fbx-0000000000042", false},              // 13 digits
		{"fbx-00000000004a", false},               // not digits
		{"-000000000042", false},                  // empty prefix
		{"1fbx-000000000042", false},              // prefix starts with a digit
		{"fb-x-000000000042", false},              // dash in prefix
		{"FBX-000000000042", false},               // upper case
		{"fbx_000000000042", false},               // wrong separator
		{"a1b2c3d4e5f6g7h8i-123456789012", false}, // prefix too long
		{"../x-000000000042", false},              // path characters
		{"fbx-000000000042\n", false},             // trailing newline
		{"fbx-000000000042 fbx-000000000043", false},
	}
	for _, tt := range tests {
		if got := runsc.ValidID(tt.id); got != tt.want {
			t.Errorf("ValidID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}

func TestInvalidIDRefused(t *testing.T) {
	// The binary does not exist: an invalid id must be refused before
	// anything is run.
	rt := &runsc.Runtime{Binary: "/nonexistent/runsc", Root: t.TempDir()}
	ctx := t.Context()
	const bad = "fbx-1"
	checks := map[string]error{
		"Create": rt.Create(ctx, bad, t.TempDir()),
		"Start":  rt.Start(ctx, bad),
		"Kill":   rt.Kill(ctx, bad, 9, true),
		"Delete": rt.Delete(ctx, bad, true),
	}
	_, checks["State"] = rt.State(ctx, bad)
	_, checks["Exec"] = rt.Exec(ctx, bad, []string{"true"}, nil, nil)
	for name, err := range checks {
		if !errors.Is(err, runsc.ErrInvalidID) {
			t.Errorf("%s(%q) = %v, want ErrInvalidID", name, bad, err)
		}
	}
}
