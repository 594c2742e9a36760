package gvisor

import (
	"errors"
	"fmt"
	"strings"
)

// Where the runsc runtime goes in containerd's config: version 3 (containerd 2.x) moved the
// CRI runtimes to "io.containerd.cri.v1.runtime"; version 2 (containerd 1.x) has them under
// "io.containerd.grpc.v1.cri". The EKS userData registers the runtime in version 2, which
// nodeadm migrates to version 3 on a containerd 2.x node.
const (
	ContainerdRuntimePathV3 = `plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc`
	ContainerdRuntimePathV2 = `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc`
)

// RunscConfigPath is the runsc flags file containerd-shim-runsc-v1 reads (the runtime's
// ConfigPath option). The EKS userData's script writes it.
const RunscConfigPath = "/etc/containerd/runsc.toml"

// ReleasesURL is the root of gVisor's published releases: <ReleasesURL>/<version>/<arch>/runsc.
const ReleasesURL = "https://storage.googleapis.com/gvisor/releases/release"

// DefaultBinaryBaseURL serves gVisor's release binaries as <base>/<arch>/runsc (and .sha512).
// In-VPC installs point UserDataOptions.BinaryBaseURL at their own mirror of the same layout.
const DefaultBinaryBaseURL = "https://storage.googleapis.com/gvisor/releases/release/latest"

// mimeBoundary separates the MIME parts of the userData.
const mimeBoundary = "FUSEBOX-GVISOR-BOUNDARY"

// UserDataOptions configure EKSUserData.
type UserDataOptions struct {
	// BinaryBaseURL is an http(s) URL under which <arch>/runsc, <arch>/containerd-shim-runsc-v1
	// and their .sha512 files are served (arch is x86_64 or aarch64). Required.
	BinaryBaseURL string
}

// ErrBadBinaryURL is returned by EKSUserData for a missing or unusable BinaryBaseURL.
var ErrBadBinaryURL = errors.New("bad gVisor binary base URL")

// NodeConfigContentType is the MIME type of a nodeadm NodeConfig part (nodeadm's
// configprovider reads the parts of type "application/" + its API group, node.eks.aws).
const NodeConfigContentType = "application/node.eks.aws"

// EKSUserData returns the Karpenter EC2NodeClass userData for AL2023 sandbox nodes: a MIME
// multipart document with two parts.
//
//   - A nodeadm NodeConfig whose spec.containerd.config registers the runsc runtime. nodeadm
//     writes /etc/containerd/config.toml itself, with no imports, and merges this TOML into it
//     (awslabs/amazon-eks-ami nodeadm/internal/containerd/config.go); a drop-in file would never
//     be read. The TOML is containerd config version 2, which containerd 1.x reads as it is and
//     which nodeadm turns into version 3 with `containerd config migrate` on containerd 2.x
//     (its e2e case containerdv2-config); version 3 would fail nodeadm on containerd 1.x.
//     Karpenter puts its own NodeConfig (cluster, kubelet) first in the document, and nodeadm
//     merges the NodeConfig parts in order (api.MergeNodeConfigs): ours adds only the
//     containerd config.
//   - A shell script, which cloud-init runs after nodeadm has written its configuration and
//     before nodeadm starts containerd and the kubelet. It downloads runsc and
//     containerd-shim-runsc-v1, checks their published SHA-512 sums, installs them on PATH,
//     and writes runsc's flags (RunscConfigPath) for the kubelet's cgroup driver (systemd on
//     AL2023; gVisor issue 10371: runsc must then run with systemd-cgroup).
//
// The node's startup taint stays until the verify-only node installer has seen the binaries
// and runsc registered in containerd's running configuration.
func EKSUserData(o UserDataOptions) (string, error) {
	base, err := validateBaseURL(o.BinaryBaseURL)
	if err != nil {
		return "", err
	}

	var b strings.Builder
	b.WriteString("MIME-Version: 1.0\n")
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\n\n", mimeBoundary)

	fmt.Fprintf(&b, "--%s\n", mimeBoundary)
	fmt.Fprintf(&b, "Content-Type: %s\n\n", NodeConfigContentType)
	b.WriteString(nodeConfig())

	fmt.Fprintf(&b, "\n--%s\n", mimeBoundary)
	b.WriteString("Content-Type: text/x-shellscript; charset=\"us-ascii\"\n\n")
	r := strings.NewReplacer("@BASE@", base, "@RUNSC_CONFIG@", RunscConfigPath)
	b.WriteString(r.Replace(installScript))

	fmt.Fprintf(&b, "\n--%s--\n", mimeBoundary)
	return b.String(), nil
}

// ContainerdRunscConfig is the containerd configuration (version 2) that registers the runsc
// runtime: the TOML the EKS userData's NodeConfig carries in spec.containerd.config.
func ContainerdRunscConfig() string {
	return fmt.Sprintf(`version = 2

# Added by fusebox: the gVisor runtime.
[%[1]s]
runtime_type = "io.containerd.runsc.v1"

[%[1]s.options]
TypeUrl = "io.containerd.runsc.v1.options"
ConfigPath = "%[2]s"
`, ContainerdRuntimePathV2, RunscConfigPath)
}

// nodeConfig is the NodeConfig part: YAML with the containerd TOML as a literal block.
func nodeConfig() string {
	var b strings.Builder
	b.WriteString("# fusebox: register the gVisor runtime (runsc) with containerd through nodeadm.\n")
	b.WriteString("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  containerd:\n    config: |\n")
	for _, line := range strings.Split(strings.TrimSuffix(ContainerdRunscConfig(), "\n"), "\n") {
		if line == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString("      " + line + "\n")
	}
	return b.String()
}

// installScript downloads runsc and its containerd shim, checks their published SHA-512 sums,
// installs them where containerd finds the shim (PATH) and writes runsc's flags for the node's
// cgroup driver.
const installScript = `#!/bin/bash
# fusebox: install gVisor (runsc, containerd-shim-runsc-v1) before containerd starts. The
# runtime itself is registered by this userData's NodeConfig (nodeadm's containerd config).
set -euo pipefail
base='@BASE@'
case "$(uname -m)" in
  x86_64) arch=x86_64 ;;
  aarch64) arch=aarch64 ;;
  *) echo "fusebox: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for bin in runsc containerd-shim-runsc-v1; do
  curl -fsSL --retry 5 -o "$tmp/$bin" "$base/$arch/$bin"
  curl -fsSL --retry 5 -o "$tmp/$bin.sha512" "$base/$arch/$bin.sha512"
  (cd "$tmp" && sha512sum -c "$bin.sha512")
  install -m 0755 "$tmp/$bin" "/usr/local/bin/$bin"
done
# AL2023's nodeadm runs the kubelet and containerd with the systemd cgroup driver (on cgroup
# v2); a kubelet configuration saying cgroupfs wins.
cgroup=true
for f in /etc/kubernetes/kubelet/config.json /etc/kubernetes/kubelet/config.json.d/*.conf; do
  if [[ -f $f ]] && grep -Eq '"cgroupDriver"[[:space:]]*:[[:space:]]*"cgroupfs"' "$f"; then cgroup=false; fi
done
if [[ ! -d /run/systemd/system ]]; then cgroup=false; fi
mkdir -p "$(dirname '@RUNSC_CONFIG@')"
cat >'@RUNSC_CONFIG@' <<RUNSC
# Added by fusebox: runsc flags for containerd-shim-runsc-v1.
[runsc_config]
  systemd-cgroup = "$cgroup"
RUNSC
echo "fusebox: runsc installed (systemd-cgroup $cgroup)" >&2
`
