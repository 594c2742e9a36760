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
// CAP_SETUID and CAP_SETGID (required) so that each new command can switch to that user (and
// lose them), and CAP_SYS_RESOURCE if the process holds it, which exempts the server's own
// threads and commands from the commands' process limit (RLIMIT_NPROC: gVisor never refuses
// a clone to a holder). Every other capability is dropped from the effective and permitted
// sets for good.
var Kept = []uintptr{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_SYS_RESOURCE}

// required are the capabilities of Kept that Become cannot do without.
var required = []uintptr{unix.CAP_SETUID, unix.CAP_SETGID}

// kept is Kept as a bit set, less what the process did not hold when Become ran.
var kept [2]uint32

// User is the command user.
type User struct {
	UID, GID uint32
}

// mu serialises Become calls.
var mu sync.Mutex

// Become makes this process, which must be root with CAP_SETUID and CAP_SETGID, work as u: no
// supplementary groups, group ids (0, u.GID, 0), user ids (0, u.UID, 0), and what it holds of
// Kept as its effective and permitted capabilities. It applies to every thread (Go's
// AllThreadsSyscall: the binary must be built without cgo). u must not be root.
func Become(u User) error {
	if u.UID == 0 {
		return errors.New("privsep: the command user must not be root")
	}
	mu.Lock()
	defer mu.Unlock()
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var have [2]unix.CapUserData
	if err := unix.Capget(hdr, &have[0]); err != nil {
		return fmt.Errorf("privsep: reading capabilities: %w", err)
	}
	kept = [2]uint32{}
	for _, c := range Kept {
		if have[c/32].Permitted&(1<<(c%32)) != 0 {
			kept[c/32] |= 1 << (c % 32)
		}
	}
	for _, c := range required {
		if kept[c/32]&(1<<(c%32)) == 0 {
			return fmt.Errorf("privsep: the server needs CAP_SETUID and CAP_SETGID to run commands as another user (permitted: %#x %#x)", have[0].Permitted, have[1].Permitted)
		}
	}
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

// AsRoot runs f on a thread of its own whose effective user is root, for example to bind or
// unlink a socket in a directory only root may write; every other thread keeps working as the
// command user meanwhile (credentials are per thread in the kernel; this is the only code
// that makes them differ). f must do its work on the calling goroutine and start nothing: no
// goroutine, no command. In a process that never called Become it just runs f.
func AsRoot(f func() error) (err error) {
	runtime.LockOSThread()
	euid := syscall.Geteuid()
	if euid == 0 {
		defer runtime.UnlockOSThread()
		return f()
	}
	if _, _, e := syscall.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
		runtime.UnlockOSThread()
		return fmt.Errorf("privsep: becoming root on this thread: %w", e)
	}
	defer func() {
		// Back to the command user and its capabilities, or this thread must never run
		// anything again: a goroutine that ends while locked to its thread ends the thread,
		// and the panic ends the process.
		if _, _, e := syscall.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(euid), ^uintptr(0)); e != 0 {
			panic(fmt.Sprintf("privsep: returning this thread to user %d: %v", euid, e))
		}
		if e := capset(unix.SYS_CAPSET, false); e != nil {
			panic(e.Error())
		}
		runtime.UnlockOSThread()
	}()
	return f()
}

// setCaps sets the effective and permitted capabilities of every thread to kept, and the
// inheritable set to none.
func setCaps() error { return capset(unix.SYS_CAPSET, true) }

// capset sets the calling thread's (or, with all, every thread's) effective and permitted
// capabilities to kept, and the inheritable set to none.
func capset(trap uintptr, all bool) error {
	// On the heap, which does not move: AllThreadsSyscall does not keep its arguments alive
	// the way syscall.Syscall does.
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := new([2]unix.CapUserData)
	for i := range data {
		data[i].Effective, data[i].Permitted = kept[i], kept[i]
	}
	var e syscall.Errno
	if all {
		_, _, e = syscall.AllThreadsSyscall(trap, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(data)), 0)
	} else {
		_, _, e = syscall.RawSyscall(trap, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(data)), 0)
	}
	runtime.KeepAlive(hdr)
	runtime.KeepAlive(data)
	if e == syscall.ENOTSUP && all {
		return fmt.Errorf("privsep: setting every thread's capabilities needs a binary built without cgo (CGO_ENABLED=0): %w", e)
	}
	if e != 0 {
		return fmt.Errorf("privsep: setting capabilities: %w", e)
	}
	return nil
}
