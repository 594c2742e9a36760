#!/usr/bin/env bash
# Build nodeadm-containerd (this folder's module: nodeadm's own parser, NodeConfig merge and
# containerd configuration, from the Go module proxy) into OUTDIR, for the EKS userData test
# (components/gvisor, FUSEBOX_NODEADM_BIN=OUTDIR). Needs Go >= 1.26.0.
# Usage: hack/nodeadm/build.sh OUTDIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
NODEADM=$(cd "$HERE" && go list -m -f '{{.Version}}' github.com/awslabs/amazon-eks-ami/nodeadm)
stamp="$OUT/.stamp-$NODEADM-$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/main.go" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$OUT/nodeadm-containerd" ]; then echo "nodeadm-containerd up to date in $OUT"; exit 0; fi
# Build beside the target and rename: a test may be running the old one.
( cd "$HERE" && go build -trimpath -ldflags "-s -w" -o "$OUT/.nodeadm-containerd.tmp" . )
mv -f "$OUT/.nodeadm-containerd.tmp" "$OUT/nodeadm-containerd"
rm -f "$OUT"/.stamp-*
touch "$stamp"
echo "nodeadm-containerd ($NODEADM) in $OUT"
