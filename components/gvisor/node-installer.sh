#!/bin/bash
# fusebox gVisor node installer, run by the fusebox-gvisor-installer DaemonSet on AKS sandbox
# nodes (AKSNodeClass has no userData). It installs runsc and containerd-shim-runsc-v1 on the
# host, registers the runsc runtime with containerd, restarts containerd if anything changed,
# labels the node fusebox.dev/gvisor=ready and then waits (a DaemonSet pod must keep running).
# Every step is idempotent: a restarted pod re-checks and changes nothing that is in place.
#
# Environment (set by the DaemonSet):
#   BINARY_BASE_URL     <base>/<arch>/runsc and <base>/<arch>/containerd-shim-runsc-v1
#   SHA256_RUNSC_<ARCH>, SHA256_SHIM_<ARCH>   expected SHA-256 of each binary (ARCH X86_64 or AARCH64)
#   NODE_NAME           the node to label (downward API)
#   HOST_ROOT           where the host's root is mounted (default /host)
set -euo pipefail

HOST_ROOT="${HOST_ROOT:-/host}"
SA_DIR="${SA_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}"
READY_FILE="${READY_FILE:-/tmp/fusebox-gvisor-ready}"
READY_LABEL="${READY_LABEL:-fusebox.dev/gvisor}"
BIN_DIR=/usr/local/bin
DROPIN_NAME=fusebox-runsc.toml
RUNTIME_TYPE=io.containerd.runsc.v1

log() { echo "fusebox-gvisor: $*" >&2; }

# runtime_table CONFIG prints the TOML table of the runsc runtime for CONFIG's version: config
# version 3 (containerd 2.x) moved the CRI runtimes to "io.containerd.cri.v1.runtime"; version 2
# (AKS Ubuntu and AzureLinux nodes) keeps them under "io.containerd.grpc.v1.cri".
runtime_table() {
  if grep -Eq '^[[:space:]]*version[[:space:]]*=[[:space:]]*3([[:space:]]|#|$)' "$1"; then
    echo 'plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc'
  else
    echo 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc'
  fi
}

# imports_dir CONFIG prints the host directory of CONFIG's first "<dir>/*.toml" import, and
# fails when CONFIG imports no such directory.
imports_dir() {
  local line dir
  line="$(grep -E '^[[:space:]]*imports[[:space:]]*=' "$1" | head -n 1)" || return 1
  [[ $line =~ \"([^\"]+)/\*\.toml\" ]] || return 1
  dir="${BASH_REMATCH[1]}"
  # containerd resolves relative imports against the config file's directory.
  [[ $dir == /* ]] || dir="/etc/containerd/$dir"
  echo "$dir"
}

# configure_containerd adds the runsc runtime to the host's containerd config and prints
# "changed" or "unchanged". With an imports directory it writes a drop-in there; otherwise it
# appends the runtime table to config.toml once.
configure_containerd() {
  local config="$HOST_ROOT/etc/containerd/config.toml" table version body dir dropin want
  if [[ ! -f $config ]]; then
    log "no containerd config at $config"
    return 1
  fi
  table="$(runtime_table "$config")"
  version=2
  [[ $table == *'"io.containerd.cri.v1.runtime"'* ]] && version=3
  body="$(printf '[%s]\n  runtime_type = "%s"' "$table" "$RUNTIME_TYPE")"
  if grep -Fq "[$table]" "$config"; then
    echo unchanged
    return 0
  fi
  if dir="$(imports_dir "$config")"; then
    dropin="$HOST_ROOT$dir/$DROPIN_NAME"
    want="$(printf 'version = %s\n\n# Added by fusebox: the gVisor runtime.\n%s' "$version" "$body")"
    if [[ -f $dropin && "$(cat "$dropin")" == "$want" ]]; then
      echo unchanged
      return 0
    fi
    mkdir -p "$HOST_ROOT$dir"
    printf '%s\n' "$want" >"$dropin.tmp"
    mv -f "$dropin.tmp" "$dropin"
    echo changed
    return 0
  fi
  printf '\n# Added by fusebox: the gVisor runtime.\n%s\n' "$body" >>"$config"
  echo changed
}

# install_binaries downloads, verifies and installs runsc and its shim where they differ from
# the configured checksums, and prints "changed" or "unchanged".
install_binaries() {
  local arch var want bin dest tmp changed=unchanged
  case "$(uname -m)" in
    x86_64) arch=x86_64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *) log "unsupported architecture $(uname -m)"; return 1 ;;
  esac
  tmp="$(mktemp -d)"
  for bin in runsc containerd-shim-runsc-v1; do
    var="SHA256_RUNSC_${arch^^}"
    [[ $bin == runsc ]] || var="SHA256_SHIM_${arch^^}"
    want="${!var:-}"
    if [[ ! $want =~ ^[0-9a-f]{64}$ ]]; then
      log "no SHA-256 configured for $arch/$bin ($var)"
      rm -rf "$tmp"
      return 1
    fi
    dest="$HOST_ROOT$BIN_DIR/$bin"
    if [[ -f $dest ]] && [[ "$(sha256sum "$dest" | cut -d' ' -f1)" == "$want" ]]; then
      continue
    fi
    log "downloading $BINARY_BASE_URL/$arch/$bin"
    if ! curl -fsSL --retry 5 -o "$tmp/$bin" "$BINARY_BASE_URL/$arch/$bin"; then
      log "downloading $arch/$bin failed"
      rm -rf "$tmp"
      return 1
    fi
    if ! echo "$want  $tmp/$bin" | sha256sum -c --status -; then
      log "$arch/$bin from $BINARY_BASE_URL does not have the configured SHA-256 $want"
      rm -rf "$tmp"
      return 1
    fi
    mkdir -p "$HOST_ROOT$BIN_DIR"
    # Through a temporary file and a rename: a running shim keeps its old inode.
    install -m 0755 "$tmp/$bin" "$dest.fusebox-new"
    mv -f "$dest.fusebox-new" "$dest"
    changed=changed
  done
  rm -rf "$tmp"
  echo "$changed"
}

# restart_containerd restarts containerd in the host's namespaces (the pod has hostPID).
restart_containerd() {
  log "restarting containerd"
  nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd
  nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl is-active --quiet containerd
}

# label_node marks the node ready for sandboxes through the API server.
label_node() {
  local api="https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}"
  curl -fsS --retry 5 -o /dev/null \
    --cacert "$SA_DIR/ca.crt" \
    -H "Authorization: Bearer $(cat "$SA_DIR/token")" \
    -H 'Content-Type: application/merge-patch+json' \
    -X PATCH "$api/api/v1/nodes/$NODE_NAME" \
    --data "{\"metadata\":{\"labels\":{\"$READY_LABEL\":\"ready\"}}}"
}

main() {
  : "${BINARY_BASE_URL:?}" "${NODE_NAME:?}"
  local bins cfg
  bins="$(install_binaries)"
  cfg="$(configure_containerd)"
  if [[ $bins == changed || $cfg == changed ]]; then
    restart_containerd
  fi
  label_node
  touch "$READY_FILE"
  log "runsc installed on $NODE_NAME (binaries $bins, containerd config $cfg)"
  # Keep the pod running; exit promptly when it is deleted.
  trap 'exit 0' TERM INT
  sleep infinity &
  wait
}

if [[ ${FUSEBOX_INSTALLER_LIB:-} != 1 ]]; then
  main "$@"
fi
