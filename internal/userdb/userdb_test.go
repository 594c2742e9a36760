package userdb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/bash\nnonroot:x:65532:65532::/home/nonroot:/bin/sh\napp:x:1000:100::/:/bin/sh\nbroken:x:abc:1::/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\nusers:x:100:\nstaff:x:50:\n"), 0o644)
	cases := []struct {
		user     string
		uid, gid uint32
		err      string
	}{
		{user: "", uid: 0, gid: 0},
		{user: "65532:65532", uid: 65532, gid: 65532},
		{user: "65532", uid: 65532, gid: 65532},
		{user: "1000", uid: 1000, gid: 100},
		{user: "4242", uid: 4242, gid: 4242},
		{user: "nonroot", uid: 65532, gid: 65532},
		{user: "app:staff", uid: 1000, gid: 50},
		{user: "app:7", uid: 1000, gid: 7},
		{user: "ghost", err: `no user "ghost"`},
		{user: "app:ghosts", err: `no group "ghosts"`},
		{user: "broken", err: `entry of "broken" is malformed`},
	}
	for _, tc := range cases {
		uid, gid, err := LookupDir(dir, tc.user)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Lookup %q: %v, want %q", tc.user, err, tc.err)
			}
			continue
		}
		if err != nil || uid != tc.uid || gid != tc.gid {
			t.Errorf("Lookup %q = %d:%d, %v; want %d:%d", tc.user, uid, gid, err, tc.uid, tc.gid)
		}
	}
}

func TestHome(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("app:x:1000:100::/home/app:/bin/sh\nodd:x:1001:100::relative:/bin/sh\n"), 0o644)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for uid, want := range map[uint32]string{1000: "/home/app", 1001: "", 4242: ""} {
		if got, ok := Home(root, uid); got != want || ok != (want != "") {
			t.Errorf("Home(%d) = %q, %v; want %q", uid, got, ok, want)
		}
	}
}

// An image's /etc/passwd that links out of its root is not followed: the name is unknown.
func TestLookupStaysInTheRoot(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "passwd"), []byte("app:x:1000:1000::/:/bin/sh\n"), 0o644)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	if err := os.Symlink(filepath.Join(outside, "passwd"), filepath.Join(dir, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LookupDir(dir, "app"); err == nil || !strings.Contains(err.Error(), `no user "app"`) {
		t.Fatalf("Lookup through a link out of the root: %v, want no such user", err)
	}
}
