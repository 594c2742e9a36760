package gvisor

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// NodeadmCheckName is the checker hack/nodeadm builds (make nodeadm-check) into
// $FUSEBOX_NODEADM_BIN: nodeadm's own code, from the Go module proxy, rendering the containerd
// configuration nodeadm writes for a userData document.
const nodeadmCheckName = "nodeadm-containerd"

// TestEKSUserDataNodeadm gives nodeadm's own parser, NodeConfig merge and containerd
// configuration (hack/nodeadm) the userData as Karpenter hands it to an AL2023 node, and checks
// that the containerd configuration nodeadm writes registers runsc: on containerd 1.x as it is,
// and on containerd 2.x after nodeadm's `containerd config migrate` (with the containerd of
// $FUSEBOX_NODE_BIN, which then reads the result back).
func TestEKSUserDataNodeadm(t *testing.T) {
	dir := os.Getenv("FUSEBOX_NODEADM_BIN")
	if dir == "" {
		t.Skip("FUSEBOX_NODEADM_BIN unset: `make nodeadm-check` builds nodeadm's containerd config checker (hack/nodeadm)")
	}
	check := filepath.Join(dir, nodeadmCheckName)
	if _, err := os.Stat(check); err != nil {
		t.Fatalf("FUSEBOX_NODEADM_BIN=%s has no %s (build it with `make nodeadm-check`): %v", dir, nodeadmCheckName, err)
	}
	ud, err := EKSUserData(UserDataOptions{BinaryBaseURL: "https://mirror.example.com/gvisor/release/20250120"})
	if err != nil {
		t.Fatal(err)
	}
	launched := karpenterUserData(t, ud)

	t.Run("containerd 1.7", func(t *testing.T) {
		cfg := nodeadmContainerdConfig(t, check, launched, "1.7.27", "")
		wantRunsc(t, cfg, "io.containerd.grpc.v1.cri")
	})
	t.Run("containerd 2.1", func(t *testing.T) {
		nodeBin := os.Getenv("FUSEBOX_NODE_BIN")
		if nodeBin == "" {
			t.Skip("FUSEBOX_NODE_BIN unset: nodeadm migrates the config with `containerd config migrate` (make node-bins builds containerd)")
		}
		ctrd := filepath.Join(nodeBin, "containerd")
		if _, err := os.Stat(ctrd); err != nil {
			t.Fatalf("FUSEBOX_NODE_BIN=%s has no containerd (make node-bins): %v", nodeBin, err)
		}
		cfg := nodeadmContainerdConfig(t, check, launched, "2.1.5", ctrd)
		wantRunsc(t, cfg, "io.containerd.cri.v1.runtime")

		// containerd itself reads the file nodeadm wrote and reports the runtime, as the
		// verify-only node installer reads it from the running containerd (config dump).
		f := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(f, cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(ctrd, "--config", f, "config", "dump").CombinedOutput()
		if err != nil {
			t.Fatalf("containerd config dump of nodeadm's config: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `containerd.runtimes.runsc]`) || !strings.Contains(string(out), `'io.containerd.runsc.v1'`) {
			t.Errorf("containerd's dump of nodeadm's config has no runsc runtime:\n%s", out)
		}
	})
}

// nodeadmContainerdConfig runs the checker on userData for a node with containerd version
// ctrdVersion and returns the config.toml nodeadm writes.
func nodeadmContainerdConfig(t *testing.T, check, userData, ctrdVersion, ctrd string) []byte {
	t.Helper()
	args := []string{"-containerd-version", ctrdVersion}
	if ctrd != "" {
		args = append(args, "-containerd", ctrd)
	}
	cmd := exec.Command(check, args...)
	cmd.Stdin = strings.NewReader(userData)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", check, args, err, stderr.String())
	}
	return out
}

// wantRunsc checks that config, a containerd config.toml, registers runsc under the CRI
// plugin cri (io.containerd.grpc.v1.cri in version 2, io.containerd.cri.v1.runtime in 3) with
// its shim and runsc's flags file.
func wantRunsc(t *testing.T, config []byte, cri string) {
	t.Helper()
	var c struct {
		Plugins map[string]struct {
			Containerd struct {
				DefaultRuntimeName string `toml:"default_runtime_name"`
				Runtimes           map[string]struct {
					RuntimeType string         `toml:"runtime_type"`
					Options     map[string]any `toml:"options"`
				} `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	if _, err := toml.Decode(string(config), &c); err != nil {
		t.Fatalf("nodeadm's containerd config: %v\n%s", err, config)
	}
	ctrd := c.Plugins[cri].Containerd
	r, ok := ctrd.Runtimes["runsc"]
	if !ok {
		t.Fatalf("nodeadm's containerd config has no runsc runtime under %q:\n%s", cri, config)
	}
	if r.RuntimeType != "io.containerd.runsc.v1" {
		t.Errorf("runsc runtime_type %q, want io.containerd.runsc.v1", r.RuntimeType)
	}
	if r.Options["ConfigPath"] != RunscConfigPath || r.Options["TypeUrl"] != "io.containerd.runsc.v1.options" {
		t.Errorf("runsc options %v, want ConfigPath %s and TypeUrl io.containerd.runsc.v1.options", r.Options, RunscConfigPath)
	}
	// nodeadm's own runtime stays the default: runsc is chosen by the RuntimeClass only.
	if _, ok := ctrd.Runtimes["runc"]; !ok || ctrd.DefaultRuntimeName != "runc" {
		t.Errorf("runc runtime lost or no longer the default (%q):\n%s", ctrd.DefaultRuntimeName, config)
	}
}

// karpenterUserData is the userData Karpenter launches an AL2023 node with from an
// EC2NodeClass's spec.userData, as karpenter-provider-aws builds it
// (pkg/providers/amifamily/bootstrap/nodeadm.go, Nodeadm.Script, and mime/mime.go): its own
// NodeConfig (cluster details, kubelet configuration and flags) first, then each part of the
// custom MIME document with its Content-Type header only, re-serialized with the boundary "//",
// carriage returns removed, base64-encoded.
func karpenterUserData(t *testing.T, custom string) string {
	t.Helper()
	type entry struct{ contentType, content string }
	entries := []entry{{"application/node.eks.aws", `# Karpenter Generated NodeConfig
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
metadata:
  creationTimestamp: null
spec:
  cluster:
    apiServerEndpoint: https://ABCDEF.gr7.us-west-2.eks.amazonaws.com
    certificateAuthority: Y2VydGlmaWNhdGVBdXRob3JpdHk=
    cidr: 10.100.0.0/16
    name: fusebox-dev
  containerd: {}
  instance:
    localStorage: {}
  kubelet:
    config:
      clusterDNS:
      - 10.100.0.10
      maxPods: 58
      registerWithTaints:
      - effect: NoSchedule
        key: fusebox.dev/gvisor-not-ready
    flags:
    - --node-labels="karpenter.sh/capacity-type=on-demand,karpenter.sh/nodepool=fusebox-sandbox"
`}}
	msg, err := mail.ReadMessage(strings.NewReader(custom))
	if err != nil {
		t.Fatalf("userData is not a MIME message: %v", err)
	}
	_, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, entry{p.Header.Get("Content-Type"), string(b)})
	}
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary("//"); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"//\"\n\n")
	for _, e := range entries {
		pw, err := w.CreatePart(textproto.MIMEHeader{"Content-Type": {e.contentType}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pw.Write([]byte(e.content)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString([]byte(strings.ReplaceAll(buf.String(), "\r", "")))
}
