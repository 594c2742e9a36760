package gvisor

import (
	"errors"
	"fmt"
	"strings"
)

// ContainerdRuntimePath is where the runsc runtime goes in containerd's config version 3, which
// AL2023's nodeadm writes (the version 2 path "io.containerd.grpc.v1.cri" is ignored there).
const ContainerdRuntimePath = `plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc`

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
// multipart document with a nodeadm NodeConfig that registers the runsc runtime with containerd
// (config version 3) and a shell script that downloads and verifies runsc and
// containerd-shim-runsc-v1. cloud-init runs the script before nodeadm starts containerd, and
// Karpenter merges its own NodeConfig (cluster details) into this document.
func EKSUserData(o UserDataOptions) (string, error) {
	base, err := validateBaseURL(o.BinaryBaseURL)
	if err != nil {
		return "", err
	}

	var b strings.Builder
	b.WriteString("MIME-Version: 1.0\n")
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\n\n", mimeBoundary)

	fmt.Fprintf(&b, "--%s\n", mimeBoundary)
	b.WriteString("Content-Type: application/node.eks.aws\n\n")
	b.WriteString(nodeConfig)

	fmt.Fprintf(&b, "\n--%s\n", mimeBoundary)
	b.WriteString("Content-Type: text/x-shellscript; charset=\"us-ascii\"\n\n")
	b.WriteString(strings.ReplaceAll(installScript, "@BASE@", base))

	fmt.Fprintf(&b, "\n--%s--\n", mimeBoundary)
	return b.String(), nil
}

// nodeConfig adds the runsc runtime to the containerd config nodeadm writes. No cluster
// details: Karpenter supplies them in its own NodeConfig part.
const nodeConfig = `---
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  containerd:
    config: |
      [` + ContainerdRuntimePath + `]
        runtime_type = "io.containerd.runsc.v1"
`

// installScript downloads runsc and its containerd shim, checks their published SHA-512 sums
// and installs them where containerd finds the shim (PATH).
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
`
