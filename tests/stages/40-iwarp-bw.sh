#!/usr/bin/env bash
# RDMA Write/Read/Send bandwidth of the software RNIC over loopback, 4 KiB .. 16 MiB, with a plain
# TCP socket stream measured in the same run: RDMA Write at 1 MiB must reach 0.5x TCP (a guard
# against a collapse; the benchmark itself is for the closing notes); then `rdma reg`
# (registration cost per iSER command) must run and fill its table, and `bench transports`
# (iSCSI/TCP vs iSER against one target) must measure both transports.
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 300 "$IRONSAN" rdma bw --ops write,read,send --min-size 4K --max-size 16M --bytes 128M \
  --json "$out/bw.json" --svg "$out/bw.svg" --min-ratio 0.5 \
  || { echo "40-iwarp-bw: FAIL (RDMA Write 1 MiB below 0.5x TCP, or a transfer failed)" >&2; exit 1; }
grep -q '"MiB/s"' "$out/bw.json" || { echo "40-iwarp-bw: FAIL: no JSON table" >&2; exit 1; }
grep -q '<svg' "$out/bw.svg" || { echo "40-iwarp-bw: FAIL: no SVG plot" >&2; exit 1; }
# Registration cost per iSER command: runs, every strategy at every size, a table (no ratio is
# checked: figures on a shared machine are noise-level at small sizes).
timeout 120 "$IRONSAN" rdma reg --max-size 1M --bytes 4M --rounds 1 --json "$out/reg.json" --svg "$out/reg.svg" \
  || { echo "40-iwarp-bw: FAIL (rdma reg)" >&2; exit 1; }
rows=$(grep -c '"us/command"' "$out/reg.json" || true)
[[ "$rows" == 27 ]] || { echo "40-iwarp-bw: FAIL: rdma reg gave $rows rows, expected 27 (9 sizes x 3)" >&2; exit 1; }
grep -q '<svg' "$out/reg.svg" || { echo "40-iwarp-bw: FAIL: no registration SVG" >&2; exit 1; }
# iSCSI/TCP vs iSER against one target: every point measured on both transports, and iSER
# not collapsed (below 5% of TCP is a stall, as writes through rdma-core once were).
timeout 120 "$IRONSAN" bench transports --size 64k..128k --duration 0.3 --rounds 1 \
  --json "$out/tr.json" --svg "$out/tr.svg" > "$out/tr.txt" \
  || { echo "40-iwarp-bw: FAIL (bench transports): $(tail -3 "$out/tr.txt")" >&2; exit 1; }
python3 - "$out/tr.json" <<'PY' || { cat "$out/tr.txt" >&2; echo "40-iwarp-bw: FAIL: bench transports table" >&2; exit 1; }
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 8, len(rows)
assert {r["transport"] for r in rows} == {"iscsi", "iser"}
assert all(r["MB/s"] > 0 for r in rows), rows
ratios = [r["iser/iscsi MB/s"] for r in rows if r["transport"] == "iser"]
assert all(x >= 0.05 for x in ratios), ratios
print("bench transports: iser/iscsi MB/s", " ".join(f"{x:.2f}" for x in ratios))
PY
grep -q '<svg' "$out/tr.svg" || { echo "40-iwarp-bw: FAIL: no transports SVG" >&2; exit 1; }
echo "40-iwarp-bw: OK"
