#!/bin/bash
# fusebox gVisor node installer, run by the fusebox-gvisor-installer DaemonSet on AKS sandbox
# nodes (AKSNodeClass has no userData). It installs runsc and containerd-shim-runsc-v1 on the
# host from its own image (/opt/gvisor, put there by `fusebox image build` with their SHA-256
# in /opt/gvisor/SHA256SUMS), registers the runsc runtime with containerd, restarts containerd
# if anything changed, removes the Karpenter startup taint fusebox.dev/gvisor-not-ready:
# NoSchedule from the node (it keeps sandbox pods off the node until now), labels the node
# fusebox.dev/gvisor=ready and then waits (a DaemonSet pod must keep running). Nothing is
# downloaded. When a step fails (a binary whose SHA-256 is not the one recorded at image
# build, containerd not coming back) the script exits before touching the node, so the taint
# stays and no sandbox pod is scheduled there. Every step is idempotent: a restarted pod
# re-checks and changes nothing that is in place.
#
# With MODE=verify (EKS, where the EC2NodeClass userData installed gVisor before the kubelet
# started) nothing is changed on the host: the script checks that runsc and the shim are
# installed and that containerd's running configuration has the runsc runtime, and only then
# removes the taint and labels the node.
#
# Environment (set by the DaemonSet):
#   MODE                install (default) or verify
#   NODE_NAME           the node to untaint and label (downward API)
#   STARTUP_TAINT       key of the startup taint to remove (effect NoSchedule)
#   HOST_ROOT           where the host's root is mounted (default /host)
#   IMAGE_BIN_DIR       the image's binaries and their SHA256SUMS (default /opt/gvisor)
set -euo pipefail

HOST_ROOT="${HOST_ROOT:-/host}"
IMAGE_BIN_DIR="${IMAGE_BIN_DIR:-/opt/gvisor}"
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
# "changed" or "unchanged", keeping every setting the node has.
#
# A version 2 config (AKS's, read by containerd 1.7 or 2.x) gets the runtime table appended to
# config.toml itself, even where it imports a drop-in directory: containerd 1.7 merges an
# imported file by replacing each plugin's whole section with the import's (mergeConfig in
# services/server/config/config.go; containerd issues #5837 and #7982), so a drop-in holding the
# runsc runtime would replace the node's whole CRI plugin section: its runc runtime, sandbox
# image and registry settings. A drop-in that an earlier installer wrote there is removed. A
# version 3 config (containerd 2.x, which merges imports key by key) with an imports directory
# gets a drop-in; without one, the table is appended.
configure_containerd() {
  local config="$HOST_ROOT/etc/containerd/config.toml" table version body dir="" dropin want changed=unchanged
  if [[ ! -f $config ]]; then
    log "no containerd config at $config"
    return 1
  fi
  table="$(runtime_table "$config")"
  version=2
  [[ $table == *'"io.containerd.cri.v1.runtime"'* ]] && version=3
  body="$(printf '[%s]\n  runtime_type = "%s"\n[%s.options]\n  TypeUrl = "io.containerd.runsc.v1.options"\n  ConfigPath = "/etc/containerd/runsc.toml"' "$table" "$RUNTIME_TYPE" "$table")"
  dir="$(imports_dir "$config")" || dir=""
  if [[ $version == 2 && -n $dir && -f $HOST_ROOT$dir/$DROPIN_NAME ]]; then
    log "removing $dir/$DROPIN_NAME: containerd 1.7 would let it replace the node's CRI settings"
    rm -f "$HOST_ROOT$dir/$DROPIN_NAME"
    changed=changed
  fi
  if grep -Fq "[$table]" "$config"; then
    echo "$changed"
    return 0
  fi
  if [[ $version == 3 && -n $dir ]]; then
    dropin="$HOST_ROOT$dir/$DROPIN_NAME"
    want="$(printf 'version = 3\n\n# Added by fusebox: the gVisor runtime.\n%s' "$body")"
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

# recorded_sum NAME prints the SHA-256 that the image build recorded for NAME in
# $IMAGE_BIN_DIR/SHA256SUMS (sha256sum's format), and fails unless there is exactly one
# well-formed line for it.
recorded_sum() {
  local sums="$IMAGE_BIN_DIR/SHA256SUMS" lines
  lines="$(grep -E "^[0-9a-f]{64}  $1\$" "$sums" 2>/dev/null)" || true
  if [[ -z $lines || $lines == *$'\n'* ]]; then
    log "$sums has no single SHA-256 of $1: the image was not made by fusebox image build"
    return 1
  fi
  echo "${lines%% *}"
}

# sha256 PATH prints the file's SHA-256.
sha256() {
  local out
  out="$(sha256sum "$1")" || return 1
  echo "${out%% *}"
}

# install_binaries installs the image's runsc and shim on the host where the host's copies
# differ, and prints "changed" or "unchanged". Both binaries are checked against the digests
# recorded at image build before either is installed, and each copy again before it replaces
# the host's, so a tampered or truncated binary is never installed.
install_binaries() {
  local bin want dest have changed=unchanged
  local -A sums
  for bin in runsc containerd-shim-runsc-v1; do
    want="$(recorded_sum "$bin")" || return 1
    have="$(sha256 "$IMAGE_BIN_DIR/$bin")" || return 1
    if [[ $have != "$want" ]]; then
      log "$IMAGE_BIN_DIR/$bin has SHA-256 $have, not $want as recorded at image build: not installing it"
      return 1
    fi
    sums[$bin]=$want
  done
  for bin in runsc containerd-shim-runsc-v1; do
    want="${sums[$bin]}"
    dest="$HOST_ROOT$BIN_DIR/$bin"
    if [[ -f $dest ]] && [[ "$(sha256 "$dest")" == "$want" ]]; then
      continue
    fi
    mkdir -p "$HOST_ROOT$BIN_DIR"
    # Through a temporary file and a rename: a running shim keeps its old inode.
    install -m 0755 "$IMAGE_BIN_DIR/$bin" "$dest.fusebox-new"
    have="$(sha256 "$dest.fusebox-new")" || return 1
    if [[ $have != "$want" ]]; then
      rm -f "$dest.fusebox-new"
      log "the copy of $bin on the host has SHA-256 $have, not $want: not installing it"
      return 1
    fi
    mv -f "$dest.fusebox-new" "$dest"
    log "installed $BIN_DIR/$bin (SHA-256 $want)"
    changed=changed
  done
  echo "$changed"
}

# restart_containerd restarts containerd in the host's namespaces (the pod has hostPID).
restart_containerd() {
  log "restarting containerd"
  nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd
  nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl is-active --quiet containerd
}

# node_api METHOD [CONTENT-TYPE DATA] sends a request about this node to the API server with
# the pod's service account (its cluster role: get and patch nodes; an admission policy admits
# only this node's startup taint removed and ready label set) and prints the response.
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
