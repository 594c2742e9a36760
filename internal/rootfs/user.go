package rootfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// User returns the uid and gid of the image's configured user: "UID[:GID]" or
// "NAME[:GROUP]", names looked up in the root's /etc/passwd and /etc/group. A user given
// without a group gets its passwd entry's group (or its uid, if it has no entry). Empty
// means root.
func (r *Root) User() (uid, gid uint32, err error) { return r.UserOf(r.Config.User) }

// UserOf resolves user u ("UID[:GID]" or "NAME[:GROUP]") as User resolves the image's own.
func (r *Root) UserOf(u string) (uid, gid uint32, err error) {
	if u == "" {
		return 0, 0, nil
	}
	user, group, hasGroup := strings.Cut(u, ":")
	uid, primary, err := r.lookupUser(user)
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", u, err)
	}
	if !hasGroup {
		return uid, primary, nil
	}
	if gid, err = r.lookupGroup(group); err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", u, err)
	}
	return uid, gid, nil
}

// lookupUser resolves a user name or number to its uid and primary gid.
func (r *Root) lookupUser(user string) (uid, gid uint32, err error) {
	if n, err := strconv.ParseUint(user, 10, 32); err == nil {
		uid = uint32(n)
		gid = uid
		if f, ok := r.entry("passwd", 2, user); ok && len(f) > 3 {
			if g, err := strconv.ParseUint(f[3], 10, 32); err == nil {
				gid = uint32(g)
			}
		}
		return uid, gid, nil
	}
	f, ok := r.entry("passwd", 0, user)
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
func (r *Root) lookupGroup(group string) (uint32, error) {
	if n, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(n), nil
	}
	f, ok := r.entry("group", 0, group)
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
// value. The file is read through an os.Root, so a link in the image cannot point it at
// the host's.
func (r *Root) entry(file string, col int, value string) ([]string, bool) {
	root, err := os.OpenRoot(r.Dir)
	if err != nil {
		return nil, false
	}
	defer root.Close()
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
