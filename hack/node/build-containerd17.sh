#!/usr/bin/env bash
# Builds containerd 1.7 (the containerd of AKS's config-version-2 nodes) from the Go module
# proxy into OUT/containerd, for components/gvisor's TestInstallerConfiguresContainerd
# (FUSEBOX_CONTAINERD17=OUT/containerd): it loads what the node installer writes with
# containerd 1.7's own config loading (imports replace whole plugin sections). Static, without
# the btrfs, devmapper, zfs and aufs snapshotters. Skips a binary already there.
# Usage: hack/node/build-containerd17.sh OUT
set -euo pipefail
OUT=$(mkdir -p "${1:?usage: build-containerd17.sh OUT}" && cd "$1" && pwd)
CONTAINERD=v1.7.35
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
[ -x "$OUT/containerd" ] && "$OUT/containerd" --version | grep -q " ${CONTAINERD#v}" && { echo "containerd $CONTAINERD in $OUT"; exit 0; }
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cd "$src"
# containerd 1.7's go.mod has an exclude directive, which `go install pkg@version` refuses: build
# it from a module of its own that requires it (and repeats the exclude).
cat >go.mod <<EOF
module fusebox.invalid/containerd17

go 1.22

require github.com/containerd/containerd $CONTAINERD

exclude github.com/mitchellh/osext v0.0.0-20151018003038-5e2d6d41470f
EOF
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/containerd/containerd/cmd/containerd"\n' >tools.go
go mod tidy
CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" \
  -ldflags "-s -w -X github.com/containerd/containerd/version.Version=${CONTAINERD#v}" \
  -o "$OUT/.containerd.tmp" github.com/containerd/containerd/cmd/containerd
mv -f "$OUT/.containerd.tmp" "$OUT/containerd"
"$OUT/containerd" --version
