package imagebuild

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-dev/fusebox/internal/image"
	"github.com/fusebox-dev/fusebox/internal/rootfs"
	"github.com/fusebox-dev/fusebox/test/procstat"
	"github.com/fusebox-dev/fusebox/test/testenv"
)

// The installer's contract with its DaemonSet (components/gvisor): the startup taint it
// removes and the label it sets.
const (
	startupTaint = "fusebox.dev/gvisor-not-ready"
	readyLabel   = "fusebox.dev/gvisor"
	nodeName     = "node-1"
	saToken      = "installer-token"
)

// nodeAPI is the part of the Kubernetes API the installer uses: GET and PATCH (JSON patch
// with test ops, merge patch of labels) of one node, with the service account's token.
type nodeAPI struct {
	mu       sync.Mutex
	taints   []map[string]string
	labels   map[string]string
	requests []string
}

func (a *nodeAPI) node() map[string]any {
	return map[string]any{
		"kind":     "Node",
		"metadata": map[string]any{"name": nodeName, "labels": a.labels},
		"spec":     map[string]any{"taints": a.taints},
	}
}

func (a *nodeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	status := a.serve(r, body)
	a.requests = append(a.requests, fmt.Sprintf("%s %s -> %d", r.Method, r.Header.Get("Content-Type"), status))
	if status != http.StatusOK {
		http.Error(w, http.StatusText(status), status)
		return
	}
	json.NewEncoder(w).Encode(a.node())
}

func (a *nodeAPI) serve(r *http.Request, body []byte) int {
	if r.Header.Get("Authorization") != "Bearer "+saToken {
		return http.StatusUnauthorized
	}
	if r.URL.Path != "/api/v1/nodes/"+nodeName {
		return http.StatusNotFound
	}
	switch {
	case r.Method == http.MethodGet:
		return http.StatusOK
	case r.Method == http.MethodPatch && r.Header.Get("Content-Type") == "application/json-patch+json":
		var ops []struct{ Op, Path, Value string }
		if err := json.Unmarshal(body, &ops); err != nil {
			return http.StatusBadRequest
		}
		taints := slices.Clone(a.taints)
		for _, op := range ops {
			rest, ok := strings.CutPrefix(op.Path, "/spec/taints/")
			if !ok {
				return http.StatusUnprocessableEntity
			}
			idx, field, _ := strings.Cut(rest, "/")
			i, err := strconv.Atoi(idx)
			if err != nil || i < 0 || i >= len(taints) {
				return http.StatusUnprocessableEntity
			}
			switch op.Op {
			case "test":
				if taints[i][field] != op.Value {
					return http.StatusUnprocessableEntity
				}
			case "remove":
				taints = slices.Delete(taints, i, i+1)
			default:
				return http.StatusUnprocessableEntity
			}
		}
		a.taints = taints
		return http.StatusOK
	case r.Method == http.MethodPatch && r.Header.Get("Content-Type") == "application/merge-patch+json":
		var p struct {
			Metadata struct{ Labels map[string]string } `json:"metadata"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			return http.StatusBadRequest
		}
		for k, v := range p.Metadata.Labels {
			a.labels[k] = v
		}
		return http.StatusOK
	}
	return http.StatusMethodNotAllowed
}

// chrootCmd runs argv inside root with exactly env.
func chrootCmd(ctx context.Context, root string, env []string, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Setpgid: true}
	return cmd
}

// TestNodeInstallerImage unpacks the gvisor-installer image that fusebox image build made
// and checks that it holds the node installer script and the pinned runsc and shim, with their
// SHA-256 recorded in /opt/gvisor/SHA256SUMS (and its labels), that the binaries and every tool
// the script calls run from the image's own userland, and then runs its entrypoint there, as
// the AKS DaemonSet does. With one byte of the image's runsc changed it installs nothing,
// restarts nothing and leaves the node's taint. With the image as built it installs the
// image's own runsc and shim into a node root (nothing is downloaded: the test serves nothing
// but the API server), registers the runtime with containerd, restarts containerd (nsenter is
// the only stand-in: the real one would restart this machine's containerd), removes the
// startup taint and labels the node through the API server (on loopback, TLS, the service
// account's token), and waits until it is stopped.
func TestNodeInstallerImage(t *testing.T) {
	b := buildImages(t)[image.GVisorInstaller]
	img, err := image.Load(b.Dir)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	const script = "/usr/local/bin/fusebox-gvisor-installer"
	if want := []string{"/bin/bash", script}; !slices.Equal(cf.Config.Entrypoint, want) {
		t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, want)
	}
	labels := cf.Config.Labels
	for label, p := range map[string]string{"dev.fusebox.gvisor.runsc.sha256": runscPath(), "dev.fusebox.gvisor.shim.sha256": shimPath()} {
		if got, want := labels[label], fileSHA256(t, p); got != want {
			t.Errorf("label %s=%q, want the SHA-256 of the pinned %s, %s", label, got, p, want)
		}
	}

	r, err := rootfs.Unpack(context.Background(), img, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	root := r.Dir
	want, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "components", "gvisor", "node-installer.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(root, script)); err != nil || string(got) != string(want) {
		t.Errorf("%s is not components/gvisor/node-installer.sh (%v)", script, err)
	}
	for bin, label := range map[string]string{"runsc": "dev.fusebox.gvisor.runsc.sha256", "containerd-shim-runsc-v1": "dev.fusebox.gvisor.shim.sha256"} {
		if got := fileSHA256(t, filepath.Join(root, "opt/gvisor", bin)); got != labels[label] {
			t.Errorf("/opt/gvisor/%s has SHA-256 %s, its label says %s", bin, got, labels[label])
		}
	}
	// The digests the installer checks, recorded at build.
	wantSums := labels["dev.fusebox.gvisor.runsc.sha256"] + "  runsc\n" + labels["dev.fusebox.gvisor.shim.sha256"] + "  containerd-shim-runsc-v1\n"
	if got, err := os.ReadFile(filepath.Join(root, "opt/gvisor/SHA256SUMS")); err != nil || string(got) != wantSums {
		t.Errorf("/opt/gvisor/SHA256SUMS: %q %v, want %q", got, err, wantSums)
	}

	imageEnv := slices.Clone(cf.Config.Env)
	ctx := testenv.Context(t, 5*time.Minute)
	// The binaries run from the unpacked layers, and every tool the script calls is in the
	// image's userland.
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"/opt/gvisor/runsc", "--version"}, "runsc version"},
		{[]string{"/opt/gvisor/containerd-shim-runsc-v1", "-v"}, "containerd-shim-runsc-v1:"},
		{[]string{"/bin/bash", "--version"}, "GNU bash"},
		{[]string{"/bin/bash", "-c", "for c in curl sha256sum install mktemp grep cut cat head mv mkdir rm touch uname sleep nsenter; do command -v $c || { echo missing $c; exit 1; }; done; nsenter --version; curl --version"},
			"nsenter from util-linux"},
	} {
		// gVisor's binaries read /proc/sys at start: a /proc of their own, in mount and PID
		// namespaces of their own (util-linux's unshare), gone when they exit.
		argv := append([]string{"unshare", "--mount", "--pid", "--fork", "--mount-proc=" + filepath.Join(root, "proc"), "chroot", root}, tc.argv...)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(imageEnv, "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("in the image: %q: %v\n%s\nwant %q", tc.argv, err, out, tc.want)
		}
	}

	// The node: containerd's config as on AKS (version 2, no imports), no gVisor yet.
	const testDir = "/fusebox-test"
	files := map[string]string{
		"host/etc/containerd/config.toml": "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n",
		"fusebox-test/sa/token":           saToken,
		"fusebox-test/bin/nsenter":        "#!/bin/bash\necho \"nsenter $*\" >>" + testDir + "/calls.log\n",
	}
	api := &nodeAPI{
		taints: []map[string]string{{"key": "node.kubernetes.io/other", "effect": "NoSchedule"}, {"key": startupTaint, "effect": "NoSchedule"}},
		labels: map[string]string{"kubernetes.io/hostname": nodeName},
	}
	apiSrv := httptest.NewTLSServer(api)
	defer apiSrv.Close()
	files["fusebox-test/sa/ca.crt"] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: apiSrv.Certificate().Raw}))
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	apiURL, _ := url.Parse(apiSrv.URL)
	env := []string{
		"PATH=" + testDir + "/bin:" + strings.TrimPrefix(envValue(imageEnv, "PATH"), "PATH="),
		"LANG=C.UTF-8",
		"NODE_NAME=" + nodeName,
		"HOST_ROOT=/host",
		"SA_DIR=" + testDir + "/sa",
		"READY_FILE=/tmp/fusebox-gvisor-ready",
		"READY_LABEL=" + readyLabel,
		"STARTUP_TAINT=" + startupTaint,
		"KUBERNETES_SERVICE_HOST=" + apiURL.Hostname(),
		"KUBERNETES_SERVICE_PORT=" + apiURL.Port(),
	}
	// A runsc changed in the image (one byte appended): refused before anything changes.
	runsc := filepath.Join(root, "opt/gvisor/runsc")
	good, err := os.ReadFile(runsc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runsc, append(slices.Clone(good), 0), 0o755); err != nil {
		t.Fatal(err)
	}
	refused, err := chrootCmd(ctx, root, env, cf.Config.Entrypoint...).CombinedOutput()
	if err == nil {
		t.Fatalf("the installer accepted a changed runsc:\n%s", refused)
	}
	if !strings.Contains(string(refused), "/opt/gvisor/runsc has SHA-256") {
		t.Errorf("the refusal does not name the changed binary:\n%s", refused)
	}
	for _, bin := range []string{"runsc", "containerd-shim-runsc-v1"} {
		if _, err := os.Stat(filepath.Join(root, "host/usr/local/bin", bin)); err == nil {
			t.Errorf("%s installed from an image with a changed runsc", bin)
		}
	}
	if calls, _ := os.ReadFile(filepath.Join(root, "fusebox-test/calls.log")); len(calls) != 0 {
		t.Errorf("nsenter called after the refusal:\n%s", calls)
	}
	api.mu.Lock()
	if len(api.requests) != 0 || len(api.taints) != 2 {
		t.Errorf("API requests %q, taints %v after the refusal", api.requests, api.taints)
	}
	api.mu.Unlock()
	if err := os.WriteFile(runsc, good, 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := chrootCmd(ctx, root, env, cf.Config.Entrypoint...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	defer syscall.Kill(-pgid, syscall.SIGKILL) // the script's `sleep infinity`, whatever happens
	sc := bufio.NewScanner(stderr)
	out, ok := waitForLine(sc, "runsc installed on "+nodeName)
	if !ok {
		err := cmd.Wait()
		t.Fatalf("the installer stopped before it was done: %v\n%s", err, out)
	}
	// Done and waiting, as a DaemonSet pod (its TERM trap set, then `sleep infinity`):
	// stopped as the kubelet stops it.
	if err := waitForChild(ctx, pgid, "sleep"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stderr)
	if err := cmd.Wait(); err != nil {
		t.Errorf("the installer did not exit 0 on SIGTERM: %v", err)
	}
	t.Logf("installer output:\n%s", out)

	for bin, label := range map[string]string{"runsc": "dev.fusebox.gvisor.runsc.sha256", "containerd-shim-runsc-v1": "dev.fusebox.gvisor.shim.sha256"} {
		p := filepath.Join(root, "host/usr/local/bin", bin)
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s not installed with mode 0755: %v", p, err)
			continue
		}
		if got := fileSHA256(t, p); got != labels[label] {
			t.Errorf("installed %s has SHA-256 %s, want %s", bin, got, labels[label])
		}
	}
	cfg, _ := os.ReadFile(filepath.Join(root, "host/etc/containerd/config.toml"))
	if !strings.Contains(string(cfg), "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc]\n  runtime_type = \"io.containerd.runsc.v1\"") {
		t.Errorf("containerd config without the runsc runtime:\n%s", cfg)
	}
	calls, _ := os.ReadFile(filepath.Join(root, "fusebox-test/calls.log"))
	if want := "nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd\n"; !strings.Contains(string(calls), want) {
		t.Errorf("containerd not restarted; nsenter calls:\n%s", calls)
	}
	if _, err := os.Stat(filepath.Join(root, "tmp/fusebox-gvisor-ready")); err != nil {
		t.Errorf("ready file: %v", err)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.taints) != 1 || api.taints[0]["key"] != "node.kubernetes.io/other" {
		t.Errorf("taints after the install: %v (want only the other taint left)\nrequests: %q", api.taints, api.requests)
	}
	if api.labels[readyLabel] != "ready" {
		t.Errorf("labels after the install: %v\nrequests: %q", api.labels, api.requests)
	}
}

// envValue returns the KEY=value entry of env for key, or "".
func envValue(env []string, key string) string {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return e
		}
	}
	return ""
}

// waitForChild waits until a process named comm runs in process group pgid.
func waitForChild(ctx context.Context, pgid int, comm string) error {
	for {
		for _, p := range procstat.All() {
			if p.Comm == comm && p.PGRP == pgid {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no %s in process group %d: %w", comm, pgid, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
