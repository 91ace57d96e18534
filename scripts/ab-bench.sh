#!/usr/bin/env bash
# Compares two ironsan builds in one run, alternating which goes first each round, on the
# benchmarks a change must not slow down: `bench vs-tgt` (ironsan against tgtd, both on
# loopback), `bench transports` (iSCSI/TCP and iSER, 4 KiB / 128 KiB / 1 MiB at QD 1, 8, 32)
# and 4 KiB random writes to a file LUN on tmpfs. Prints one row per figure: the median of
# each build over the rounds and new/old.
# Usage: scripts/ab-bench.sh OLD_IRONSAN NEW_IRONSAN [ROUNDS (default 3)] [OUT_DIR]
set -euo pipefail
old=$(realpath "${1:?usage: ab-bench.sh OLD_IRONSAN NEW_IRONSAN [ROUNDS] [OUT_DIR]}")
new=$(realpath "${2:?usage: ab-bench.sh OLD_IRONSAN NEW_IRONSAN [ROUNDS] [OUT_DIR]}")
rounds=${3:-3}
out=${4:-$(mktemp -d /tmp/ab-bench.XXXXXX)}
mkdir -p "$out"
port=${AB_PORT:-3291}

# 4 KiB random writes, QD 32, against a target serving a file LUN on tmpfs.
file_writes() { # BIN JSON
  local bin=$1 json=$2 dir
  dir=$(mktemp -d /dev/shm/ab-bench.XXXXXX)
  cat >"$dir/t.toml" <<EOF
portals = ["127.0.0.1:$port"]
[[target]]
name = "iqn.2026-11.org.ironsan:ab"
[target.lun.0]
size = "1GiB"
backend = { type = "file", path = "$dir/lun.img", create = true }
EOF
  "$bin" target --config "$dir/t.toml" >"$dir/target.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    grep -q "serving" "$dir/target.log" 2>/dev/null && break
    sleep 0.1
  done
  "$bin" bench "iscsi://127.0.0.1:$port/iqn.2026-11.org.ironsan:ab/0" --rw write --pattern rand \
    --size 4k --qd 32 --duration 5 --json "$json" >/dev/null
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

run_one() { # NAME BIN ROUND
  local name=$1 bin=$2 r=$3
  echo "round $r: $name" >&2
  "$bin" bench vs-tgt --seconds 3 --repeat 1 --json "$out/vs-tgt.$name.$r.json" >/dev/null 2>&1
  for size in 4k 128k 1m; do
    for qd in 1 8 32; do
      "$bin" bench transports --size "$size" --qd "$qd" --rounds 1 --duration 1 \
        --json "$out/transports.$size.$qd.$name.$r.json" >/dev/null 2>&1
    done
  done
  file_writes "$bin" "$out/file-writes.$name.$r.json"
}

for r in $(seq "$rounds"); do
  if ((r % 2)); then
    run_one old "$old" "$r"
    run_one new "$new" "$r"
  else
    run_one new "$new" "$r"
    run_one old "$old" "$r"
  fi
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(path):
    with open(path) as f:
        return json.load(f)
rows = {}  # figure -> {build: [values]}
def add(figure, build, value):
    rows.setdefault(figure, {"old": [], "new": []})[build].append(float(value))
for build in ("old", "new"):
    for r in range(1, rounds + 1):
        for row in load(f"{out}/vs-tgt.{build}.{r}.json"):
            add(f"vs-tgt {row['workload']}: ironsan/tgtd", build, row["ironsan/tgtd"])
        for size in ("4k", "128k", "1m"):
            for qd in ("1", "8", "32"):
                for row in load(f"{out}/transports.{size}.{qd}.{build}.{r}.json"):
                    add(f"transports {row['transport']} {row['rw']} {row['size']} QD {qd}: MB/s",
                        build, row["MB/s"])
        add("file LUN 4 KiB rand write QD 32: MB/s", build,
            load(f"{out}/file-writes.{build}.{r}.json")["mb_per_s"])
width = max(len(f) for f in rows)
print(f"{'figure':<{width}}  {'old':>9}  {'new':>9}  new/old")
for figure, v in rows.items():
    o, n = statistics.median(v["old"]), statistics.median(v["new"])
    print(f"{figure:<{width}}  {o:>9.2f}  {n:>9.2f}  {n / o if o else float('nan'):7.3f}")
print(f"(medians of {rounds} rounds; JSON in {out})")
EOF
