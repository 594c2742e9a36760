package runscalloc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Grants: a sandbox's data socket lives in its unit's directory, which only root may enter,
// so a local user other than the manager's who allocates it (through a socket a group
// shares, --listen-group) could not reach it. GrantEndpoint gives that user a name of its
// own for the socket: a hard link in StateDir/agents (searchable, not listable), owned by the
// user with mode 0600, so that the user's processes and the manager's alone may connect. The
// pinned key still decides who may talk on the connection; the link only lets the caller
// reach the socket. The unit's directory, its other sockets (init, egress) and files stay
// root's. Destroy removes the link with the unit.

// grantsDir is the directory of the granted links, in the state directory.
const grantsDir = "agents"

// grantDirs makes the state directory searchable by every user (mode 0711: the names in it
// are not listable, and every entry but grantsDir stays 0700) and creates grantsDir so.
func grantDirs(stateDir string) error {
	if err := os.Chmod(stateDir, 0o711); err != nil {
		return fmt.Errorf("opening the state directory to granted users: %w", err)
	}
	d := filepath.Join(stateDir, grantsDir)
	if err := os.MkdirAll(d, 0o711); err != nil {
		return fmt.Errorf("creating %s: %w", d, err)
	}
	if err := os.Chmod(d, 0o711); err != nil { // undo the umask
		return fmt.Errorf("creating %s: %w", d, err)
	}
	return nil
}

func (a *Allocator) grantPath(id string) string {
	return filepath.Join(a.o.StateDir, grantsDir, id+".sock")
}

// GrantEndpoint returns, for a local caller other than the manager's user, the address of a
// name of unit id's data socket that this caller alone may use (see above); "" for a caller
// that is not local ("uid:N"), is the manager's user, or when Options.GrantEndpoints is off.
func (a *Allocator) GrantEndpoint(id, owner string) (string, error) {
	n, ok := strings.CutPrefix(owner, "uid:")
	if !ok || !a.o.GrantEndpoints {
		return "", nil
	}
	uid, err := strconv.ParseUint(n, 10, 32)
	if err != nil {
		return "", fmt.Errorf("owner %q: %w", owner, err)
	}
	if int(uid) == os.Geteuid() {
		return "", nil
	}
	link := a.grantPath(id)
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := os.Link(a.socket(id, "data.sock"), link); err != nil {
		return "", fmt.Errorf("linking the data socket: %w", err)
	}
	// The link and the socket are one inode: the unit's own name stays out of the user's
	// reach by its directory.
	if err := os.Lchown(link, int(uid), -1); err != nil {
		os.Remove(link)
		return "", err
	}
	if err := os.Chmod(link, 0o600); err != nil {
		os.Remove(link)
		return "", err
	}
	return "unix://" + link, nil
}
