#!/usr/bin/env bash
# Start/stop a real Kubernetes node on this machine for integration tests: containerd v2 with
# the gVisor shim (the pinned runsc, systrap), a kubelet, bridge CNI on a bridge this script
# creates (a private /24: no forwarding, no NAT, no route off the machine) and kube-router as
# the NetworkPolicy agent, against a control plane started by test/kubetest/control-plane.sh.
#
# Usage: node.sh start-runtime|start-kubelet|start-kube-router|start-kube-proxy|stop NODE_DIR
# env:   NODE_BIN (containerd, ctr, containerd-shim-runsc-v1, kubelet, kube-router, cni/),
#        RUNSC, CP (the control plane's state directory: kubeconfig, pki/), NODE_NAME,
#        BRIDGE (interface name), NET (the /24's first three octets, e.g. 10.213.0),
#        KUBELET_PORT, KUBELET_HEALTHZ_PORT,
#        SERVICE_CIDR (set: Services are reachable from pods and from this host through
#        kube-proxy: pods and the host route it to the bridge, never off the machine).
# stop undoes what the start verbs did, including what the kubelet changes on the host
# (sysctls, iptables chains, cgroups), and kills only processes recorded in NODE_DIR/pids or
# shims serving NODE_DIR's containerd.
set -euo pipefail
CMD=${1:?start-runtime|start-kubelet|start-kube-router|stop}
N=$(mkdir -p "${2:?node directory}" && cd "$2" && pwd)
NODE_NAME=${NODE_NAME:-fusebox-node}; BRIDGE=${BRIDGE:-fbnode0}; NET=${NET:-10.213.0}
KUBELET_PORT=${KUBELET_PORT:-20250}; KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-20248}
CGROUP=fusebox-node
SOCK=$N/containerd/containerd.sock

start_bg() {  # NAME CMD...: start in its own session, log to logs/NAME.log, pid to pids/NAME
  local name=$1; shift
  setsid nohup "$@" >>"$N/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$N/pids/$name"
}

stop_pid() {  # NAME [SIGNAL]: TERM (or SIGNAL), wait up to 10 s, then KILL
  local f=$N/pids/$1 pid; [ -f "$f" ] || return 0; pid=$(cat "$f"); rm -f "$f"
  kill -"${2:-TERM}" "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

case $CMD in
start-runtime)
  : "${NODE_BIN:?}" "${RUNSC:?}" "${CP:?}"
  mkdir -p "$N"/{pids,logs,state,etc,cni/net.d,cni/ipam,containerd,kubelet,pod-logs,run}
  # What stop restores: the sysctls the kubelet changes, the host directories it creates.
  [ -f "$N/state/sysctl-before" ] || for k in vm.overcommit_memory vm.panic_on_oom kernel.panic \
      kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
    echo "$k=$(sysctl -n $k)"; done >"$N/state/sysctl-before"
  [ -f "$N/state/created-dirs" ] || for d in /var/log/containers /var/log/pods /var/lib/kubelet \
      /var/lib/cni /run/containerd /etc/cni; do [ -e "$d" ] || echo "$d"; done >"$N/state/created-dirs"
  # cgroup v1: a private parent for the kubelet's kubepods tree (kubelet cgroupRoot).
  for c in cpu cpuacct cpuset memory devices freezer blkio pids systemd; do mkdir -p "/sys/fs/cgroup/$c/$CGROUP"; done
  cat /sys/fs/cgroup/cpuset/cpuset.cpus >/sys/fs/cgroup/cpuset/$CGROUP/cpuset.cpus
  cat /sys/fs/cgroup/cpuset/cpuset.mems >/sys/fs/cgroup/cpuset/$CGROUP/cpuset.mems
  # The pods' bridge: the node's address is .1; pods get only the connected route.
  ip link show "$BRIDGE" >/dev/null 2>&1 || {
    ip link add "$BRIDGE" type bridge; ip addr add "$NET.1/24" dev "$BRIDGE"; ip link set "$BRIDGE" up; }
  # Service addresses: the host's route sends them to the bridge (kube-proxy's DNAT picks the
  # endpoint; an address nobody serves goes nowhere), the pods' to the node. The host does not
  # forward (net.ipv4.ip_forward stays as it is), so nothing a pod sends leaves the bridge.
  routes=""
  if [ -n "${SERVICE_CIDR:-}" ]; then
    ip route replace "$SERVICE_CIDR" dev "$BRIDGE" src "$NET.1"
    routes=",\"routes\":[{\"dst\":\"$SERVICE_CIDR\",\"gw\":\"$NET.1\"}]"
  fi
  : >"$N/etc/resolv.conf"  # pods are never handed the host's resolver
  cat >"$N/etc/runsc.toml" <<EOF
binary_name = "$RUNSC"
root = "$N/run/runsc"
[runsc_config]
  platform = "systrap"
EOF
  cat >"$N/cni/net.d/10-fusebox-node.conflist" <<EOF
{"cniVersion":"1.0.0","name":"fusebox-node","plugins":[{"type":"bridge","bridge":"$BRIDGE",
 "isGateway":false,"isDefaultGateway":false,"ipMasq":false,"hairpinMode":true,
 "ipam":{"type":"host-local","dataDir":"$N/cni/ipam",
  "ranges":[[{"subnet":"$NET.0/24","rangeStart":"$NET.10","rangeEnd":"$NET.250"}]]$routes}}]}
EOF
  cat >"$N/etc/containerd.toml" <<EOF
version = 3
imports = []
root  = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = "$N/containerd/debug.sock"
  level = "info"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "localhost/fusebox-test/pause:v1"
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  # No CAP_SYS_RESOURCE here: never ask the shim for an oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runsc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$N/etc/runsc.toml"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$NODE_BIN/cni"]
    conf_dir = "$N/cni/net.d"
    max_conf_num = 1
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/containerd/opt"
EOF
  PATH=$NODE_BIN:$PATH start_bg containerd "$NODE_BIN/containerd" --config "$N/etc/containerd.toml"
  ;;
start-kubelet)
  : "${NODE_BIN:?}" "${CP:?}"
  cat >"$N/etc/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
failSwapOn: false
address: $NET.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
podLogsDir: $N/pod-logs
volumePluginDir: $N/kubelet/volume-plugins
staticPodPath: ""
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $CP/pki/ca.crt}
authorization:
  mode: AlwaysAllow
oomScoreAdj: 0
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
resolvConf: $N/etc/resolv.conf
maxPods: 60
registerNode: true
nodeStatusReportFrequency: 10s
syncFrequency: 10s
runtimeRequestTimeout: 2m
localStorageCapacityIsolation: true
EOF
  start_bg kubelet "$NODE_BIN/kubelet" --config="$N/etc/kubelet-config.yaml" \
    --kubeconfig="$CP/kubeconfig" --root-dir="$N/kubelet" --cert-dir="$N/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NET.1" --v=1
  ;;
start-kube-router)
  : "${NODE_BIN:?}" "${CP:?}"
  # NetworkPolicy only (iptables-nft and ipset): no routing, no service proxy, no CNI.
  start_bg kube-router "$NODE_BIN/kube-router" --kubeconfig="$CP/kubeconfig" --hostname-override="$NODE_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --health-port=0 --metrics-port=0 --service-cluster-ip-range=10.0.0.0/24 -v=1
  ;;
start-kube-proxy)
  : "${NODE_BIN:?}" "${CP:?}" "${SERVICE_CIDR:?}"
  # iptables mode; only this node's pods count as the cluster (other sources are masqueraded,
  # so the host's own connections come back through it); no NodePorts off the bridge, no
  # route_localnet, and the conntrack sysctls left alone.
  start_bg kube-proxy "$NODE_BIN/kube-proxy" --kubeconfig="$CP/kubeconfig" --hostname-override="$NODE_NAME" \
    --proxy-mode=iptables --cluster-cidr="$NET.0/24" --nodeport-addresses="$NET.1/32" \
    --iptables-localhost-nodeports=false --healthz-bind-address=127.0.0.1:20256 \
    --metrics-bind-address=127.0.0.1:20249 --conntrack-max-per-core=0 \
    --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 -v=1
  ;;
stop)
  # Best effort from here on: every step runs even if one before it failed.
  set +e +o pipefail
  stop_pid kube-proxy
  stop_pid kube-router
  stop_pid kubelet
  stop_pid containerd
  # Shims of this containerd (their command line names its socket), then what runsc left.
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$SOCK"; then kill -9 "${p#/proc/}" 2>/dev/null || true; fi
  done
  if [ -n "${RUNSC:-}" ] && [ -x "$RUNSC" ]; then
    for r in "$N"/run/runsc/*/ "$N"/run/runsc; do [ -d "$r" ] || continue
      for id in $("$RUNSC" --root "$r" list -quiet 2>/dev/null); do "$RUNSC" --root "$r" delete -force "$id" >/dev/null 2>&1 || true; done
    done
  fi
  # Netfilter state of kube-router and the kubelet (KUBE-* chains, ipsets).
  if command -v iptables >/dev/null; then
    for ipt in iptables ip6tables; do for tb in filter nat mangle; do
      "$ipt" -t $tb -S 2>/dev/null | grep -E '^-A .* -j KUBE-' | grep -vE '^-A KUBE-' | sed 's/^-A/-D/' |
        while read -r r; do eval "$ipt" -t $tb "$r" || true; done
      for ch in $("$ipt" -t $tb -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do "$ipt" -t $tb -F "$ch" || true; done
      for ch in $("$ipt" -t $tb -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do "$ipt" -t $tb -X "$ch" || true; done
    done; done
  fi
  if command -v ipset >/dev/null; then
    ipset list -n 2>/dev/null | grep '^KUBE-' | while read -r s; do ipset destroy "$s" || true; done
  fi
  # Mounts under the node directory (deepest first), the bridge, the cgroups.
  awk -v n="$N" 'index($5, n) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
  for c in cpu cpuacct cpuset memory devices freezer blkio pids systemd; do c=/sys/fs/cgroup/$c/$CGROUP
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if [ -f "$N/state/sysctl-before" ]; then
    while IFS== read -r k v; do sysctl -qw "$k=$v" || true; done <"$N/state/sysctl-before"
  fi
  if [ -f "$N/state/created-dirs" ]; then
    while read -r d; do [ -n "$d" ] && rm -rf "$d"; done <"$N/state/created-dirs"
  fi
  rm -f "$N/state/sysctl-before" "$N/state/created-dirs"
  ;;
*) echo "unknown command $CMD" >&2; exit 2 ;;
esac
