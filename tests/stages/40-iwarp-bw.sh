#!/usr/bin/env bash
# RDMA Write/Read/Send bandwidth of the software RNIC over loopback, 4 KiB .. 16 MiB, with a plain
# TCP socket stream measured in the same run: RDMA Write at 1 MiB must reach 0.8x TCP.
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 300 "$IRONSAN" rdma bw --ops write,read,send --min-size 4K --max-size 16M --bytes 128M \
  --json "$out/bw.json" --svg "$out/bw.svg" --min-ratio 0.8 \
  || { echo "40-iwarp-bw: FAIL (RDMA Write 1 MiB below 0.8x TCP, or a transfer failed)" >&2; exit 1; }
grep -q '"MiB/s"' "$out/bw.json" || { echo "40-iwarp-bw: FAIL: no JSON table" >&2; exit 1; }
grep -q '<svg' "$out/bw.svg" || { echo "40-iwarp-bw: FAIL: no SVG plot" >&2; exit 1; }
echo "40-iwarp-bw: OK"
