#!/usr/bin/env bash
# Stage 20-crc: `ironsan bench crc` end to end. Runs the CRC32C benchmark with CSV, JSON and SVG
# output, checks each file with an independent parser (python3: csv, json, xml.etree), and
# checks the engine's 8 KiB performance relations (--check; ratios only, retried because the
# machine is shared).
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
# DataDigest CRC32C lose at most 15% against the same reads without digests (same run; each
# point is the best of three alternating 2 s runs, so a load spike does not decide it).
port=$((21000 + RANDOM % 4000))
"$IRONSAN" target --portal "127.0.0.1:$port" > "$work/target.log" 2>&1 &
tpid=$!
trap 'kill $tpid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do grep -q "serving iSCSI" "$work/target.log" && break; sleep 0.1; done
url="iscsi://127.0.0.1:$port/iqn.2026-11.org.ironsan:default/0"
for round in 1 2 3; do
  for d in none crc32c; do
    timeout 60 "$IRONSAN" bench "$url" --rw read --size 128k --qd 32 --duration 2 --span 256MiB \
      --header-digest "$d" --data-digest "$d" --json "$work/e2e-$d-$round.json" > /dev/null 2>&1 \
      || fail "bench with digests $d"
  done
done
python3 - "$work" <<'PY' || fail "digests cost more than 15% of sequential-read throughput"
import json, sys
best = {d: max(json.load(open(f"{sys.argv[1]}/e2e-{d}-{r}.json"))["mb_per_s"] for r in (1, 2, 3))
        for d in ("none", "crc32c")}
ratio = best["crc32c"] / best["none"]
print(f"end to end: 128 KiB reads QD 32, digests off {best['none']:.0f} MB/s, "
      f"HeaderDigest+DataDigest CRC32C {best['crc32c']:.0f} MB/s = {ratio:.3f}x (bar >= 0.85)")
sys.exit(0 if ratio >= 0.85 else 1)
PY

for attempt in 1 2 3; do
  if timeout 60 "$IRONSAN" bench crc --sizes 8k --samples 25 --check > "$work/check.txt" 2>&1; then
    cat "$work/check.txt"
    echo "20-crc: PASS"
    exit 0
  fi
  echo "20-crc: relations did not hold on attempt $attempt:" >&2
  cat "$work/check.txt" >&2
done
fail "CRC32C performance relations at 8 KiB did not hold in 3 attempts"
