package processalloc

import (
	"errors"
	"testing"
)

func TestRefusesWithoutInsecureFlag(t *testing.T) {
	if _, err := New(Options{StateDir: t.TempDir(), SandboxBinary: "/bin/true"}); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("New without Insecure = %v, want ErrNotAllowed", err)
	}
	a, err := New(Options{Insecure: true, StateDir: t.TempDir(), SandboxBinary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	// No isolation, declared: the manager then warns on every allocation that nothing,
	// egress included, is enforced.
	if c := a.Capabilities(); !c.NoIsolation || c.Egress {
		t.Fatalf("capabilities %+v, want NoIsolation and no egress", c)
	}
}
