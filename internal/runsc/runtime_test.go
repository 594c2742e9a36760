package runsc_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-dev/fusebox/internal/runsc"
)

// fakeRunsc is a stand-in for runsc that appends its argv to the file
// named in its first line's LOG and answers like runsc does: "missing-..."
// ids do not exist, "broken-..." ids fail to create.
const fakeRunsc = `#!/bin/sh
echo "$*" >> LOG
for a in "$@"; do
	case "$a" in
	missing-*)
		echo "FetchSpec failed: loading container: file does not exist" >&2
		case "$*" in *--log-fd=3*) printf '{"msg":"loading container: file does not exist","level":"error"}' >&3 ;; esac
		exit 128 ;;
	broken-*)
		printf '{"msg":"creating container: boom","level":"error"}' >&3
		exit 128 ;;
	esac
done
case "$*" in
*" list "*) echo null ;;
*" state "*) echo '{"ociVersion":"1.0.0","id":"fbx-000000000001","status":"running","pid":1234,"bundle":"/b"}' ;;
*" exec "*) echo out; echo err >&2; exit 3 ;;
esac
exit 0
`

// newFake returns a Runtime whose binary is fakeRunsc, and the log file of
// its invocations.
func newFake(t *testing.T, rt runsc.Runtime) (*runsc.Runtime, string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	bin := filepath.Join(dir, "runsc")
	if err := os.WriteFile(bin, []byte(strings.Replace(fakeRunsc, "LOG", log, 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	rt.Binary = bin
	rt.Root = filepath.Join(dir, "root")
	return &rt, log
}

func TestGlobalFlagsOnEveryCall(t *testing.T) {
	tests := []struct {
		name string
		rt   runsc.Runtime
		want []string // after --root
	}{
		{"defaults", runsc.Runtime{}, []string{"--network=none", "--host-uds=all", "--platform=systrap"}},
		{"explicit", runsc.Runtime{Network: "sandbox", HostUDS: "create", Platform: "ptrace", ExtraFlags: []string{"--overlay2=none"}},
			[]string{"--network=sandbox", "--host-uds=create", "--platform=ptrace", "--overlay2=none"}},
		{"debug", runsc.Runtime{Debug: true}, []string{"--network=none", "--host-uds=all", "--platform=systrap", "--debug", "--debug-log=ROOT/logs/"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, log := newFake(t, tt.rt)
			want := strings.Join(append([]string{"--root=" + rt.Root}, tt.want...), " ")
			want = strings.ReplaceAll(want, "ROOT", rt.Root)
			ctx := t.Context()
			const id = "fbx-000000000001"
			rt.Start(ctx, id)
			rt.Kill(ctx, id, 15, false)
			rt.Delete(ctx, id, false)
			rt.State(ctx, id)
			rt.List(ctx)
			rt.Exec(ctx, id, []string{"true"}, nil, nil)
			if tt.rt.Network != "sandbox" {
				rt.Create(ctx, id, t.TempDir())
			}
			data, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			if len(lines) < 6 {
				t.Fatalf("runsc ran %d times, want at least 6:\n%s", len(lines), data)
			}
			for _, l := range lines {
				if !strings.HasPrefix(l, want+" ") {
					t.Errorf("call %q\ndoes not start with the global flags %q", l, want)
				}
			}
		})
	}
}

func TestCommands(t *testing.T) {
	rt, log := newFake(t, runsc.Runtime{})
	ctx := t.Context()
	const id = "fbx-000000000001"

	st, err := rt.State(ctx, id)
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	if st.ID != id || st.Status != runsc.StatusRunning || st.Pid != 1234 || st.Bundle != "/b" {
		t.Errorf("State = %+v", st)
	}
	states, err := rt.List(ctx)
	if err != nil || len(states) != 0 {
		t.Errorf("List = %v, %v; want no states", states, err)
	}
	var out, errOut bytes.Buffer
	code, err := rt.Exec(ctx, id, []string{"sh", "-c", "exit 3"}, &out, &errOut)
	if err != nil || code != 3 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Errorf("Exec = %d, %v, stdout %q, stderr %q; want 3, nil, out, err", code, err, out.String(), errOut.String())
	}
	if err := rt.Kill(ctx, id, 9, true); err != nil {
		t.Errorf("Kill: %v", err)
	}
	if err := rt.Delete(ctx, id, true); err != nil {
		t.Errorf("Delete: %v", err)
	}
	data, _ := os.ReadFile(log)
	for _, want := range []string{
		" state " + id + "\n",
		" list --format=json\n",
		" exec " + id + " sh -c exit 3\n",
		" kill --all " + id + " 9\n",
		" delete --force " + id + "\n",
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("no call ending in %q in:\n%s", want, data)
		}
	}
}

func TestNotFound(t *testing.T) {
	rt, _ := newFake(t, runsc.Runtime{})
	ctx := t.Context()
	const id = "missing-000000000001"
	if _, err := rt.State(ctx, id); !errors.Is(err, runsc.ErrNotFound) {
		t.Errorf("State = %v, want ErrNotFound", err)
	}
	if err := rt.Start(ctx, id); !errors.Is(err, runsc.ErrNotFound) {
		t.Errorf("Start = %v, want ErrNotFound", err)
	}
	if err := rt.Kill(ctx, id, 9, false); !errors.Is(err, runsc.ErrNotFound) {
		t.Errorf("Kill = %v, want ErrNotFound", err)
	}
	if _, err := rt.Exec(ctx, id, []string{"true"}, nil, nil); !errors.Is(err, runsc.ErrNotFound) {
		t.Errorf("Exec = %v, want ErrNotFound", err)
	}
	for _, force := range []bool{false, true} {
		if err := rt.Delete(ctx, id, force); err != nil {
			t.Errorf("Delete(force=%v) of a missing container = %v, want nil", force, err)
		}
	}
}

func TestCreateErrorFromLogFD(t *testing.T) {
	rt, _ := newFake(t, runsc.Runtime{})
	err := rt.Create(t.Context(), "broken-000000000001", t.TempDir())
	var ce *runsc.CommandError
	if !errors.As(err, &ce) || ce.ExitCode != 128 || ce.Message != "creating container: boom" {
		t.Fatalf("Create = %#v, want a CommandError with runsc's message", err)
	}
	if errors.Is(err, runsc.ErrNotFound) {
		t.Errorf("Create error %v is ErrNotFound", err)
	}
}

func TestRuntimeRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name string
		rt   runsc.Runtime
		want string
	}{
		{"no binary", runsc.Runtime{Root: "/r"}, "Binary is required"},
		{"no root", runsc.Runtime{Binary: "/x"}, "Root must be an absolute path"},
		{"relative root", runsc.Runtime{Binary: "/x", Root: "r"}, "Root must be an absolute path"},
		{"host network", runsc.Runtime{Binary: "/x", Root: "/r", Network: "host"}, "is refused"},
		{"unknown network", runsc.Runtime{Binary: "/x", Root: "/r", Network: "bridge"}, "unknown Runtime.Network"},
		{"unknown host-uds", runsc.Runtime{Binary: "/x", Root: "/r", HostUDS: "yes"}, "unknown Runtime.HostUDS"},
		{"extra flag overrides network", runsc.Runtime{Binary: "/x", Root: "/r", ExtraFlags: []string{"--network=host"}}, "must not set --network"},
		{"extra flag overrides root", runsc.Runtime{Binary: "/x", Root: "/r", ExtraFlags: []string{"-root", "/other"}}, "must not set --root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.rt.List(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("List = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestCreateSandboxNetworkNeedsNetNS(t *testing.T) {
	rt, log := newFake(t, runsc.Runtime{Network: "sandbox"})
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir, RootFS: t.TempDir(), Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	err := rt.Create(t.Context(), "fbx-000000000001", dir)
	if err == nil || !strings.Contains(err.Error(), "NetNSPath") {
		t.Fatalf("Create = %v, want a refusal naming NetNSPath", err)
	}
	if _, err := os.Stat(log); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runsc was run (log: %v)", err)
	}

	dir2 := filepath.Join(t.TempDir(), "bundle")
	if err := runsc.WriteBundle(runsc.BundleSpec{Dir: dir2, RootFS: t.TempDir(), Args: []string{"true"}, NetNSPath: "/var/run/netns/x"}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Create(t.Context(), "fbx-000000000001", dir2); err != nil {
		t.Errorf("Create with a network namespace = %v", err)
	}
}
