#!/usr/bin/env bash
# Compares two ironsan builds on this machine in one run, alternating the builds round by
# round (figures here are noisy: 2 shared cores), and prints medians and after/before ratios:
#   target:    iscsi-perf (libiscsi) against each build's target, RAM LUN: seq 128 KiB and
#              rand 4 KiB reads, QD 32
#   file:      4 KiB random writes, QD 32, to each build's target with a file LUN (on
#              /dev/shm), driven by the BEFORE build's `ironsan bench` (the same driver both ways)
#   digests:   seq 128 KiB reads with header and data digests from each build's target (RAM
#              LUN), driven the same way (iscsi-perf has no data digests)
#   initiator: each build's `ironsan bench` against one target (the BEFORE build's), seq
#              128 KiB and rand 4 KiB reads, QD 32, as a ratio to iscsi-perf on that target in
#              the same round
#   transports: each build's `bench transports` (its own target and initiator, RAM LUN), MB/s
#              of iSCSI/TCP and iSER at 4k/128k/1m x QD 1/8/32, reads and writes
#   vstgt:     each build's `bench vs-tgt` (iscsi-perf against its target beside tgtd): the
#              ironsan IOPS and the ironsan/tgtd ratio of each workload
# Usage: tests/perf/compare-builds.sh BEFORE-BINARY AFTER-BINARY [ROUNDS] [SECONDS]
#   PARTS=initiator (or target, transports, vstgt; a comma list) runs only those parts, for
#   more rounds in the same time [default: target,initiator].
# Not part of the test command: a benchmark for closing notes. Needs iscsi-perf
# (libiscsi-bin) and python3.
set -euo pipefail
before=${1:?usage: compare-builds.sh BEFORE AFTER [ROUNDS] [SECONDS]}
after=${2:?usage: compare-builds.sh BEFORE AFTER [ROUNDS] [SECONDS]}
rounds=${3:-5}
secs=${4:-3}
parts=${PARTS:-target,initiator}
port=13300
iqn=iqn.2026-11.org.ironsan:compare
work=$(mktemp -d)
data=$(mktemp -d /dev/shm/ironsan-compare.XXXXXX)
pid=
cleanup() { [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work" "$data"; }
trap cleanup EXIT

cat >"$work/target.toml" <<EOF
portals = ["127.0.0.1:$port"]
queue_depth = 128
nop_interval_secs = 0
[[target]]
name = "$iqn:ram"
[target.lun.0]
size = "1GiB"
backend = "memory"
[[target]]
name = "$iqn:file"
[target.lun.0]
size = "1GiB"
backend = { type = "file", path = "$data/lun.img", create = true }
EOF
ram="iscsi://127.0.0.1:$port/$iqn:ram/0"
file="iscsi://127.0.0.1:$port/$iqn:file/0"

start_target() { # BINARY
  "$1" target --config "$work/target.toml" >"$work/target.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q "serving iSCSI" "$work/target.log" 2>/dev/null && return; sleep 0.1; done
  echo "target did not start:"; cat "$work/target.log"; exit 1
}
stop_target() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
perf_iops() { # iscsi-perf ARGS: average IOPS
  timeout $((secs + 20)) iscsi-perf "$@" 2>&1 | tr '\r' '\n' | grep -o 'iops average [0-9]*' | tail -1 | awk '{print $3}'
}
bench_iops() { # BINARY URL ARGS: IOPS of `ironsan bench`
  local bin=$1 url=$2
  shift 2
  timeout $((secs + 30)) "$bin" bench "$url" --qd 32 --duration "$secs" --json "$work/b.json" "$@" >/dev/null &&
    python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["iops"]))' "$work/b.json"
}
record() { echo "$1 $2 ${3:-0}" >>"$work/results"; } # METRIC BUILD VALUE

for ((r = 1; r <= rounds; r++)); do
  order=(before after)
  ((r % 2 == 0)) && order=(after before)
  for b in "${order[@]}"; do
    [[ $parts == *target* ]] || break
    bin=$before
    [[ $b == after ]] && bin=$after
    start_target "$bin"
    record "target seq 128 KiB read" "$b" "$(perf_iops -m 32 -b 256 -t "$secs" "$ram")"
    record "target rand 4 KiB read" "$b" "$(perf_iops -m 32 -b 8 -r -t "$secs" "$ram")"
    record "file rand 4 KiB write" "$b" "$(bench_iops "$before" "$file" --rw write --pattern rand --size 4k)"
    record "target seq 128 KiB read, digests" "$b" "$(bench_iops "$before" "$ram" --rw read --pattern seq --size 128k --header-digest crc32c --data-digest crc32c)"
    stop_target
  done
  # Initiators against one target (the BEFORE build's), each as a ratio to iscsi-perf.
  if [[ $parts == *initiator* ]]; then
    start_target "$before"
    p_seq=$(perf_iops -m 32 -b 256 -t "$secs" "$ram")
    p_rand=$(perf_iops -m 32 -b 8 -r -t "$secs" "$ram")
    for b in "${order[@]}"; do
      bin=$before
      [[ $b == after ]] && bin=$after
      s=$(bench_iops "$bin" "$ram" --rw read --pattern seq --size 128k)
      q=$(bench_iops "$bin" "$ram" --rw read --pattern rand --size 4k)
      record "initiator/iscsi-perf seq 128 KiB read" "$b" "$(python3 -c "print($s / max(1, $p_seq))")"
      record "initiator/iscsi-perf rand 4 KiB read" "$b" "$(python3 -c "print($q / max(1, $p_rand))")"
    done
    stop_target
  fi
  for b in "${order[@]}"; do
    bin=$before
    [[ $b == after ]] && bin=$after
    if [[ $parts == *transports* ]]; then
      for size in 4k 128k 1m; do
        for qd in 1 8 32; do
          timeout 120 "$bin" bench transports --size "$size" --qd "$qd" --rounds 1 --duration "$secs" \
            --json "$work/t.json" >/dev/null
          python3 - "$work/t.json" "$qd" "$b" >>"$work/results" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1])):
    size = row["size"].replace(" ", "")
    print(f"transports {row['transport']} {size} {row['rw']} qd {sys.argv[2]} MB/s {sys.argv[3]} {row['MB/s']}")
PY
        done
      done
    fi
    if [[ $parts == *vstgt* ]]; then
      timeout 300 "$bin" bench vs-tgt --seconds "$secs" --repeat 1 --json "$work/v.json" >/dev/null
      python3 - "$work/v.json" "$b" >>"$work/results" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1])):
    w = row["workload"]
    print(f"vs-tgt {w} ironsan IOPS {sys.argv[2]} {row['ironsan IOPS']}")
    print(f"vs-tgt {w} ironsan/tgtd {sys.argv[2]} {row['ironsan/tgtd']}")
PY
    fi
  done
  echo "round $r of $rounds done" >&2
done

python3 - "$work/results" "$rounds" "$secs" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    *metric, build, value = line.split()
    rows.setdefault(" ".join(metric), {}).setdefault(build, []).append(float(value))
print(f"{sys.argv[2]} alternating rounds of {sys.argv[3]} s per run; medians (IOPS, or a ratio)")
print(f"{'metric':40} {'before':>12} {'after':>12} {'after/before':>13}")
for metric, v in rows.items():
    b, a = statistics.median(v["before"]), statistics.median(v["after"])
    fmt = (lambda x: f"{x:.3f}") if b < 10 else (lambda x: f"{x:.0f}")
    print(f"{metric:40} {fmt(b):>12} {fmt(a):>12} {a / b if b else 0:>13.3f}")
PY
