package gvisor

import (
	"errors"
	"fmt"
	"strings"
)

// Where the runsc runtime goes in containerd's config: version 3 (containerd 2.x) moved the
// CRI runtimes to "io.containerd.cri.v1.runtime"; version 2 (containerd 1.x) has them under
// "io.containerd.grpc.v1.cri". The userData detects which one the node's containerd reads.
const (
	ContainerdRuntimePathV3 = `plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc`
	ContainerdRuntimePathV2 = `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc`
)

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

// EKSUserData returns the Karpenter EC2NodeClass userData for AL2023 sandbox nodes: a MIME
// multipart document with one shell script, which cloud-init runs after nodeadm has read its
// configuration and before nodeadm starts containerd and the kubelet. The script downloads
// runsc and containerd-shim-runsc-v1 and checks their published SHA-512 sums; detects the
// containerd config version from the installed containerd (2.x reads version 3, 1.x version 2)
// and the kubelet's cgroup driver (systemd on AL2023; gVisor issue 10371: runsc must then run
// with systemd-cgroup); and registers the runtime in a drop-in under /etc/containerd/config.d,
// which nodeadm's containerd config imports, with runsc's own flags in
// /etc/containerd/runsc.toml. Karpenter merges its own NodeConfig (cluster details) into the
// document. The node's startup taint stays until the verify-only node installer has seen runsc
// registered in containerd's running configuration.
func EKSUserData(o UserDataOptions) (string, error) {
	base, err := validateBaseURL(o.BinaryBaseURL)
	if err != nil {
		return "", err
	}

	var b strings.Builder
	b.WriteString("MIME-Version: 1.0\n")
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\n\n", mimeBoundary)

	fmt.Fprintf(&b, "--%s\n", mimeBoundary)
	b.WriteString("Content-Type: text/x-shellscript; charset=\"us-ascii\"\n\n")
	r := strings.NewReplacer("@BASE@", base, "@PATHV3@", ContainerdRuntimePathV3, "@PATHV2@", ContainerdRuntimePathV2)
	b.WriteString(r.Replace(installScript))

	fmt.Fprintf(&b, "\n--%s--\n", mimeBoundary)
	return b.String(), nil
}

// installScript downloads runsc and its containerd shim, checks their published SHA-512 sums,
// installs them where containerd finds the shim (PATH) and registers the runtime for the
// node's containerd config version and cgroup driver.
const installScript = `#!/bin/bash
# fusebox: install gVisor (runsc, containerd-shim-runsc-v1) before containerd starts.
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
# containerd 2.x reads config version 3, 1.x version 2: the runtime's table differs.
ver="$(containerd --version 2>/dev/null | grep -Eo ' v?[0-9]+\.[0-9]+' | head -n 1 | tr -d ' v')"
case "${ver%%.*}" in
  1) version=2; table='@PATHV2@' ;;
  2|3) version=3; table='@PATHV3@' ;;
  *) echo "fusebox: cannot tell containerd's version (${ver:-none})" >&2; exit 1 ;;
esac
# AL2023's nodeadm runs the kubelet and containerd with the systemd cgroup driver (on cgroup
# v2); a kubelet configuration saying cgroupfs wins.
cgroup=true
for f in /etc/kubernetes/kubelet/config.json /etc/kubernetes/kubelet/config.json.d/*.conf; do
  if [[ -f $f ]] && grep -Eq '"cgroupDriver"[[:space:]]*:[[:space:]]*"cgroupfs"' "$f"; then cgroup=false; fi
done
if [[ ! -d /run/systemd/system ]]; then cgroup=false; fi
mkdir -p /etc/containerd/config.d
cat >/etc/containerd/runsc.toml <<RUNSC
# Added by fusebox: runsc flags for containerd-shim-runsc-v1.
[runsc_config]
  systemd-cgroup = "$cgroup"
RUNSC
cat >/etc/containerd/config.d/fusebox-runsc.toml <<DROPIN
version = $version

# Added by fusebox: the gVisor runtime.
[$table]
  runtime_type = "io.containerd.runsc.v1"
[$table.options]
  TypeUrl = "io.containerd.runsc.v1.options"
  ConfigPath = "/etc/containerd/runsc.toml"
DROPIN
echo "fusebox: runsc registered for containerd $ver (config version $version, systemd-cgroup $cgroup)" >&2
`
