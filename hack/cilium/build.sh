#!/usr/bin/env bash
# Build Cilium's agent and CNI plugin (this folder's module pins github.com/cilium/cilium from
# the Go module proxy) into OUTDIR, with what the agent reads at run time beside them: the
# datapath's C sources (OUTDIR/lib/bpf, compiled by clang when the agent starts) and the
# CustomResourceDefinitions (OUTDIR/crds). The real-node tests' cilium flavour runs them as
# host processes (test/nodetest, FUSEBOX_CILIUM_BIN=OUTDIR). Needs Go >= 1.26.0.
#
# cilium-operator is not built: it imports sigs.k8s.io/mcs-api/controllers v0.5.2, which the
# module proxy refuses ("This module version is not available", as are v0.5.3 and v0.6.0).
# The test node registers the CRDs itself (the operator's job at start) and runs the agent in
# the modes that need no operator (IPAM from the Node's podCIDR, identities as CRDs).
# Usage: hack/cilium/build.sh OUTDIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
CILIUM=$(cd "$HERE" && go list -m -f '{{.Version}}' github.com/cilium/cilium)
stamp="$OUT/.stamp-$CILIUM-$(cat "$HERE/go.mod" "$HERE/go.sum" "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$OUT/cilium-agent" ]; then echo "cilium $CILIUM up to date in $OUT"; exit 0; fi
# Build beside the targets and rename: a test may be running the old ones.
for b in cilium-agent:daemon cilium-cni:plugins/cilium-cni; do
  ( cd "$HERE" && go build -trimpath -ldflags "-s -w" -o "$OUT/.${b%%:*}.tmp" "github.com/cilium/cilium/${b#*:}" )
done
# The module's directory, known once the build has downloaded it.
SRC=$(cd "$HERE" && go list -m -f '{{.Dir}}' github.com/cilium/cilium)
[ -d "$SRC/bpf" ] || { echo "cilium $CILIUM: no datapath sources in the module cache ($SRC)" >&2; exit 1; }
rm -rf "$OUT/lib" "$OUT/crds"
mkdir -p "$OUT/lib" "$OUT/crds"
cp -r "$SRC/bpf" "$OUT/lib/bpf"
cp "$SRC"/pkg/k8s/apis/cilium.io/client/crds/v2/*.yaml "$SRC"/pkg/k8s/apis/cilium.io/client/crds/v2alpha1/*.yaml "$OUT/crds/"
chmod -R u+w "$OUT/lib" "$OUT/crds"
for b in cilium-agent cilium-cni; do mv -f "$OUT/.$b.tmp" "$OUT/$b"; done
rm -f "$OUT"/.stamp-*
touch "$stamp"
echo "cilium $CILIUM (agent, CNI plugin, datapath sources, CRDs) in $OUT"
