#!/bin/bash
# fusebox gVisor node installer, run by the fusebox-gvisor-installer DaemonSet on AKS sandbox
# nodes (AKSNodeClass has no userData). It installs runsc and containerd-shim-runsc-v1 on the
# host, registers the runsc runtime with containerd, restarts containerd if anything changed,
# removes the Karpenter startup taint fusebox.dev/gvisor-not-ready:NoSchedule from the node
# (it keeps sandbox pods off the node until now), labels the node fusebox.dev/gvisor=ready and
# then waits (a DaemonSet pod must keep running). When a step fails (a download whose SHA-256
# does not match, containerd not coming back) the script exits before touching the node, so the
# taint stays and no sandbox pod is scheduled there. Every step is idempotent: a restarted pod
# re-checks and changes nothing that is in place.
#
# With MODE=verify (EKS, where the EC2NodeClass userData installed gVisor before the kubelet
# started) nothing is downloaded or changed on the host: the script checks that runsc and the
# shim are installed and that containerd's running configuration has the runsc runtime, and
# only then removes the taint and labels the node.
#
# Environment (set by the DaemonSet):
#   MODE                install (default) or verify
#   BINARY_BASE_URL     <base>/<arch>/runsc and <base>/<arch>/containerd-shim-runsc-v1
#   SHA256_RUNSC_<ARCH>, SHA256_SHIM_<ARCH>   expected SHA-256 of each binary (ARCH X86_64 or AARCH64)
#   NODE_NAME           the node to untaint and label (downward API)
#   STARTUP_TAINT       key of the startup taint to remove (effect NoSchedule)
#   HOST_ROOT           where the host's root is mounted (default /host)
set -euo pipefail

HOST_ROOT="${HOST_ROOT:-/host}"
SA_DIR="${SA_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}"
READY_FILE="${READY_FILE:-/tmp/fusebox-gvisor-ready}"
READY_LABEL="${READY_LABEL:-fusebox.dev/gvisor}"
STARTUP_TAINT="${STARTUP_TAINT:-fusebox.dev/gvisor-not-ready}"
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

# systemd_cgroup prints "true" when the kubelet uses the systemd cgroup driver (read from the
# kubelet's configuration, else from runc's SystemdCgroup in containerd's config), else
# "false". runsc must then be told so (gVisor issue 10371), or its pods fail to start.
systemd_cgroup() {
  local f
  for f in "$HOST_ROOT/var/lib/kubelet/config.yaml" "$HOST_ROOT/etc/kubernetes/kubelet/config.json" "$HOST_ROOT/etc/default/kubelet"; do
    if [[ -f $f ]] && grep -Eq '"?cgroupDriver"?[[:space:]]*[:=][[:space:]]*"?systemd' "$f"; then
      echo true
      return 0
    fi
    if [[ -f $f ]] && grep -Eq -- '--cgroup-driver[= ]systemd' "$f"; then
      echo true
      return 0
    fi
  done
  if grep -Eq '^[[:space:]]*SystemdCgroup[[:space:]]*=[[:space:]]*true' "$HOST_ROOT/etc/containerd/config.toml" 2>/dev/null; then
    echo true
    return 0
  fi
  echo false
}

# runsc_config writes runsc's own configuration (its flags, read by the shim) and prints
# "changed" or "unchanged".
runsc_config() {
  local path="$HOST_ROOT/etc/containerd/runsc.toml" want
  want="$(printf '# Added by fusebox: runsc flags for containerd-shim-runsc-v1.\n[runsc_config]\n  systemd-cgroup = "%s"' "$(systemd_cgroup)")"
  if [[ -f $path && "$(cat "$path")" == "$want" ]]; then
    echo unchanged
    return 0
  fi
  mkdir -p "$(dirname "$path")"
  printf '%s\n' "$want" >"$path.tmp"
  mv -f "$path.tmp" "$path"
  echo changed
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
  body="$(printf '[%s]\n  runtime_type = "%s"\n[%s.options]\n  TypeUrl = "io.containerd.runsc.v1.options"\n  ConfigPath = "/etc/containerd/runsc.toml"' "$table" "$RUNTIME_TYPE" "$table")"
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

# node_api METHOD [CONTENT-TYPE DATA] sends a request about this node to the API server with
# the pod's service account (its cluster role: get and patch nodes) and prints the response.
node_api() {
  local api="https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}"
  local args=(-fsS --retry 5 --cacert "$SA_DIR/ca.crt" -H "Authorization: Bearer $(cat "$SA_DIR/token")")
  if [[ $# -gt 1 ]]; then
    args+=(-H "Content-Type: $2" --data "$3")
  fi
  curl "${args[@]}" -X "$1" "$api/api/v1/nodes/$NODE_NAME"
}

# startup_taint_index NODE_JSON prints the index in spec.taints of the taint
# $STARTUP_TAINT:NoSchedule, or nothing when the node does not carry it. The JSON is read with
# patterns, not parsed: the first "taints" key outside a string (a quote inside a JSON string
# is always escaped) is spec.taints (metadata, which comes first, has only "f:taints" keys in
# managedFields), and taint entries contain neither braces nor brackets (keys, values, effects
# and times have no such characters). remove_startup_taint's JSON patch checks the entry again
# on the server, so a wrong index removes nothing.
startup_taint_index() {
  local list entry i=0
  local re='[{,][[:space:]]*"taints"[[:space:]]*:[[:space:]]*\[([^]]*)\]'
  [[ $1 =~ $re ]] || return 0
  list="${BASH_REMATCH[1]}"
  while [[ $list =~ \{([^}]*)\} ]]; do
    entry="${BASH_REMATCH[1]//[[:space:]]/}"
    list="${list#*"${BASH_REMATCH[0]}"}"
    if [[ ",$entry," == *",\"key\":\"$STARTUP_TAINT\","* && ",$entry," == *',"effect":"NoSchedule",'* ]]; then
      echo "$i"
      return 0
    fi
    i=$((i + 1))
  done
}

# remove_startup_taint removes $STARTUP_TAINT:NoSchedule from the node and leaves its other
# taints. Node taints are an atomic list, which a strategic merge patch would replace whole,
# so it sends a JSON patch that tests that the entry at the index it read is still that taint
# before removing it: if the taints changed in between (another controller), the server refuses
# the patch and it reads the node again. A node without the taint is left alone.
remove_startup_taint() {
  local attempt node i patch
  if [[ ! $STARTUP_TAINT =~ ^[A-Za-z0-9][-A-Za-z0-9_./]*$ ]]; then
    log "bad STARTUP_TAINT key $STARTUP_TAINT"
    return 1
  fi
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    node="$(node_api GET)" || return 1
    i="$(startup_taint_index "$node")"
    if [[ -z $i ]]; then
      return 0
    fi
    patch="[{\"op\":\"test\",\"path\":\"/spec/taints/$i/key\",\"value\":\"$STARTUP_TAINT\"}"
    patch+=",{\"op\":\"test\",\"path\":\"/spec/taints/$i/effect\",\"value\":\"NoSchedule\"}"
    patch+=",{\"op\":\"remove\",\"path\":\"/spec/taints/$i\"}]"
    if node_api PATCH application/json-patch+json "$patch" >/dev/null; then
      log "removed the startup taint $STARTUP_TAINT from $NODE_NAME"
    else
      log "removing the startup taint $STARTUP_TAINT (attempt $attempt) failed; reading the node again"
      sleep 2
    fi
  done
  log "the startup taint $STARTUP_TAINT is still on $NODE_NAME"
  return 1
}

# label_node marks the node ready for sandboxes through the API server.
label_node() {
  node_api PATCH application/merge-patch+json \
    "{\"metadata\":{\"labels\":{\"$READY_LABEL\":\"ready\"}}}" >/dev/null
}

# verify_installed checks, without changing anything, that runsc and its shim are installed
# and that containerd's running configuration has the runsc runtime.
verify_installed() {
  local bin
  for bin in runsc containerd-shim-runsc-v1; do
    if [[ ! -x $HOST_ROOT$BIN_DIR/$bin ]]; then
      log "$BIN_DIR/$bin is not installed on this node"
      return 1
    fi
  done
  if ! nsenter --target 1 --mount --uts --ipc --net --pid -- containerd config dump 2>/dev/null | grep -Eq 'containerd\.runtimes\.(runsc|'"'"'runsc'"'"')\]'; then
    log "containerd's configuration has no runsc runtime"
    return 1
  fi
}

main() {
  : "${NODE_NAME:?}"
  local bins=unchanged cfg=unchanged rcfg=unchanged
  if [[ ${MODE:-install} == verify ]]; then
    verify_installed
  else
    : "${BINARY_BASE_URL:?}"
    bins="$(install_binaries)"
    rcfg="$(runsc_config)"
    cfg="$(configure_containerd)"
    if [[ $bins == changed || $cfg == changed || $rcfg == changed ]]; then
      restart_containerd
    fi
  fi
  # Only now that runsc works: sandbox pods may be scheduled here once the taint is gone.
  remove_startup_taint
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
