#!/usr/bin/env bash
# stage-timeout: 240
# Stage 70: NVMe/TCP between ironsan's own host and target (docs/target.md, docs/nvme-tcp.md),
# on loopback: one `ironsan target` serving a RAM LUN over iSCSI and, through a [[subsystem]],
# as namespace 1 over NVMe/TCP.
#   * a pattern written over NVMe/TCP (`ironsan write nvme+tcp://...`) reads back identical
#     over NVMe/TCP and over iSCSI (one LUN, two front ends), and the other way round;
#   * `ironsan bench nvme+tcp://... --verify` writes and verifies with no error, plain and
#     with header and data digests, over two I/O queues;
#   * a host NQN the subsystem does not allow, and an unknown subsystem NQN, are refused in
#     one line each, and the target keeps serving both front ends, which read the same bytes.
set -euo pipefail
cd "$(dirname "$0")/../.."

IRONSAN="${IRONSAN:-$PWD/target/release/ironsan}"
BASE=$((40000 + RANDOM % 4000))
PI=$BASE
PN=$((BASE + 1))
PD=$((BASE + 2))
IQN=iqn.2026-11.org.ironsan.test:nvme
NQN=nqn.2026-11.org.ironsan.test:nvme
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:0c8b3f6e-3d2b-4a44-9a57-2f4e1a6b7c01

for tool in timeout cmp head; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not installed (scripts/install-deps.sh)"; exit 1; }
done
[[ -x $IRONSAN ]] || { echo "FAIL: no ironsan binary at $IRONSAN"; exit 1; }

work=$(mktemp -d /tmp/ironsan-nvme.XXXXXX)
tpid=
cleanup() {
  if [[ -n $tpid ]]; then kill -9 "$tpid" 2>/dev/null && wait "$tpid" 2>/dev/null; fi || true
  rm -rf "$work"
}
trap cleanup EXIT

fails=0
check() {
  local label=$1
  shift
  if "$@" >"$work/check.out" 2>&1; then
    echo "  ok: $label"
  else
    echo "  FAILED: $label"
    sed 's/^/      /' "$work/check.out" | tail -8
    fails=$((fails + 1))
  fi
}
refused() { # LABEL CMD...: the command fails, saying why in one line
  local label=$1
  shift
  if "$@" >"$work/refused.out" 2>&1; then
    echo "  FAILED: $label was accepted"; fails=$((fails + 1)); return
  fi
  echo "  ok: $label refused: $(tail -1 "$work/refused.out" | cut -c1-160)"
}

cat >"$work/target.toml" <<TOML
portals = ["127.0.0.1:$PI"]

[[target]]
name = "$IQN"

[target.lun.0]
size = "64MiB"
backend = "memory"

[[subsystem]]
nqn = "$NQN"
hosts = ["$HOSTNQN"]
listen = ["127.0.0.1:$PN"]
discovery_listen = ["127.0.0.1:$PD"]

[[subsystem.namespace]]
nsid = 1
target = "$IQN"
lun = 0
TOML
"$IRONSAN" target --config "$work/target.toml" >"$work/target.log" 2>&1 &
tpid=$!
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PN") 2>/dev/null && break
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PN") 2>/dev/null || { echo "FAIL: the target does not listen on $PN"; cat "$work/target.log"; exit 1; }

NVME="nvme+tcp://127.0.0.1:$PN/$NQN/1"
ISCSI="iscsi://127.0.0.1:$PI/$IQN/0"
host=(--initiator-name "$HOSTNQN")
head -c $((1 << 20)) /dev/urandom >"$work/a.bin"
head -c $((1 << 20)) /dev/urandom >"$work/b.bin"

echo "== one LUN, two front ends"
check "write 1 MiB over NVMe/TCP" timeout 60 "$IRONSAN" write "${host[@]}" --input "$work/a.bin" "$NVME"
check "read it back over NVMe/TCP" timeout 60 "$IRONSAN" read "${host[@]}" --length 1MiB --output "$work/a.nvme" "$NVME"
check "the same bytes" cmp "$work/a.bin" "$work/a.nvme"
check "read it over iSCSI" timeout 60 "$IRONSAN" read --length 1MiB --output "$work/a.iscsi" "$ISCSI"
check "the same bytes through iSCSI" cmp "$work/a.bin" "$work/a.iscsi"
check "write 1 MiB at 4 MiB over iSCSI" timeout 60 "$IRONSAN" write --offset 4MiB --input "$work/b.bin" "$ISCSI"
check "read it over NVMe/TCP" timeout 60 "$IRONSAN" read "${host[@]}" --offset 4MiB --length 1MiB --output "$work/b.nvme" "$NVME"
check "the same bytes through NVMe/TCP" cmp "$work/b.bin" "$work/b.nvme"

echo "== bench --verify over NVMe/TCP"
check "plain, 4 KiB and 128 KiB, QD 8" timeout 90 "$IRONSAN" bench "${host[@]}" "$NVME" --rw write --size 4k,128k --qd 8 --duration 2 --verify
check "header and data digests, two I/O queues" timeout 90 "$IRONSAN" bench "${host[@]}" \
  --header-digest crc32c --data-digest crc32c --connections 2 "$NVME" --rw write --size 16k --qd 8 --duration 2 --verify

echo "== refusals"
refused "a host the subsystem does not allow" timeout 30 "$IRONSAN" read --initiator-name nqn.2014-08.org.example:stranger --length 4096 --output /dev/null "$NVME"
refused "an unknown subsystem" timeout 30 "$IRONSAN" read "${host[@]}" --length 4096 --output /dev/null "nvme+tcp://127.0.0.1:$PN/$NQN.nope/1"
check "the target still serves NVMe/TCP" timeout 60 "$IRONSAN" read "${host[@]}" --length 1MiB --output "$work/c.nvme" "$NVME"
check "and iSCSI" timeout 60 "$IRONSAN" read --length 1MiB --output "$work/c.iscsi" "$ISCSI"
check "both read what bench wrote, the same" cmp "$work/c.nvme" "$work/c.iscsi"
kill -0 "$tpid" || { echo "  FAILED: the target exited"; fails=$((fails + 1)); }

if ((fails > 0)); then
  echo "--- target log"; tail -20 "$work/target.log"
  echo "FAIL: stage 70: $fails check(s) failed"
  exit 1
fi
echo "PASS: stage 70"
