package endpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in, network, address, target string
	}{
		{"unix:///run/fusebox/data.sock", "unix", "/run/fusebox/data.sock", "unix:///run/fusebox/data.sock"},
		{"unix:///a/../b.sock", "unix", "/b.sock", "unix:///b.sock"},
		{"tcp://127.0.0.1:7000", "tcp", "127.0.0.1:7000", "passthrough:///127.0.0.1:7000"},
		{"tcp://[::1]:7000", "tcp", "[::1]:7000", "passthrough:///[::1]:7000"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			a, err := Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if a.Network != tc.network || a.Address != tc.address || a.GRPCTarget() != tc.target {
				t.Fatalf("Parse(%q) = %+v target %q", tc.in, a, a.GRPCTarget())
			}
		})
	}
	for _, bad := range []string{"", "/run/x.sock", "unix://rel.sock", "tcp://nohost", "http://x:1", "unix:///a\x00b"} {
		if _, err := Parse(bad); !errors.Is(err, ErrBadAddress) {
			t.Errorf("Parse(%q) = %v, want ErrBadAddress", bad, err)
		}
	}
}

func TestListenUnixReplacesOnlySockets(t *testing.T) {
	dir := t.TempDir()
	a := Addr{Network: "unix", Address: filepath.Join(dir, "s.sock")}
	ln, err := Listen(a)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(a.Address)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	// A live socket is not taken over.
	if _, err := Listen(a); !errors.Is(err, ErrInUse) {
		t.Fatalf("Listen over a live socket = %v, want ErrInUse", err)
	}
	// A stale socket (listener gone, file left) is replaced.
	ln.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	ln.Close()
	ln, err = Listen(a)
	if err != nil {
		t.Fatalf("relisten over stale socket: %v", err)
	}
	ln.Close()

	regular := Addr{Network: "unix", Address: filepath.Join(dir, "file")}
	os.WriteFile(regular.Address, []byte("keep"), 0o644)
	if _, err := Listen(regular); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(regular.Address); string(b) != "keep" {
		t.Fatal("regular file changed")
	}
}
