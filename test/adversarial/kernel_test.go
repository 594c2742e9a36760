package adversarial

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/client"
)

// pyPrelude is prepended to the Python attempts: libc through ctypes (the system calls
// themselves, so that the errno is the kernel's) and report, which prints the verdict line.
const pyPrelude = `import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def err():
    e = ctypes.get_errno()
    return errno.errorcode.get(e, str(e))
def report(escaped, what):
    print(("ESCAPED " if escaped else "REFUSED ") + what)
`

// kernelAttacks try to reach the host through gVisor's kernel: host files and processes,
// devices, mounts, the server's process, privileges.
func kernelAttacks(t *testing.T, s *suite) {
	g := newGroup(t, "kernel")
	ctx := g.ctx
	l := s.allocate(t, ctx)
	c := l.C

	// Host files an escape would see: one in the host's /tmp, one in the manager's state
	// directory. Neither path exists inside the sandbox.
	tag := randomTag(t)
	hostSecret := filepath.Join(os.TempDir(), "fbxadv-host-"+tag)
	stateSecret := filepath.Join(s.m.StateDir, "fbxadv-state-"+tag)
	secret := []byte("HOSTSECRET-" + tag + "\n")
	for _, p := range []string{hostSecret, stateSecret} {
		if err := os.WriteFile(p, secret, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	hostInit, err := os.ReadFile("/proc/1/cmdline")
	if err != nil {
		t.Fatal(err)
	}

	g.attack("read a host file", "cat "+hostSecret+" (the host's /tmp)", func(t *testing.T) verdict {
		return shell(t, ctx, c, "cat "+hostSecret, "No such file")
	})
	g.attack("read the manager's state", "ls and cat under the manager's state directory "+s.m.StateDir, func(t *testing.T) verdict {
		return shell(t, ctx, c, fmt.Sprintf("ls %s && cat %s", s.m.StateDir, stateSecret), "No such file")
	})
	g.attack("find host files", "find / (but /proc, /sys, /usr) for the host's files named fbxadv-*-"+tag, func(t *testing.T) verdict {
		// The control: a file of that name the sandbox makes itself is found.
		res := run(t, ctx, c, commandf(`touch /tmp/fbxadv-control-%[1]s; find / \( -path /proc -o -path /sys -o -path /usr \) -prune -o -name 'fbxadv-*-%[1]s' -print 2>/dev/null; rm /tmp/fbxadv-control-%[1]s`, tag))
		found := strings.Fields(string(res.Stdout))
		if len(found) != 1 || found[0] != "/tmp/fbxadv-control-"+tag {
			if slices.ContainsFunc(found, func(f string) bool { return strings.Contains(f, "-host-") || strings.Contains(f, "-state-") }) {
				return escapedf("found %q", found)
			}
			t.Fatalf("find: exit %d, found %q, stderr %q; want the control file only", res.ExitCode, found, res.Stderr)
		}
		return refusedf("only the sandbox's own control file is found")
	})
	usrMarker := "/usr/fbxadv-" + tag
	g.attack("write the host's /usr", "touch "+usrMarker+" (the root is the host's /usr, read-only)", func(t *testing.T) verdict {
		v := shell(t, ctx, c, "touch "+usrMarker, "Read-only file system", "Permission denied")
		if _, err := os.Lstat(usrMarker); !errors.Is(err, fs.ErrNotExist) {
			os.Remove(usrMarker)
			return escapedf("%s exists on the host (%v)", usrMarker, err)
		}
		return v
	})
	g.attack("the host's init as PID 1", "read /proc/1/cmdline and compare it with the host's init", func(t *testing.T) verdict {
		res := run(t, ctx, c, commandf("cat /proc/1/cmdline"))
		if bytes.Equal(res.Stdout, hostInit) {
			return escapedf("/proc/1/cmdline is the host's init's, %q", hostInit)
		}
		return refusedf("PID 1 is %q", bytes.ReplaceAll(res.Stdout, []byte{0}, []byte{' '}))
	})
	g.attack("host processes in /proc", "look for the test binary's process among /proc/*/cmdline", func(t *testing.T) verdict {
		self := filepath.Base(os.Args[0])
		res := run(t, ctx, c, commandf(`for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f" 2>/dev/null; echo; done`))
		if strings.Contains(string(res.Stdout), self) {
			return escapedf("a process named %s is visible", self)
		}
		if !strings.Contains(string(res.Stdout), "fusebox-sandbox") {
			t.Fatalf("the scan does not see the sandbox's own server: %q, %q", res.Stdout, res.Stderr)
		}
		return refusedf("no process of the host (%s) is visible", self)
	})
	for _, p := range []struct{ name, script string }{
		{"write /proc/sysrq-trigger", "echo h > /proc/sysrq-trigger"},
		{"write /proc/sys/kernel/hostname", "echo pwned > /proc/sys/kernel/hostname"},
		{"write /proc/sys/vm/drop_caches", "echo 3 > /proc/sys/vm/drop_caches"},
		{"read /proc/kcore", "head -c 16 /proc/kcore > /dev/null"},
		{"read /sys/firmware", "ls /sys/firmware/efi /sys/firmware/acpi/tables"},
	} {
		g.attack(p.name, p.script, func(t *testing.T) verdict {
			return shell(t, ctx, c, p.script, "No such file", "Permission denied", "Read-only file system", "Operation not permitted")
		})
	}

	g.attack("open host devices", "open /dev/sda, vda, nvme0n1, xvda, mem, kmem, port, kmsg (gVisor's own /dev/fuse and /dev/net/tun are no host devices)", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
opened, why = [], []
for d in ["/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/xvda", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg"]:
    try:
        os.close(os.open(d, os.O_RDWR))
        opened.append(d)
    except OSError as e:
        why.append(d + ": " + errno.errorcode.get(e.errno, str(e.errno)))
report(bool(opened), "opened " + ", ".join(opened) if opened else "; ".join(why))
`)
	})
	g.attack("mknod a block device", "mknod b 8 0 (the host's first disk) in /tmp", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
try:
    os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0))
    report(True, "made /tmp/sda")
except OSError as e:
    report(False, "mknod: " + errno.errorcode.get(e.errno, str(e.errno)))
`)
	})
	for _, m := range []struct{ name, args string }{
		{"mount a tmpfs", `b"none", b"/tmp", b"tmpfs", 0, None`},
		{"mount proc", `b"proc", b"/tmp", b"proc", 0, None`},
		{"bind-mount the root", `b"/", b"/workspace", None, 4096, None`}, // MS_BIND
		{"remount the root read-write", `None, b"/", None, 32, None`},    // MS_REMOUNT
	} {
		g.attack(m.name, "mount("+m.args+")", func(t *testing.T) verdict {
			return python(t, ctx, c, pyPrelude+`
r = libc.mount(`+m.args+`)
report(r == 0, "mount: " + (err() if r else "succeeded"))
`)
		})
	}
	g.attack("ptrace the server", "PTRACE_ATTACH and PTRACE_SEIZE to PID 1 (the control: attaching to an own child works)", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
import signal, time
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
ok = libc.ptrace(16, child, None, None)  # PTRACE_ATTACH
if ok != 0:
    print("control: attaching to an own child failed: " + err())
    sys.exit(1)
os.kill(child, signal.SIGKILL)
got = []
for req, name in ((16, "PTRACE_ATTACH"), (0x4206, "PTRACE_SEIZE")):
    r = libc.ptrace(req, 1, None, None)
    got.append(name + ": " + ("attached" if r == 0 else err()))
report(any(g.endswith("attached") for g in got), "; ".join(got))
`)
	})
	g.attack("read the server's memory", "process_vm_readv of PID 1, and /proc/1/mem, environ, fd", func(t *testing.T) verdict {
		v := shell(t, ctx, c, "cat /proc/1/environ || cat /proc/1/mem || ls /proc/1/fd", "Permission denied", "Operation not permitted")
		if v.outcome != refused {
			return v
		}
		return python(t, ctx, c, pyPrelude+`
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(0x400000, 64)
r = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
report(r > 0, "process_vm_readv: " + (err() if r < 0 else "read %d bytes" % r))
`)
	})
	for _, sig := range []string{"KILL", "STOP", "TERM"} {
		g.attack("signal the server with SIG"+sig, "kill -"+sig+" 1, then the server must answer", func(t *testing.T) verdict {
			v := shell(t, ctx, c, "kill -"+sig+" 1", "not permitted")
			if err := serves(ctx, l); err != nil {
				return escapedf("after kill -%s 1: %v", sig, err)
			}
			return v
		})
	}
	g.attack("become root", "setuid(0), setgid(0), chroot(/tmp)", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
got = []
for name, f in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)), ("chroot", lambda: os.chroot("/tmp"))):
    try:
        f()
        got.append(name + ": succeeded")
    except OSError as e:
        got.append(name + ": " + errno.errorcode.get(e.errno, str(e.errno)))
report(any(g.endswith("succeeded") for g in got), "; ".join(got))
`)
	})
	g.attack("raw and packet sockets", "socket(AF_PACKET), socket(AF_INET, SOCK_RAW)", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
got = []
for name, args in (("AF_PACKET", (17, socket.SOCK_RAW, 0x0300)), ("SOCK_RAW", (socket.AF_INET, socket.SOCK_RAW, 1))):
    try:
        socket.socket(*args).close()
        got.append(name + ": opened")
    except OSError as e:
        got.append(name + ": " + errno.errorcode.get(e.errno, str(e.errno)))
report(any(g.endswith("opened") for g in got), "; ".join(got))
`)
	})
	g.attack("the bpf system call", "bpf(BPF_PROG_LOAD) with an empty program", func(t *testing.T) verdict {
		return python(t, ctx, c, pyPrelude+`
attr = ctypes.create_string_buffer(128)
r = libc.syscall(321, 5, attr, 128)  # bpf(BPF_PROG_LOAD)
report(r >= 0, "bpf: " + (err() if r < 0 else "returned %d" % r))
`)
	})

	if err := s.unharmed(ctx, l); err != nil {
		t.Errorf("after the kernel attacks: %v", err)
	}
	for _, p := range []string{hostSecret, stateSecret} {
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, secret) {
			t.Errorf("host file %s after the attacks: %q, %v", p, b, err)
		}
	}
}

// randomTag returns 12 random hex digits.
func randomTag(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// commandf is a script command, formatted.
func commandf(format string, a ...any) client.Command {
	return client.Command{Script: fmt.Sprintf(format, a...), Timeout: time.Minute}
}
