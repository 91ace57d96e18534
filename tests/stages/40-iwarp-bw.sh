#!/usr/bin/env bash
# RDMA Write/Read/Send bandwidth of the software RNIC over loopback, 4 KiB .. 16 MiB, with a plain
# TCP socket stream measured in the same run: RDMA Write at 1 MiB must reach 0.8x TCP; then
# `rdma reg` (registration cost per iSER command) must run and fill its table.
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 300 "$IRONSAN" rdma bw --ops write,read,send --min-size 4K --max-size 16M --bytes 128M \
  --json "$out/bw.json" --svg "$out/bw.svg" --min-ratio 0.8 \
  || { echo "40-iwarp-bw: FAIL (RDMA Write 1 MiB below 0.8x TCP, or a transfer failed)" >&2; exit 1; }
grep -q '"MiB/s"' "$out/bw.json" || { echo "40-iwarp-bw: FAIL: no JSON table" >&2; exit 1; }
grep -q '<svg' "$out/bw.svg" || { echo "40-iwarp-bw: FAIL: no SVG plot" >&2; exit 1; }
# Registration cost per iSER command: runs, every strategy at every size, a table (no ratio is
# checked: figures on a shared machine are noise-level at small sizes).
timeout 120 "$IRONSAN" rdma reg --max-size 1M --bytes 4M --rounds 1 --json "$out/reg.json" --svg "$out/reg.svg" \
  || { echo "40-iwarp-bw: FAIL (rdma reg)" >&2; exit 1; }
rows=$(grep -c '"us/command"' "$out/reg.json" || true)
[[ "$rows" == 27 ]] || { echo "40-iwarp-bw: FAIL: rdma reg gave $rows rows, expected 27 (9 sizes x 3)" >&2; exit 1; }
grep -q '<svg' "$out/reg.svg" || { echo "40-iwarp-bw: FAIL: no registration SVG" >&2; exit 1; }
echo "40-iwarp-bw: OK"
