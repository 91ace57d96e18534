#!/usr/bin/env bash
# ironsan <-> ironsan over iSER on loopback (the software iWARP RNIC on both ends): `bench
# --verify` (a pattern written, then every byte read back compared) over 512 B to 16 MiB x QD
# 1/8/32/128 x read/write/mixed, 64 sessions at once, and the same with MPA CRC (a second target
# that insists on it). Bytes per point are capped (256 MiB) so the stage stays near 2 minutes.
# stage-timeout: 900
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# A failure shows each target's last log lines too: who ended a connection, and why.
fail() {
  for log in "$work"/*.log; do echo "--- $(basename "$log"):" >&2; tail -15 "$log" >&2; done
  echo "45-iser-loopback: FAIL: $*" >&2
  exit 1
}
iqn=iqn.2026-11.org.ironsan:loopback

# start_target NAME PORT [EXTRA-CONFIG-LINE]: iSCSI/TCP and iSER on PORT, a 512 MiB RAM LUN.
start_target() {
  cat >"$work/$1.toml" <<EOT
portals = ["tcp://127.0.0.1:$2", "iser://127.0.0.1:$2"]
queue_depth = 128
${3:-}
[[target]]
name = "$iqn"
[target.lun.0]
size = "512MiB"
backend = "memory"
EOT
  "$IRONSAN" target --config "$work/$1.toml" >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -c "serving iSCSI" "$work/$1.log" >/dev/null && return; sleep 0.1; done
  cat "$work/$1.log" >&2
  fail "target $1 did not start"
}
# Below Linux's ephemeral ports (32768 and up), which a connection may hold at any moment.
port=$((20000 + RANDOM % 12000))
start_target plain "$port"
start_target crc "$((port + 1))" "iser_mpa_crc = true"

points=0
# verify URL QD SIZE: read, write and mixed at SIZE bytes, QD outstanding, checked.
verify() {
  local url=$1 qd=$2 size=$3 count span out
  count=$((qd * 4 > 64 ? qd * 4 : 64))
  ((count * size > 256 << 20)) && count=$(((256 << 20) / size))
  span=$((size * 4 > 8 << 20 ? size * 4 : 8 << 20))
  out=$(timeout 120 "$IRONSAN" bench "$url" --rw read,write,mixed --pattern rand --size "$size" \
    --qd "$qd" --count "$count" --span "$span" --verify 2>&1) ||
    { echo "$out" | tail -8 >&2; fail "bench --verify $url QD $qd size $size"; }
  grep -c "^verified: .*no difference" <<<"$out" >/dev/null ||
    { echo "$out" | tail -8 >&2; fail "no verify line: $url QD $qd size $size"; }
  points=$((points + 3))
}

url=iser://127.0.0.1:$port/$iqn/0
for qd in 1 8 32 128; do
  for size in 512 4096 65536 1048576 16777216; do verify "$url" "$qd" "$size"; done
done
echo "iSER, no MPA CRC: $points points verified (512 B..16 MiB x QD 1/8/32/128 x read/write/mixed)"

# 64 sessions at once, each with its own connection, all writing then reading their pattern.
out=$(timeout 180 "$IRONSAN" bench "$url" --rw write,read --pattern rand --size 64k --qd 4 \
  --sessions 64 --count 2048 --span 64m --verify 2>&1) ||
  { echo "$out" | tail -8 >&2; fail "64 sessions"; }
grep -c "^verified: .*no difference" <<<"$out" >/dev/null || { echo "$out" | tail -8 >&2; fail "64 sessions: no verify line"; }
echo "iSER: 64 sessions at once verified"

crc_url=iser://127.0.0.1:$((port + 1))/$iqn/0
points=0
for qd in 1 32; do
  for size in 512 65536 16777216; do verify "$crc_url" "$qd" "$size"; done
done
echo "iSER with MPA CRC (insisted on by the target): $points points verified"
# Reads and writes of the same two 1 MiB chunks at once: read data leaves from the RAM LUN's
# registered image while overlapping WRITEs change it, and the MPA CRC must still cover the
# bytes sent (it once did not: the initiator's RNIC answered with a CRC Terminate).
out=$(timeout 120 "$IRONSAN" bench "$crc_url" --rw mixed --pattern rand --size 1m --qd 8 \
  --count 600 --span 2m --verify 2>&1) ||
  { echo "$out" | tail -8 >&2; fail "overlapping reads and writes with MPA CRC"; }
echo "iSER with MPA CRC: overlapping reads and writes of 2 chunks verified"
if grep -E "panicked|ERROR" "$work"/*.log; then fail "a target logged an error"; fi
echo "45-iser-loopback: PASS"
