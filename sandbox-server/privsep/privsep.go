// Package privsep separates the sandbox server from the commands it runs, inside one
// sandbox. The server starts as root and becomes the command user in all but name: its
// effective user and group are the command user's (so the files it writes in the workspace
// are theirs, and file modes bind it as they bind them), while its real and saved user ids
// stay root. Commands run as the command user through and through, without capabilities.
//
// The kernel (gVisor's, which follows Linux here) then refuses a command that signals the
// server (kill(2) compares the sender's real and effective user with the target's real and
// saved user), traces it or reads its memory (ptrace needs all of the target's ids to match),
// and lets it write nothing where only root may: the server binds its sockets as root (AsRoot)
// in a root-owned directory.
package privsep

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kept is the capability set the server keeps while it works as the command user:
// CAP_SETUID and CAP_SETGID so that each new command can switch to that user (and lose
// them), and CAP_SYS_RESOURCE, which exempts the server's own threads and commands from the
// commands' process limit (RLIMIT_NPROC: gVisor never refuses a clone to a holder). Every
// other capability is dropped from the effective and permitted sets for good.
var Kept = []uintptr{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_SYS_RESOURCE}

// User is the command user.
type User struct {
	UID, GID uint32
}

// mu serialises Become and AsRoot: both change the ids of every thread.
var mu sync.Mutex

// Become makes this process, which must be root with the capabilities in Kept, work as u:
// no supplementary groups, group ids (0, u.GID, 0), user ids (0, u.UID, 0), and Kept as its
// effective and permitted capabilities. It applies to every thread (Go's AllThreadsSyscall:
// the binary must be built without cgo). u must not be root.
func Become(u User) error {
	if u.UID == 0 {
		return errors.New("privsep: the command user must not be root")
	}
	mu.Lock()
	defer mu.Unlock()
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("privsep: dropping supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(0, int(u.GID), 0); err != nil {
		return fmt.Errorf("privsep: setting group ids (0, %d, 0): %w", u.GID, err)
	}
	if err := syscall.Setresuid(0, int(u.UID), 0); err != nil {
		return fmt.Errorf("privsep: setting user ids (0, %d, 0): %w", u.UID, err)
	}
	// Leaving effective uid 0 cleared the effective set; permitted still holds what the
	// process started with. Keep only Kept, and make it effective again.
	return setCaps()
}

// AsRoot runs f with effective user 0 (a process that called Become; f must be short and
// must not start commands), for example to bind a socket in a directory only root may write,
// and then works as the command user again. Every thread is root while f runs.
func AsRoot(f func() error) error {
	mu.Lock()
	defer mu.Unlock()
	euid := syscall.Geteuid()
	if euid == 0 {
		return f()
	}
	if err := syscall.Setresuid(-1, 0, -1); err != nil {
		return fmt.Errorf("privsep: becoming root: %w", err)
	}
	ferr := f()
	if err := syscall.Setresuid(-1, euid, -1); err != nil {
		// The process cannot be left root with commands to run: nothing safe remains.
		panic(fmt.Sprintf("privsep: returning to user %d: %v", euid, err))
	}
	if err := setCaps(); err != nil {
		panic(err.Error())
	}
	return ferr
}

// setCaps sets the effective and permitted capabilities of every thread to Kept, and the
// inheritable set to none.
func setCaps() error {
	// On the heap, which does not move: AllThreadsSyscall does not keep its arguments alive
	// the way syscall.Syscall does.
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := new([2]unix.CapUserData)
	for _, c := range Kept {
		data[c/32].Effective |= 1 << (c % 32)
		data[c/32].Permitted |= 1 << (c % 32)
	}
	_, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(data)), 0)
	runtime.KeepAlive(hdr)
	runtime.KeepAlive(data)
	if e != 0 {
		return fmt.Errorf("privsep: setting capabilities: %w", e)
	}
	return nil
}
