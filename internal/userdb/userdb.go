// Package userdb resolves a user as an image's USER names it ("UID[:GID]" or "NAME[:GROUP]",
// mixed forms too) to numeric ids, looking names up in a root filesystem's /etc/passwd and
// /etc/group. The host resolves a template's user in an image it unpacked; the sandbox server
// resolves its -command-user in its own root. Files are read through an os.Root, so that a
// link in an image cannot point the lookup at another file system.
package userdb

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Lookup resolves u in the root filesystem root. A user given without a group gets its
// passwd entry's group (or, for a number without an entry, the same number). Empty means
// root (0:0).
func Lookup(root *os.Root, u string) (uid, gid uint32, err error) {
	if u == "" {
		return 0, 0, nil
	}
	user, group, hasGroup := strings.Cut(u, ":")
	uid, primary, err := lookupUser(root, user)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", u, err)
	}
	if !hasGroup {
		return uid, primary, nil
	}
	if gid, err = lookupGroup(root, group); err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", u, err)
	}
	return uid, gid, nil
}

// LookupDir is Lookup in the root filesystem at dir.
func LookupDir(dir, u string) (uid, gid uint32, err error) {
	if u == "" {
		return 0, 0, nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", u, err)
	}
	defer root.Close()
	return Lookup(root, u)
}

// Home returns the home directory of uid in the root's /etc/passwd, and false if it has no
// entry with an absolute one.
func Home(root *os.Root, uid uint32) (string, bool) {
	f, ok := entry(root, "passwd", 2, strconv.FormatUint(uint64(uid), 10))
	if !ok || len(f) < 6 || !strings.HasPrefix(f[5], "/") {
		return "", false
	}
	return f[5], true
}

// lookupUser resolves a user name or number to its uid and primary gid.
func lookupUser(root *os.Root, user string) (uid, gid uint32, err error) {
	if n, err := strconv.ParseUint(user, 10, 32); err == nil {
		uid = uint32(n)
		gid = uid
		if f, ok := entry(root, "passwd", 2, user); ok && len(f) > 3 {
			if g, err := strconv.ParseUint(f[3], 10, 32); err == nil {
				gid = uint32(g)
			}
		}
		return uid, gid, nil
	}
	f, ok := entry(root, "passwd", 0, user)
	if !ok || len(f) < 4 {
		return 0, 0, fmt.Errorf("no user %q in the image's /etc/passwd", user)
	}
	u, err1 := strconv.ParseUint(f[2], 10, 32)
	g, err2 := strconv.ParseUint(f[3], 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("the image's /etc/passwd entry of %q is malformed", user)
	}
	return uint32(u), uint32(g), nil
}

// lookupGroup resolves a group name or number to its gid.
func lookupGroup(root *os.Root, group string) (uint32, error) {
	if n, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(n), nil
	}
	f, ok := entry(root, "group", 0, group)
	if !ok || len(f) < 3 {
		return 0, fmt.Errorf("no group %q in the image's /etc/group", group)
	}
	g, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("the image's /etc/group entry of %q is malformed", group)
	}
	return uint32(g), nil
}

// entry returns the fields of the first line of the root's /etc/<file> whose field col is
// value.
func entry(root *os.Root, file string, col int, value string) ([]string, bool) {
	data, err := root.ReadFile(filepath.Join("etc", file))
	if err != nil {
		return nil, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) > col && f[col] == value {
			return f, true
		}
	}
	return nil, false
}
