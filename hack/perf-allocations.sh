#!/usr/bin/env bash
# Profiles warm allocations with perf: records every CPU's samples (perf record -a -g) while
# `fusebox-bench allocate --sched` runs, keeps the samples that fell inside an allocation (the
# windows --sched-csv writes, on perf's clock), and prints per process the functions that ran
# most, leaf and inclusive. runsc and fusebox-sandbox are stripped or run from copies perf
# cannot read; their addresses are resolved with `go tool addr2line` (Go keeps its line table
# in stripped binaries). Needs root, perf (apt-get install linux-perf) and python3.
#
#   hack/perf-allocations.sh [OUTDIR] [-- bench allocate flags...]
#
# Defaults: OUTDIR /tmp/fusebox-perf, --runs 100. It leaves perf.data, script.txt (perf
# script), sched.csv and report.txt in OUTDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/fusebox-perf}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--runs 100)
command -v perf >/dev/null || { echo "perf not found: apt-get install -y linux-perf" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found: apt-get install -y python3" >&2; exit 1; }
[ -x bin/fusebox-bench ] || { echo "bin/fusebox-bench not found: make build" >&2; exit 1; }
mkdir -p "$out"
runsc=$(bin/fusebox-bench allocate --help | sed -n 's/.*--runsc string.*default "\([^"]*\)").*/\1/p')

perf record -a -g -F 4999 -e cpu-clock -o "$out/perf.data" 2>"$out/perf.err" &
perf_pid=$!
trap 'kill -INT $perf_pid 2>/dev/null || true' EXIT
sleep 1
bin/fusebox-bench allocate --sched --sched-csv "$out/sched.csv" --demand-runs -1 --young-runs 0 \
  --cold-runs 1 "${args[@]}" 2>&1 | grep -v 'level=' | tee "$out/bench.txt"
kill -INT $perf_pid; wait $perf_pid || true
trap - EXIT
perf script -i "$out/perf.data" -F comm,pid,tid,time,ip,sym,dso >"$out/script.txt" 2>/dev/null

python3 - "$out" "$runsc" "$PWD/bin/fusebox-sandbox" <<'EOF' | tee "$out/report.txt"
import bisect, collections, csv, re, subprocess, sys
out, runsc, sandbox = sys.argv[1:4]
wins = sorted((float(r["from_s"]), float(r["to_s"])) for r in csv.DictReader(open(out + "/sched.csv")))
starts = [w[0] for w in wins]
def inside(t):
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and t < wins[i][1]
# perf names a mapping by its file; gVisor runs runsc from a copy, fusebox-sandbox from the
# sandbox's root file system.
binaries = {runsc: runsc, "/root/opt/fusebox/fusebox-sandbox": sandbox}
samples, cur = [], None
for line in open(out + "/script.txt", errors="replace"):
    if line.strip() and not line[0].isspace():
        parts = line.split()
        t = [p for p in parts if p.endswith(":")][-1]
        i = parts.index(t)
        cur = [" ".join(parts[:i - 1]), []] if inside(float(t[:-1])) else None
        if cur: samples.append(cur)
    elif cur is not None and line.strip():
        m = re.match(r"\s*([0-9a-f]+) (.*) \((.*)\)\s*$", line)
        if m:
            addr = int(m.group(1), 16) - (1 if cur[1] else 0)  # a caller's return address
            cur[1].append((addr, m.group(2), m.group(3)))
need = collections.defaultdict(set)
for _, frames in samples:
    for a, sym, dso in frames:
        if sym.startswith("[unknown]") and dso in binaries:
            need[dso].add(a)
names = {}
for dso, addrs in need.items():
    addrs = sorted(addrs)
    # Both are static executables loaded at 0x400000; perf prints offsets into the file.
    res = subprocess.run(["go", "tool", "addr2line", binaries[dso]], capture_output=True, text=True,
                         input="".join("0x%x\n" % (a + 0x400000) for a in addrs)).stdout.splitlines()
    for i, a in enumerate(addrs):
        names[(dso, a)] = res[2 * i] if 2 * i < len(res) else "?"
per = collections.defaultdict(list)
for comm, frames in samples:
    per[comm].append([re.sub(r"\+0x[0-9a-f]+$", "", names.get((dso, a), sym)) for a, sym, dso in frames])
print("samples inside %d allocations (%.1f ms): %d" % (len(wins), sum(b - a for a, b in wins) * 1e3, len(samples)))
for comm, stacks in sorted(per.items(), key=lambda kv: -len(kv[1]))[:4]:
    leaf = collections.Counter(s[0] for s in stacks if s)
    incl = collections.Counter(f for s in stacks for f in set(s))
    print("\n%s: %d samples" % (comm, len(stacks)))
    print("  leaf:")
    for f, n in leaf.most_common(15): print("  %5d %5.1f%%  %s" % (n, 100 * n / len(stacks), f))
    print("  inclusive:")
    for f, n in incl.most_common(30): print("  %5d %5.1f%%  %s" % (n, 100 * n / len(stacks), f))
EOF
