package endpoint

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
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

func TestDialRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "manager.sock") // a socket the dialer must never reach
	ln, err := net.Listen("unix", target)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	link := filepath.Join(dir, "data.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	relLink := filepath.Join(dir, "rel.sock")
	if err := os.Symlink("manager.sock", relLink); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory whose path exceeds sun_path (108 bytes) still works: the connect goes
	// through /proc/self/fd.
	long := filepath.Join(dir, strings.Repeat("d", 120))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	longLink := filepath.Join(long, "data.sock")
	if err := os.Symlink(target, longLink); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	for _, tc := range []struct {
		name, path string
		want       error // nil: connects
	}{
		{"socket", target, nil},
		{"absolute link", link, ErrNotSocket},
		{"relative link", relLink, ErrNotSocket},
		{"link in a long path", longLink, ErrNotSocket},
		{"regular file", file, ErrNotSocket},
		{"missing", filepath.Join(dir, "none.sock"), os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DialUnix(ctx, tc.path)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("DialUnix: %v", err)
				}
				defer c.Close()
				if n, err := c.Read(make([]byte, 1)); n != 1 {
					t.Fatalf("read from the socket: %d, %v", n, err)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatalf("DialUnix(%s) connected; want %v", tc.path, tc.want)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("DialUnix(%s) = %v, want %v", tc.path, err, tc.want)
			}
		})
	}
	// The same through an Addr, as gRPC's context dialer.
	a, _ := Parse("unix://" + link)
	if c, err := a.DialContext(ctx, "ignored"); err == nil {
		c.Close()
		t.Fatal("Addr.DialContext followed a link")
	}
}

func TestDialLongSocketPath(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	// Bind through a short name of the same directory (bind has the sun_path limit).
	short := filepath.Join(t.TempDir(), "l")
	if err := os.Symlink(long, short); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(short, "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := DialUnix(context.Background(), filepath.Join(long, "s.sock"))
	if err != nil {
		t.Fatalf("dialing a socket whose path is %d bytes: %v", len(long)+7, err)
	}
	c.Close()
}
