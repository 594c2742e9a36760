#!/bin/bash
# gvisor-overhead.sh RUNSC [RUNS] measures what one idle gVisor pod costs its node beyond its
# containers: the resident memory (VmRSS, and PSS) and the CPU time of the sentry
# (runsc-sandbox) and of the gofers (runsc-gofer, one per container). Each run makes a pod as
# containerd-shim-runsc-v1 does: a sandbox container and one container in it (the CRI
# annotations io.kubernetes.cri.container-type and sandbox-id), both a static pause program
# in a rootfs of that one file made in a temporary directory, started with `runsc run
# --detach` (runsc's default platform and network). It lets the pod settle SETTLE seconds,
# samples the processes, measures their CPU over IDLE seconds and removes the pod. It prints
# one line per run and the maximum of each figure, from which the RuntimeClass's
# overhead.podFixed is set (components/gvisor, docs/performance.md).
#
# Needs root and gcc with a static libc.
set -euo pipefail

RUNSC="${1:?usage: $0 RUNSC [RUNS]}"
RUNS="${2:-5}"
SETTLE="${SETTLE:-5}"
IDLE="${IDLE:-30}"

work="$(mktemp -d)"
state="$work/state"
ids=()
cleanup() {
  local id
  for id in "${ids[@]}"; do
    "$RUNSC" --root "$state" delete --force "$id" >/dev/null 2>&1 || true
  done
  # runsc bind-mounts an empty network namespace into its root directory.
  umount "$state/null-netns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/rootfs" "$state"
cat >"$work/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
static void done(int s) { (void)s; _exit(0); }
int main(void) { signal(SIGTERM, done); signal(SIGINT, done); for (;;) pause(); }
EOF
gcc -static -Os -o "$work/rootfs/pause" "$work/pause.c"

# bundle DIR TYPE SANDBOX writes an OCI bundle running /pause as a CRI container of TYPE
# (sandbox or container) in sandbox SANDBOX.
bundle() {
  mkdir -p "$1"
  cp -a "$work/rootfs" "$1/rootfs"
  (cd "$1" && "$RUNSC" spec -- /pause)
  sed -i "s|^{|{\"annotations\":{\"io.kubernetes.cri.container-type\":\"$2\",\"io.kubernetes.cri.sandbox-id\":\"$3\"},|" "$1/config.json"
}

# pid_of ID SUBCOMMAND prints the PID of the runsc process of container ID that runs
# SUBCOMMAND (boot: the sentry; gofer: the container's gofer).
pid_of() {
  local p
  for p in $(pgrep -f -- "$1\$"); do
    if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -Eq " $2 .*$1 \$"; then
      echo "$p"
      return 0
    fi
  done
}
# rss PID prints the process's VmRSS in KiB; pss its proportional set size in KiB.
rss() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status"; }
pss() { awk '$1 == "Pss:" { print $2 }' "/proc/$1/smaps_rollup"; }
# ticks PID... prints the processes' utime+stime (all their threads) in clock ticks.
ticks() { local p n=0; for p; do n=$((n + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo "$n"; }

hz="$(getconf CLK_TCK)"
echo "runsc: $RUNSC ($(sha256sum "$RUNSC" | cut -c1-12))"
echo "kernel: $(uname -r), $(nproc) cores; settle ${SETTLE}s, idle ${IDLE}s; KiB"
printf '%-4s %10s %10s %10s %10s %10s %10s %10s\n' run sentryRSS gofer1RSS gofer2RSS totalRSS totalPSS startCPUms idleCPUms
max_rss=0 max_pss=0 max_start=0 max_idle=0
for i in $(seq 1 "$RUNS"); do
  pod="fbovh-$$-$i-pod" ctr="fbovh-$$-$i-ctr"
  rm -rf "$work/pod" "$work/ctr"
  bundle "$work/pod" sandbox "$pod"
  bundle "$work/ctr" container "$pod"
  ids=("$ctr" "$pod")
  "$RUNSC" --root "$state" run --detach --bundle "$work/pod" "$pod" >/dev/null
  "$RUNSC" --root "$state" run --detach --bundle "$work/ctr" "$ctr" >/dev/null
  sleep "$SETTLE"
  sentry="$(pid_of "$pod" boot)" g1="$(pid_of "$pod" gofer)" g2="$(pid_of "$ctr" gofer)"
  if [[ -z $sentry || -z $g1 || -z $g2 ]]; then
    echo "run $i: sentry '$sentry', gofers '$g1' '$g2': not all found" >&2
    exit 1
  fi
  s="$(rss "$sentry")" a="$(rss "$g1")" b="$(rss "$g2")"
  total=$((s + a + b)) totalpss=$(($(pss "$sentry") + $(pss "$g1") + $(pss "$g2")))
  t0="$(ticks "$sentry" "$g1" "$g2")"
  sleep "$IDLE"
  t1="$(ticks "$sentry" "$g1" "$g2")"
  start_ms=$((t0 * 1000 / hz)) idle_ms=$(((t1 - t0) * 1000 / hz))
  printf '%-4s %10s %10s %10s %10s %10s %10s %10s\n' "$i" "$s" "$a" "$b" "$total" "$totalpss" "$start_ms" "$idle_ms"
  "$RUNSC" --root "$state" delete --force "$ctr" >/dev/null
  "$RUNSC" --root "$state" delete --force "$pod" >/dev/null
  ids=()
  ((total > max_rss)) && max_rss=$total
  ((totalpss > max_pss)) && max_pss=$totalpss
  ((start_ms > max_start)) && max_start=$start_ms
  ((idle_ms > max_idle)) && max_idle=$idle_ms
done
echo "max: RSS $max_rss KiB ($(((max_rss + 1023) / 1024)) MiB), PSS $max_pss KiB, start CPU $max_start ms," \
  "idle CPU $max_idle ms in ${IDLE}s ($(awk -v ms="$max_idle" -v s="$IDLE" 'BEGIN { printf "%.2f", ms / s }') millicores)"
