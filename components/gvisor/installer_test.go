package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/fusebox-dev/fusebox/components"
	"github.com/fusebox-dev/fusebox/components/mocktest"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	daemonSetType          = "kubernetes:apps/v1:DaemonSet"
	serviceAccountType     = "kubernetes:core/v1:ServiceAccount"
	clusterRoleType        = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
	clusterRoleBindingType = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"

	testInstallerImage = "registry.example.com/fusebox/node-installer@sha256:3b4c0f5e8a9d2e1f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f"
	testRunscSum       = "9f2a6c1e4b7d0a3f6e9c2b5d8a1f4e7c0b3d6a9f2e5c8b1d4a7f0e3c6b9d2a5f"
	testShimSum        = "1e4b7d0a3f6e9c2b5d8a1f4e7c0b3d6a9f2e5c8b1d4a7f0e3c6b9d2a5f8c1e4b"
)

func testInstaller() *NodeInstallerArgs {
	return &NodeInstallerArgs{
		Image:         testInstallerImage,
		BinaryBaseURL: "https://mirror.example.com/gvisor/releases/release/20250120/",
		SHA256:        map[string]BinarySHA256{"x86_64": {Runsc: testRunscSum, Shim: testShimSum}},
	}
}

func TestNodeInstallerOnAKS(t *testing.T) {
	m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
		_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: components.AKS, ScheduleOnSandboxNodes: true, NodeInstaller: testInstaller()})
		return err
	})
	m.AssertParented(t, Type)

	ds := m.One(t, daemonSetType)
	p := ds.Props()
	if ns := mocktest.Str(p, "metadata", "namespace"); ns != "kube-system" {
		t.Errorf("DaemonSet in namespace %q, want kube-system (not the sandbox namespace the admission policy guards)", ns)
	}
	spec := mocktest.Dig(p, "spec", "template", "spec")
	if sel, _ := mocktest.Dig(spec, "nodeSelector").(map[string]any); len(sel) != 1 || sel[components.SandboxPoolLabelKey] != components.SandboxPoolLabelValue {
		t.Errorf("nodeSelector %v: want only %s=%s", sel, components.SandboxPoolLabelKey, components.SandboxPoolLabelValue)
	}
	tol := mocktest.Dig(spec, "tolerations", 0)
	if mocktest.Str(tol, "key") != components.SandboxTaintKey || mocktest.Str(tol, "value") != components.SandboxTaintValue ||
		mocktest.Str(tol, "effect") != components.SandboxTaintEffect || mocktest.Str(tol, "operator") != "Equal" {
		t.Errorf("toleration %v does not match the sandbox pool's taint", tol)
	}
	arch := mocktest.Dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0, "matchExpressions", 0)
	if mocktest.Str(arch, "key") != "kubernetes.io/arch" || mocktest.Str(arch, "values", 0) != "amd64" || mocktest.Dig(arch, "values", 1) != nil {
		t.Errorf("architecture affinity %v: want amd64 only (the digests configured)", arch)
	}
	if hp, _ := mocktest.Dig(spec, "hostPID").(bool); !hp {
		t.Error("no hostPID: nsenter cannot reach the host's containerd")
	}
	if mocktest.Str(spec, "serviceAccountName") != InstallerName {
		t.Errorf("serviceAccountName %q", mocktest.Str(spec, "serviceAccountName"))
	}
	c := mocktest.Dig(spec, "containers", 0)
	if img := mocktest.Str(c, "image"); img != testInstallerImage || components.ValidateImage(img) != nil {
		t.Errorf("image %q: want the configured digest-pinned image", img)
	}
	if pr, _ := mocktest.Dig(c, "securityContext", "privileged").(bool); !pr {
		t.Error("installer container is not privileged")
	}
	if mocktest.Str(c, "command", 0) != "/bin/bash" || mocktest.Str(c, "command", 2) != InstallerScript {
		t.Errorf("command %v: want bash running the embedded script", mocktest.Dig(c, "command", 0))
	}
	if mocktest.Str(spec, "volumes", 0, "hostPath", "path") != "/" || mocktest.Str(c, "volumeMounts", 0, "mountPath") != hostRoot {
		t.Errorf("host root not mounted at %s: %v", hostRoot, mocktest.Dig(spec, "volumes"))
	}
	env := map[string]any{}
	for _, e := range mocktest.Dig(c, "env").([]any) {
		env[mocktest.Str(e, "name")] = e
	}
	for name, want := range map[string]string{
		"BINARY_BASE_URL":     "https://mirror.example.com/gvisor/releases/release/20250120",
		"SHA256_RUNSC_X86_64": testRunscSum,
		"SHA256_SHIM_X86_64":  testShimSum,
		"HOST_ROOT":           hostRoot,
		"READY_LABEL":         ReadyLabelKey,
	} {
		if got := mocktest.Str(env[name], "value"); got != want {
			t.Errorf("env %s = %q, want %q", name, got, want)
		}
	}
	if mocktest.Str(env["NODE_NAME"], "valueFrom", "fieldRef", "fieldPath") != "spec.nodeName" {
		t.Errorf("NODE_NAME %v", env["NODE_NAME"])
	}

	// Least privilege: read and label nodes, nothing else.
	rules := mocktest.Dig(m.One(t, clusterRoleType).Props(), "rules").([]any)
	if len(rules) != 1 || mocktest.Str(rules[0], "resources", 0) != "nodes" || mocktest.Dig(rules[0], "resources", 1) != nil ||
		strings.Join([]string{mocktest.Str(rules[0], "verbs", 0), mocktest.Str(rules[0], "verbs", 1)}, ",") != "get,patch" ||
		mocktest.Dig(rules[0], "verbs", 2) != nil {
		t.Errorf("ClusterRole rules %v: want get and patch on nodes only", rules)
	}
	b := m.One(t, clusterRoleBindingType).Props()
	if mocktest.Str(b, "subjects", 0, "name") != InstallerName || mocktest.Str(b, "subjects", 0, "namespace") != "kube-system" ||
		mocktest.Str(b, "roleRef", "name") != InstallerName {
		t.Errorf("ClusterRoleBinding %v", b)
	}
	if sa := m.One(t, serviceAccountType).Props(); mocktest.Str(sa, "metadata", "namespace") != "kube-system" {
		t.Errorf("ServiceAccount %v", sa)
	}
}

func TestNodeInstallerOnlyOnAKS(t *testing.T) {
	for _, cloud := range []components.Cloud{components.EKS, components.GKE, components.Local} {
		t.Run(string(cloud), func(t *testing.T) {
			m := mocktest.MustRun(t, func(ctx *pulumi.Context) error {
				_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: cloud})
				return err
			})
			for _, typ := range []string{daemonSetType, serviceAccountType, clusterRoleType, clusterRoleBindingType} {
				if n := len(m.ByType(typ)); n != 0 {
					t.Errorf("%d %s on %s", n, typ, cloud)
				}
			}
			_, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewGVisor(ctx, "fb", &GVisorArgs{Cloud: cloud, NodeInstaller: testInstaller()})
				return err
			})
			if !errors.Is(err, ErrBadInstaller) {
				t.Errorf("node installer on %s: want ErrBadInstaller, got %v", cloud, err)
			}
		})
	}
}

func TestNodeInstallerRefusesBadSettings(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*NodeInstallerArgs)
		want error
	}{
		"none":           {nil, ErrBadInstaller},
		"image by tag":   {func(a *NodeInstallerArgs) { a.Image = "registry.example.com/installer:v1" }, components.ErrImageNotPinned},
		"no digests":     {func(a *NodeInstallerArgs) { a.SHA256 = nil }, ErrBadInstaller},
		"short digest":   {func(a *NodeInstallerArgs) { a.SHA256["x86_64"] = BinarySHA256{Runsc: "abc", Shim: testShimSum} }, ErrBadInstaller},
		"no shim digest": {func(a *NodeInstallerArgs) { a.SHA256["x86_64"] = BinarySHA256{Runsc: testRunscSum} }, ErrBadInstaller},
		"unknown arch":   {func(a *NodeInstallerArgs) { a.SHA256["riscv64"] = a.SHA256["x86_64"] }, ErrBadInstaller},
		"shell in URL":   {func(a *NodeInstallerArgs) { a.BinaryBaseURL = "https://m.example.com/$(id)" }, ErrBadBinaryURL},
		"empty URL":      {func(a *NodeInstallerArgs) { a.BinaryBaseURL = "" }, ErrBadBinaryURL},
	} {
		t.Run(name, func(t *testing.T) {
			args := &GVisorArgs{Cloud: components.AKS}
			if tc.mut != nil {
				args.NodeInstaller = testInstaller()
				tc.mut(args.NodeInstaller)
			}
			m, err := mocktest.Run(func(ctx *pulumi.Context) error {
				_, err := NewGVisor(ctx, "fb", args)
				return err
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
			if n := len(m.All()); n != 0 {
				t.Errorf("%d resources registered despite bad settings", n)
			}
		})
	}
}

// AKS-like containerd configurations (config version 2, as AKS Ubuntu and AzureLinux nodes
// write it), with and without an imports directory, and a version 3 one.
const (
	aksConfigV2 = `version = 2
oom_score = -999
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "mcr.microsoft.com/oss/kubernetes/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      BinaryName = "/usr/bin/runc"
      SystemdCgroup = true
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
[metrics]
  address = "0.0.0.0:10257"`
	aksConfigV2Imports = `version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
oom_score = -999
[plugins."io.containerd.grpc.v1.cri"]
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
`
	configV3 = `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`
	configV2WithRunsc = aksConfigV2 + `
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
  runtime_type = "io.containerd.runsc.v1"
`
)

// writeScript writes the embedded installer to a file for bash.
func writeScript(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	p := filepath.Join(t.TempDir(), "node-installer.sh")
	if err := os.WriteFile(p, []byte(InstallerScript), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// runtimeType returns runtime_type of the runsc runtime in a parsed containerd config.
func runtimeType(cfg map[string]any, plugin string) string {
	v := any(cfg)
	for _, k := range []string{"plugins", plugin, "containerd", "runtimes", "runsc", "runtime_type"} {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	s, _ := v.(string)
	return s
}

func TestInstallerConfiguresContainerd(t *testing.T) {
	script := writeScript(t)
	const v2, v3 = "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"
	for _, tc := range []struct {
		name, config string
		plugin       string // where the runsc runtime must end up
		dropin       bool   // in /etc/containerd/conf.d/fusebox-runsc.toml, config.toml untouched
		firstRun     string
	}{
		{"aks v2 appended", aksConfigV2, v2, false, "changed"},
		{"aks v2 conf.d drop-in", aksConfigV2Imports, v2, true, "changed"},
		{"v3 appended", configV3, v3, false, "changed"},
		{"runsc present", configV2WithRunsc, v2, false, "unchanged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			cfgPath := filepath.Join(root, "etc", "containerd", "config.toml")
			dropin := filepath.Join(root, "etc", "containerd", "conf.d", "fusebox-runsc.toml")
			if err := os.MkdirAll(filepath.Dir(cfgPath), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cfgPath, []byte(tc.config), 0o644); err != nil {
				t.Fatal(err)
			}
			// Twice: the second run must find everything in place and change nothing.
			for i, want := range []string{tc.firstRun, "unchanged"} {
				cmd := exec.Command("bash", "-c", `source "$1" && configure_containerd`, "bash", script)
				cmd.Env = append(os.Environ(), "FUSEBOX_INSTALLER_LIB=1", "HOST_ROOT="+root)
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("run %d: %v: %s", i+1, err, out)
				}
				if got := strings.TrimSpace(string(out)); got != want {
					t.Errorf("run %d printed %q, want %q", i+1, got, want)
				}
			}

			main, _ := os.ReadFile(cfgPath)
			extra, dropErr := os.ReadFile(dropin)
			if tc.dropin != (dropErr == nil) {
				t.Fatalf("drop-in exists %v, want %v", dropErr == nil, tc.dropin)
			}
			if tc.dropin && string(main) != tc.config {
				t.Errorf("config.toml changed although it imports conf.d:\n%s", main)
			}
			if n := strings.Count(string(main)+string(extra), "containerd.runtimes.runsc]"); n != 1 {
				t.Errorf("%d runsc runtime tables, want 1:\n%s\n---\n%s", n, main, extra)
			}
			// What containerd reads must be valid TOML with the runtime where it looks.
			parsed := map[string]any{}
			if _, err := toml.Decode(string(main), &parsed); err != nil {
				t.Fatalf("config.toml is no longer TOML: %v\n%s", err, main)
			}
			if tc.dropin {
				parsed = map[string]any{}
				if _, err := toml.Decode(string(extra), &parsed); err != nil {
					t.Fatalf("drop-in is not TOML: %v\n%s", err, extra)
				}
				if v, _ := parsed["version"].(int64); v != 2 {
					t.Errorf("drop-in version %v, want 2", parsed["version"])
				}
			}
			if got := runtimeType(parsed, tc.plugin); got != "io.containerd.runsc.v1" {
				t.Errorf("runsc runtime_type under %s = %q\n%s%s", tc.plugin, got, main, extra)
			}
		})
	}
}

// TestInstallerMain runs the whole script with stand-ins for curl (serving files from a
// directory, recording the node label request), uname, nsenter and sleep.
func TestInstallerMain(t *testing.T) {
	script := writeScript(t)
	dir := t.TempDir()
	root, release, stubs, sa := filepath.Join(dir, "host"), filepath.Join(dir, "release"), filepath.Join(dir, "bin"), filepath.Join(dir, "sa")
	log := filepath.Join(dir, "calls.log")
	const base = "https://mirror.example.com/gvisor/20250120"
	files := map[string]string{
		filepath.Join(root, "etc/containerd/config.toml"):         aksConfigV2,
		filepath.Join(release, "x86_64/runsc"):                    "runsc binary\n",
		filepath.Join(release, "x86_64/containerd-shim-runsc-v1"): "shim binary\n",
		filepath.Join(sa, "token"):                                "tok",
		filepath.Join(sa, "ca.crt"):                               "ca",
		filepath.Join(stubs, "uname"):                             "#!/bin/bash\necho x86_64\n",
		filepath.Join(stubs, "sleep"):                             "#!/bin/bash\nexit 0\n",
		filepath.Join(stubs, "nsenter"):                           "#!/bin/bash\necho \"nsenter $*\" >>\"$FAKE_LOG\"\n",
		filepath.Join(stubs, "curl"): `#!/bin/bash
out= url= method=GET data=
while [[ $# -gt 0 ]]; do
  case $1 in
    -o) out=$2; shift 2 ;;
    -X) method=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    -H | --cacert | --retry) shift 2 ;;
    -*) shift ;;
    *) url=$1; shift ;;
  esac
done
echo "curl $method $url $data" >>"$FAKE_LOG"
[[ $method == PATCH ]] && exit 0
src="$FAKE_RELEASE/${url#"$FAKE_BASE"/}"
[[ -f $src ]] || exit 22
cp "$src" "$out"
`,
	}
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	run := func(runscSum string) (string, error) {
		os.Remove(log)
		cmd := exec.Command("bash", script)
		cmd.Env = append(os.Environ(),
			"PATH="+stubs+":"+os.Getenv("PATH"),
			"FAKE_LOG="+log, "FAKE_RELEASE="+release, "FAKE_BASE="+base,
			"BINARY_BASE_URL="+base, "NODE_NAME=node-1", "HOST_ROOT="+root, "SA_DIR="+sa,
			"READY_FILE="+filepath.Join(dir, "ready"), "READY_LABEL="+ReadyLabelKey,
			"KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_SERVICE_PORT=443",
			"SHA256_RUNSC_X86_64="+runscSum, "SHA256_SHIM_X86_64="+sum("shim binary\n"))
		out, err := cmd.CombinedOutput()
		calls, _ := os.ReadFile(log)
		t.Logf("output:\n%s", out)
		return string(calls), err
	}
	restart := "nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd"
	label := `curl PATCH https://10.0.0.1:443/api/v1/nodes/node-1 {"metadata":{"labels":{"fusebox.dev/gvisor":"ready"}}}`

	// A binary that does not match its configured digest: nothing installed, no restart, no label.
	calls, err := run(sum("another runsc\n"))
	if err == nil {
		t.Fatal("the script accepted a runsc with the wrong SHA-256")
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/bin/runsc")); err == nil {
		t.Error("runsc installed despite the wrong SHA-256")
	}
	if strings.Contains(calls, "nsenter") || strings.Contains(calls, "PATCH") {
		t.Errorf("restart or label after a failed verification:\n%s", calls)
	}

	calls, err = run(sum("runsc binary\n"))
	if err != nil {
		t.Fatalf("install: %v\n%s", err, calls)
	}
	for bin, want := range map[string]string{"runsc": "runsc binary\n", "containerd-shim-runsc-v1": "shim binary\n"} {
		p := filepath.Join(root, "usr/local/bin", bin)
		b, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || string(b) != want || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %q %v", bin, b, err)
		}
	}
	if strings.Count(calls, restart) != 1 || !strings.Contains(calls, label) {
		t.Errorf("want one containerd restart and the node label:\n%s", calls)
	}
	if i, j := strings.Index(calls, restart), strings.Index(calls, label); i > j {
		t.Errorf("node labelled before containerd was restarted:\n%s", calls)
	}
	if _, err := os.Stat(filepath.Join(dir, "ready")); err != nil {
		t.Errorf("ready file: %v", err)
	}
	cfg, _ := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml"))
	if strings.Count(string(cfg), "runtimes.runsc]") != 1 {
		t.Errorf("config:\n%s", cfg)
	}

	// A restarted pod: everything is in place, so no download and no restart; label again.
	calls, err = run(sum("runsc binary\n"))
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if strings.Contains(calls, "GET") || strings.Contains(calls, "nsenter") || !strings.Contains(calls, label) {
		t.Errorf("second run downloaded or restarted, or did not label:\n%s", calls)
	}
}
