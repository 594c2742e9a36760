package rootfs

import "github.com/fusebox-dev/fusebox/internal/userdb"

// User returns the uid and gid of the image's configured user: "UID[:GID]" or
// "NAME[:GROUP]", names looked up in the root's /etc/passwd and /etc/group (userdb.Lookup).
// Empty means root.
func (r *Root) User() (uid, gid uint32, err error) { return r.UserOf(r.Config.User) }

// UserOf resolves user u ("UID[:GID]" or "NAME[:GROUP]") as User resolves the image's own.
func (r *Root) UserOf(u string) (uid, gid uint32, err error) { return userdb.LookupDir(r.Dir, u) }
