package gvisor

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/BurntSushi/toml"
)

// containerd configurations as AKS nodes write them: config version 2 (AKS Ubuntu and
// AzureLinux nodes, containerd 1.7 or 2.x), with and without an imports directory, and a
// version 3 one (containerd 2.x). The runc runtime's options, the sandbox image and the
// registry's config path are the node's own CRI settings that must survive the installer.
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
	configV3 = `version = 3
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "mcr.microsoft.com/oss/kubernetes/pause:3.6"
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "/usr/bin/runc"
  SystemdCgroup = true
`
	configV2WithRunsc = aksConfigV2 + `
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
  runtime_type = "io.containerd.runsc.v1"
`
	// staleDropin is what installers before the containerd 1.7 append path wrote into a
	// version 2 config's imports directory.
	staleDropin = "version = 2\n\n# Added by fusebox: the gVisor runtime.\n" +
		"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc]\n  runtime_type = \"io.containerd.runsc.v1\"\n"
)

// The same with an imports directory, as AKS nodes that take drop-ins have it.
var (
	aksConfigV2Imports = strings.Replace(aksConfigV2, "version = 2\n", "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n", 1) + "\n"
	configV3Imports    = strings.Replace(configV3, "version = 3\n", "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n", 1)
)

// A containerd binary whose own config loading checks what the installer writes.
type containerdBinary struct {
	name string // as the test reports it
	path string
	// v3 says whether it reads config version 3 (containerd 2.x).
	v3 bool
}

// containerdBinaries returns the real containerd binaries to load the configurations with:
// containerd 2.4.2 (the test node's, $FUSEBOX_NODE_BIN/containerd, make node-bins) and
// containerd 1.7 ($FUSEBOX_CONTAINERD17, hack/node/build-containerd17.sh). Set variables must
// name a binary; without one the version is left out and the test says so.
func containerdBinaries(t *testing.T) []containerdBinary {
	t.Helper()
	var out []containerdBinary
	nodeBin := os.Getenv("FUSEBOX_NODE_BIN")
	dflt := nodeBin == ""
	if dflt {
		nodeBin = "/var/cache/fusebox/node-containerd-v2.4.2-k8s-v1.37.2"
	}
	switch p := filepath.Join(nodeBin, "containerd"); {
	case fileExists(p):
		out = append(out, containerdBinary{"containerd 2.4.2", p, true})
	case dflt:
		t.Logf("no containerd 2.x at %s (make node-bins): not loaded with it", p)
	default:
		t.Fatalf("FUSEBOX_NODE_BIN=%s has no containerd (make node-bins)", nodeBin)
	}
	switch p := os.Getenv("FUSEBOX_CONTAINERD17"); {
	case p == "":
		t.Log("FUSEBOX_CONTAINERD17 is not set (hack/node/build-containerd17.sh builds containerd 1.7): not loaded with containerd 1.7")
	case fileExists(p):
		out = append(out, containerdBinary{"containerd 1.7", p, false})
	default:
		t.Fatalf("FUSEBOX_CONTAINERD17=%s: no such file (hack/node/build-containerd17.sh builds it)", p)
	}
	return out
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// copyFile copies src to dst with mode 0755.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// configDump runs `containerd -c /etc/containerd/config.toml config dump` chrooted into root,
// so that containerd resolves the config's absolute imports ("/etc/containerd/conf.d/*.toml")
// inside the test's node root as it would on the node, and returns the merged configuration.
func configDump(t *testing.T, root, bin string) (map[string]any, string) {
	t.Helper()
	cmd := exec.Command("/"+bin, "-c", "/etc/containerd/config.toml", "config", "dump")
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s config dump: %v\n%s%s", bin, err, out, stderr.String())
	}
	dump := map[string]any{}
	if _, err := toml.Decode(string(out), &dump); err != nil {
		t.Fatalf("%s config dump is not TOML: %v\n%s", bin, err, out)
	}
	return dump, string(out)
}

// dig returns the value at path in a decoded TOML document, or nil.
func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// criSettings are the CRI settings of a merged configuration that the test checks: per
// runtime its runtime_type and options, the sandbox image and the registry's config path.
type criSettings struct {
	runcType, runscType                  any
	runcBinary, runcSystemd, runscConfig any
	sandboxImage, registryConfigPath     any
}

// criOf reads criSettings where the containerd version keeps them: containerd 1.7 under
// "io.containerd.grpc.v1.cri"; 2.x, whose dump is version 3, under "io.containerd.cri.v1.runtime"
// (runtimes) and "io.containerd.cri.v1.images" (sandbox image, registry).
func criOf(dump map[string]any, v3 bool) criSettings {
	rt := dig(dump, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
	img := dig(dump, "plugins", "io.containerd.grpc.v1.cri")
	sandbox, registry := dig(img, "sandbox_image"), dig(img, "registry", "config_path")
	if v3 {
		rt = dig(dump, "plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes")
		img = dig(dump, "plugins", "io.containerd.cri.v1.images")
		sandbox, registry = dig(img, "pinned_images", "sandbox"), dig(img, "registry", "config_path")
	}
	return criSettings{
		runcType: dig(rt, "runc", "runtime_type"), runscType: dig(rt, "runsc", "runtime_type"),
		runcBinary: dig(rt, "runc", "options", "BinaryName"), runcSystemd: dig(rt, "runc", "options", "SystemdCgroup"),
		runscConfig: dig(rt, "runsc", "options", "ConfigPath"), sandboxImage: sandbox, registryConfigPath: registry,
	}
}

// TestInstallerConfiguresContainerd runs the installer's containerd step on node roots with
// AKS's containerd configurations, twice (the second run must change nothing), and loads the
// result with real containerd binaries (`containerd config dump`, chrooted into the node root):
// the merged configuration must have the runsc runtime added and the node's own CRI settings
// (the runc runtime and its options, the sandbox image, the registry) kept.
//
// containerd 1.7 merges an imported file by replacing each plugin's whole section with the
// import's (services/server/config/config.go, mergeConfig: "Replace entire sections instead of
// merging map's values"; containerd issues #5837 and #7982), so a drop-in that adds one
// runtime to "io.containerd.grpc.v1.cri" drops every other CRI setting of the node, the runc
// runtime's included. A version 2 config (containerd 1.7 or 2.x) therefore gets the runtime
// appended to config.toml itself, and a drop-in an earlier installer wrote is removed;
// containerd 2.x, the only reader of version 3, merges imports key by key, so a version 3
// config with an imports directory gets a drop-in.
func TestInstallerConfiguresContainerd(t *testing.T) {
	script := writeScript(t)
	var bins []containerdBinary
	root := t.TempDir()
	if os.Geteuid() == 0 {
		bins = containerdBinaries(t)
		for i, b := range bins {
			name := fmt.Sprintf("containerd-%d", i)
			copyFile(t, b.path, filepath.Join(root, name))
			bins[i].path = name
		}
	} else {
		t.Log("not root: the configurations are not loaded with real containerd (chroot needs root)")
	}
	const dropinRel = "etc/containerd/conf.d/fusebox-runsc.toml"
	for _, tc := range []struct {
		name, config string
		v3           bool
		stale        bool // a drop-in from an earlier installer is there
		dropin       bool // the runtime ends up in the drop-in, config.toml untouched
		firstRun     string
	}{
		{name: "aks v2 appended", config: aksConfigV2, firstRun: "changed"},
		{name: "aks v2 with imports appended", config: aksConfigV2Imports, firstRun: "changed"},
		{name: "aks v2 stale drop-in removed", config: aksConfigV2Imports, stale: true, firstRun: "changed"},
		{name: "v3 appended", config: configV3, v3: true, firstRun: "changed"},
		{name: "v3 conf.d drop-in", config: configV3Imports, v3: true, dropin: true, firstRun: "changed"},
		{name: "runsc present", config: configV2WithRunsc, firstRun: "unchanged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.RemoveAll(filepath.Join(root, "etc")); err != nil {
				t.Fatal(err)
			}
			cfgPath := filepath.Join(root, "etc", "containerd", "config.toml")
			dropin := filepath.Join(root, dropinRel)
			if err := os.MkdirAll(filepath.Dir(dropin), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cfgPath, []byte(tc.config), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.stale {
				if err := os.WriteFile(dropin, []byte(staleDropin), 0o644); err != nil {
					t.Fatal(err)
				}
			}
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
				t.Errorf("drop-in exists %v, want %v:\n%s", dropErr == nil, tc.dropin, extra)
			}
			if tc.dropin && string(main) != tc.config {
				t.Errorf("config.toml changed although it imports conf.d:\n%s", main)
			}
			if !tc.dropin && !strings.HasPrefix(string(main), tc.config) {
				t.Errorf("config.toml's own settings changed:\n%s", main)
			}
			if n := strings.Count(string(main)+string(extra), "containerd.runtimes.runsc]"); n != 1 {
				t.Errorf("%d runsc runtime tables, want 1:\n%s\n---\n%s", n, main, extra)
			}

			ran := false
			for _, b := range bins {
				if tc.v3 && !b.v3 {
					continue // containerd 1.7 does not read version 3
				}
				ran = true
				dump, text := configDump(t, root, b.path)
				got, want := criOf(dump, b.v3), criSettings{
					runcType: "io.containerd.runc.v2", runscType: "io.containerd.runsc.v1",
					runcBinary: "/usr/bin/runc", runcSystemd: true, runscConfig: "/etc/containerd/runsc.toml",
					sandboxImage: "mcr.microsoft.com/oss/kubernetes/pause:3.6", registryConfigPath: "/etc/containerd/certs.d",
				}
				if tc.name == "runsc present" {
					want.runscConfig = nil // the node's own runsc entry, left as it is
				}
				if got != want {
					t.Errorf("%s merged the configuration into\n%+v\nwant\n%+v\n%s", b.name, got, want, text)
				}
			}
			if !ran {
				t.Log("not loaded with a real containerd")
			}
		})
	}
}
