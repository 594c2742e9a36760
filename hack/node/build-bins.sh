#!/usr/bin/env bash
# Builds the binaries of a real single-node Kubernetes data plane for the cluster test, from the
# Go module proxy only: containerd and ctr, the gVisor shim (containerd-shim-runsc-v1, same gVisor
# version as the pinned runsc, patched to run without CAP_SYS_RESOURCE), kubelet, kube-scheduler
# and kube-proxy (the same Kubernetes version as hack/k8s), the CNI plugins (bridge, loopback,
# host-local, portmap) and kube-router (NetworkPolicy). Each is built beside its target and
# renamed, so a node running from OUT keeps its binaries' inodes. Skips what is present.
# Usage: hack/node/build-bins.sh OUT
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mkdir -p "${1:?usage: build-bins.sh OUT}" && cd "$1" && pwd)
CONTAINERD=v2.4.2
GVISOR=v0.0.0-20260905035102-160fafc42237   # the Makefile's RUNSC_VERSION
K8S=v1.37.2; MAJ=1; MIN=37                  # hack/k8s/k8sbins/go.mod
CNI=v1.10.0
KUBE_ROUTER=v2.1.0
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
stamp="$OUT/.stamp-$CONTAINERD-$GVISOR-$K8S-$CNI-$KUBE_ROUTER"
[ -f "$stamp" ] && { echo "node binaries up to date in $OUT"; exit 0; }
t0=$(date +%s)
step() { echo "[node-bins $(( $(date +%s) - t0 ))s] $*"; }
have() { [ -x "$OUT/$1" ]; }
install_to() {  # NAME... -- go install ARGS: installs into a temp GOBIN, then renames each NAME
  local names=() tmp; while [ "$1" != -- ]; do names+=("$1"); shift; done; shift
  tmp=$(mktemp -d "$OUT/.build.XXXXXX")
  GOBIN="$tmp" go install "$@"
  for n in "${names[@]}"; do mv -f "$tmp/${n%%=*}" "$OUT/${n#*=}"; done
  rm -rf "$tmp"
}
if ! have containerd || ! have ctr; then
  step "containerd $CONTAINERD"
  CGO_ENABLED=0 install_to containerd ctr -- -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD" \
    github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD
fi
if ! have containerd-shim-runsc-v1; then
  step "gVisor shim $GVISOR (patched: tolerate EACCES on oom_score_adj)"
  src=$(mktemp -d)
  trap 'chmod -R u+w "$src" 2>/dev/null; rm -rf "$src"' EXIT
  ( cd "$src"
    printf 'module fusebox.invalid/shimbuild\n\ngo 1.26.0\n' > go.mod
    go get gvisor.dev/gvisor/shim@$GVISOR
    cp -r "$(go env GOMODCACHE)/gvisor.dev/gvisor@$GVISOR" gvisor && chmod -R u+w gvisor
    patch -s -p1 -d gvisor < "$HERE/shim-oom.patch"
    go mod edit -replace gvisor.dev/gvisor=./gvisor
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/.shim.tmp" gvisor.dev/gvisor/shim )
  mv -f "$OUT/.shim.tmp" "$OUT/containerd-shim-runsc-v1"
fi
LDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDF="$LDF -X $p.gitVersion=$K8S -X $p.gitMajor=$MAJ -X $p.gitMinor=$MIN -X $p.gitTreeState=clean"
done
for b in kubelet kube-scheduler kube-proxy; do
  have $b && continue
  step "$b $K8S"
  ( cd "$HERE/../k8s/k8sbins" && go build -trimpath -ldflags "$LDF" -o "$OUT/.$b.tmp" k8s.io/kubernetes/cmd/$b )
  mv -f "$OUT/.$b.tmp" "$OUT/$b"
done
if ! have cni/bridge; then
  step "CNI plugins $CNI"
  mkdir -p "$OUT/cni"
  CGO_ENABLED=0 install_to bridge=cni/bridge loopback=cni/loopback host-local=cni/host-local portmap=cni/portmap -- \
    -trimpath -ldflags "-s -w" \
    github.com/containernetworking/plugins/plugins/main/bridge@$CNI github.com/containernetworking/plugins/plugins/main/loopback@$CNI \
    github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI github.com/containernetworking/plugins/plugins/meta/portmap@$CNI
fi
if ! have kube-router; then
  step "kube-router $KUBE_ROUTER"
  install_to kube-router -- -trimpath -ldflags "-s -w" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER
fi
touch "$stamp"
step "done"; ls -la "$OUT" "$OUT/cni"
