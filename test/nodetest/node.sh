#!/usr/bin/env bash
# Start/stop a real Kubernetes node on this machine for integration tests: containerd v2 with
# the gVisor shim (the pinned runsc, systrap), a kubelet, and one of two pod networks against a
# control plane started by test/kubetest/control-plane.sh:
#   - kube-router (POLICY unset): bridge CNI on a bridge this script creates (a private /24: no
#     forwarding, no NAT, no route off the machine) and kube-router as the NetworkPolicy agent;
#   - cilium (POLICY=cilium): Cilium's agent and CNI plugin, pods on their own veths with
#     addresses from POD_CIDR (the Node's podCIDR), routed by this host. The bridge stays, as
#     the network outside the pods (the node's address, hosts a test adds). Cilium turns on
#     forwarding; a FORWARD chain of this script's, first in FORWARD, drops whatever would
#     leave through any interface but the bridge and Cilium's own, so nothing is routed off
#     the machine. Cilium also sets kernel.unprivileged_bpf_disabled=1, which holds until the
#     next boot (the kernel allows no way back); the other sysctls it changes are restored.
#
# Usage: node.sh start-runtime|start-kubelet|start-kube-router|start-cilium|start-kube-proxy|stop NODE_DIR
# env:   NODE_BIN (containerd, ctr, containerd-shim-runsc-v1, kubelet, kube-router, cni/),
#        RUNSC, CP (the control plane's state directory: kubeconfig, pki/), NODE_NAME,
#        BRIDGE (interface name), NET (the /24's first three octets, e.g. 10.213.0),
#        KUBELET_PORT, KUBELET_HEALTHZ_PORT,
#        SERVICE_CIDR (set: Services are reachable from pods and from this host through
#        kube-proxy: pods and the host route it to the bridge, never off the machine),
#        CLUSTER_DNS (set: the kubelet hands pods this nameserver, domain cluster.local),
#        POLICY=cilium with CILIUM_BIN (cilium-agent, cilium-cni, lib/bpf; hack/cilium) and
#        POD_CIDR.
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
POLICY=${POLICY:-kube-router}
FWD_CHAIN=FUSEBOX-NODE-FWD

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
  # Cilium's: forwarding, the reverse path filter, the reserved ports, the timers.
  [ -f "$N/state/sysctl-before" ] || for k in vm.overcommit_memory vm.panic_on_oom kernel.panic \
      kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes \
      net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding \
      net.ipv4.conf.all.rp_filter net.ipv4.conf.default.rp_filter net.ipv4.fib_multipath_use_neigh \
      net.ipv4.ip_local_reserved_ports net.ipv4.ip_early_demux kernel.timer_migration \
      net.core.fb_tunnels_only_for_init_net; do
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
  cni_bins="\"$NODE_BIN/cni\""
  if [ "$POLICY" = cilium ]; then
    : "${CILIUM_BIN:?}"
    cni_bins="$cni_bins, \"$CILIUM_BIN\""
    # Written now, served once the agent runs: until then a pod's network setup fails and
    # the kubelet retries it.
    cat >"$N/cni/net.d/05-cilium.conflist" <<EOF
{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni","enable-debug":false,
 "log-file":"$N/logs/cilium-cni.log"}]}
EOF
  else
    cat >"$N/cni/net.d/10-fusebox-node.conflist" <<EOF
{"cniVersion":"1.0.0","name":"fusebox-node","plugins":[{"type":"bridge","bridge":"$BRIDGE",
 "isGateway":false,"isDefaultGateway":false,"ipMasq":false,"hairpinMode":true,
 "ipam":{"type":"host-local","dataDir":"$N/cni/ipam",
  "ranges":[[{"subnet":"$NET.0/24","rangeStart":"$NET.10","rangeEnd":"$NET.250"}]]$routes}}]}
EOF
  fi
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
    bin_dirs = [$cni_bins]
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
${CLUSTER_DNS:+clusterDNS: [$CLUSTER_DNS]}
${CLUSTER_DNS:+clusterDomain: cluster.local}
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
start-cilium)
  : "${CILIUM_BIN:?}" "${CP:?}" "${POD_CIDR:?}"
  mkdir -p "$N/cilium/bin"
  # The agent compiles its datapath with the clang on PATH (Debian's clang-19).
  ln -sf "$(command -v clang-19)" "$N/cilium/bin/clang"
  ln -sf "$(command -v llc-19)" "$N/cilium/bin/llc"
  # Forwarding goes only to the bridge and to Cilium's devices; the agent appends its own
  # chains after this one (--prepend-iptables-chains=false).
  iptables -N "$FWD_CHAIN" 2>/dev/null || iptables -F "$FWD_CHAIN"
  for o in "$BRIDGE" lxc+ cilium_+; do iptables -A "$FWD_CHAIN" -o "$o" -j RETURN; done
  iptables -A "$FWD_CHAIN" -j DROP
  iptables -C FORWARD -j "$FWD_CHAIN" 2>/dev/null || iptables -I FORWARD 1 -j "$FWD_CHAIN"
  if ! mountpoint -q /sys/fs/bpf; then mount -t bpf bpf /sys/fs/bpf; echo /sys/fs/bpf >"$N/state/mounted-bpffs"; fi
  # Policy only, the way the stacks run it beside kube-proxy: native routing on this node,
  # no kube-proxy replacement, socket load balancing off (gVisor's sandboxes would bypass it
  # anyway: socketLB.hostNamespaceOnly), no masquerading, no Hubble, no health probes, the
  # DNS proxy on (toFQDNs), the bridge the only device.
  PATH=$N/cilium/bin:$PATH K8S_NODE_NAME=$NODE_NAME start_bg cilium-agent "$CILIUM_BIN/cilium-agent" \
    --k8s-kubeconfig-path="$CP/kubeconfig" --k8s-namespace=kube-system --cluster-name=default \
    --lib-dir="$CILIUM_BIN/lib" --state-dir=/var/run/cilium --bpf-root=/sys/fs/bpf \
    --cgroup-root=/sys/fs/cgroup/unified \
    --ipam=kubernetes --k8s-require-ipv4-pod-cidr=true --enable-ipv4=true --enable-ipv6=false \
    --routing-mode=native --ipv4-native-routing-cidr="$POD_CIDR" --auto-direct-node-routes=false \
    --devices="$BRIDGE" --enable-host-legacy-routing=true --kube-proxy-replacement=false \
    --bpf-lb-sock=false --bpf-lb-sock-hostns-only=true \
    --enable-ipv4-masquerade=false --enable-bpf-masquerade=false \
    --prepend-iptables-chains=false --identity-allocation-mode=crd \
    --enable-policy=default --enable-l7-proxy=true --enable-envoy-config=false \
    --enable-hubble=false --enable-health-checking=false --enable-endpoint-health-checking=false \
    --agent-health-port=20879 --prometheus-serve-addr= --enable-local-redirect-policy=false \
    --debug=false
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
  stop_pid cilium-agent
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
  # Cilium's: its chains and this script's, its devices, routing rules and tables, pinned maps.
  if command -v iptables >/dev/null; then
    for tb in filter nat mangle raw; do
      iptables -t $tb -S 2>/dev/null | grep -E "^-A .* -j (CILIUM_|$FWD_CHAIN)" | grep -vE "^-A (CILIUM_|$FWD_CHAIN)" |
        sed 's/^-A/-D/' | while read -r r; do eval iptables -t $tb "$r" || true; done
      for ch in $(iptables -t $tb -S 2>/dev/null | awk -v c="$FWD_CHAIN" '$1 == "-N" && ($2 ~ /^CILIUM_/ || $2 == c) {print $2}'); do
        iptables -t $tb -F "$ch" || true; iptables -t $tb -X "$ch" || true; done
    done
  fi
  if [ -d "$N/cilium" ]; then
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^(lxc|cilium_)'); do
      ip link del "$l" 2>/dev/null || true; done
    for t in 2004 2005; do
      while ip rule del table $t 2>/dev/null; do :; done
      ip route flush table $t 2>/dev/null || true
    done
    # The agent moves the local table's rule from priority 0 to 100 (its proxy's rules go
    # before it): put it back.
    if ! ip rule show priority 0 | grep -q 'lookup local'; then
      ip rule add from all lookup local priority 0 && ip rule del from all lookup local priority 100 2>/dev/null || true
    fi
    rm -rf /sys/fs/bpf/tc/globals /sys/fs/bpf/cilium /var/run/cilium
  fi
  # Outside hosts a test left behind (nodetest.StartOutsideHost).
  while ip rule del table 2213 2>/dev/null; do :; done
  ip route flush table 2213 2>/dev/null || true
  for ns in $(ip netns list 2>/dev/null | awk '/^fbout/{print $1}'); do ip netns pids "$ns" | xargs -r kill -9; ip netns delete "$ns"; done
  if [ -f "$N/state/mounted-bpffs" ]; then umount /sys/fs/bpf 2>/dev/null || true; rm -f "$N/state/mounted-bpffs"; fi
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
