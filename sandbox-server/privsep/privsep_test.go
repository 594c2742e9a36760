package privsep

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The test runs the separated server in a child process (Become changes every thread of the
// process for good), on the host's kernel, whose rules gVisor follows here; test/dataplane
// checks the same under gVisor.
const childEnv = "FUSEBOX_PRIVSEP_TEST_DIR"

var user = User{UID: 65532, GID: 65532}

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		if err := child(dir); err != nil {
			os.Stderr.WriteString("privsep child: " + err.Error() + "\n")
			if errors.Is(err, syscall.ENOTSUP) {
				os.Exit(3) // a cgo build (-race): AllThreadsSyscall is unavailable
			}
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestBecomeSeparatesServerFromCommands(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	// Not t.TempDir: its parent is private to root, and the child works as another user.
	dir, err := os.MkdirTemp("", "privsep-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"rootonly", "work"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(dir, "work"), int(user.UID), int(user.GID)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		t.Skipf("this test binary uses cgo (-race), so Become cannot set every thread's capabilities; the sandbox server is built without cgo: %s", out)
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// child is the separated server: it checks its own ids and capabilities, that a command it
// starts as the command user cannot signal it, that its files are the command user's, and
// that AsRoot writes where only root may, on its thread alone.
func child(dir string) error {
	if err := Become(user); err != nil {
		return err
	}
	r, e, s := unix.Getresuid()
	if r != 0 || e != int(user.UID) || s != 0 {
		return errors.New("user ids after Become: " + strconv.Itoa(r) + " " + strconv.Itoa(e) + " " + strconv.Itoa(s))
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	// CAP_SETUID and CAP_SETGID, and CAP_SYS_RESOURCE where the host grants it.
	if !strings.Contains(string(status), "CapEff:\t00000000010000c0") && !strings.Contains(string(status), "CapEff:\t00000000000000c0") ||
		!strings.Contains(string(status), "CapPrm:\t00000000010000c0") && !strings.Contains(string(status), "CapPrm:\t00000000000000c0") {
		return errors.New("capabilities after Become:\n" + string(status))
	}
	// A command as the command user, the way procs starts one: it may not signal us.
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "id -u; id -G; kill -0 " + strconv.Itoa(os.Getpid()) + " && echo SIGNALLED"},
		&syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}, Files: []uintptr{0, 1, 2},
			Sys: &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: user.UID, Gid: user.GID, Groups: []uint32{}}}})
	if err != nil {
		return err
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	if ws.ExitStatus() == 0 {
		return errors.New("the command signalled the server")
	}
	// The server's own files are the command user's, and it cannot write where only root may.
	if err := os.WriteFile(filepath.Join(dir, "work", "f"), nil, 0o644); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "work", "f"), &st); err != nil || st.Uid != user.UID || st.Gid != user.GID {
		return errors.New("the server's file is not the command user's")
	}
	root := filepath.Join(dir, "rootonly", "s")
	if err := os.WriteFile(root, nil, 0o600); !errors.Is(err, os.ErrPermission) {
		return errors.New("writing into root's directory without AsRoot: " + errString(err))
	}
	if err := AsRoot(func() error { return os.WriteFile(root, nil, 0o600) }); err != nil {
		return err
	}
	if syscall.Geteuid() != int(user.UID) {
		return errors.New("AsRoot left the thread root")
	}
	if err := os.Remove(root); !errors.Is(err, os.ErrPermission) {
		return errors.New("removing from root's directory after AsRoot: " + errString(err))
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
