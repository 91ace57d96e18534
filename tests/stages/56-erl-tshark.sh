#!/usr/bin/env bash
# ErrorRecoveryLevels 1 and 2 on the wire, decoded by tshark. Level 1: an ironsan target behind
# `ironsan delay-proxy` damaging one Data-In, Data-Out and SCSI Command in 40 (on every
# connection), and `ironsan bench --error-recovery-level 1 --verify` through it with both
# digests. Every command must complete verified on one session (no reinstatement), and the
# initiator's trace of the run must show tshark the recovery PDUs: SNACK Requests (type
# Data/R2T) and Rejects with reason 0x02 (data digest error), at least as many of each as
# the bench counted (its points; the verify passes add more).
# stage-timeout: 300
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in tshark python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
work=$(mktemp -d /tmp/ironsan-56.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${STAGE_KEEP:-}" ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
port=3298
"$IRONSAN" target --portal 127.0.0.1:$port --error-recovery-level 1 >"$work/target.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -qs "serving iSCSI" "$work/target.log" && break; sleep 0.1; done
"$IRONSAN" delay-proxy --listen 127.0.0.1:$((port + 1)) --upstream 127.0.0.1:$port \
  --fault 'down:data-in%40:corrupt=data+5' --fault 'up:data-out%40:corrupt=data+5' \
  --fault 'up:scsi-cmd%40:corrupt=data+5' >"$work/proxy.log" 2>&1 &
pids+=($!)
sleep 0.5
timeout 150 "$IRONSAN" bench "iscsi://127.0.0.1:$((port + 1))/iqn.2026-11.org.ironsan:default/0" \
  --header-digest crc32c --data-digest crc32c --error-recovery-level 1 \
  --rw read,write --size 128k --qd 4 --count 300 --span 16m --verify \
  --trace "$work/run.pcapng" --json "$work/bench.json" >"$work/bench.log" 2>&1 || {
  echo "FAIL: bench at ERL 1 through the corrupting proxy"; tail -5 "$work/bench.log"; exit 1; }
grep -q "no difference" "$work/bench.log" || { echo "FAIL: verify"; tail -5 "$work/bench.log"; exit 1; }

# The trace is taken on the initiator's socket (loopback to the proxy, port+1).
tshark -r "$work/run.pcapng" -d tcp.port==$((port + 1)),iscsi \
  -Y iscsi -T fields -e iscsi.opcode -e iscsi.snack.type -e iscsi.snack.begrun \
  -e iscsi.reject.reason 2>/dev/null >"$work/pdus.tsv" || true
python3 - "$work/pdus.tsv" "$work/bench.json" <<'PY'
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
bench = json.load(open(sys.argv[2]))
rec = {k: sum(p["recovery"][k] for p in bench["points"]) for k in bench["points"][0]["recovery"]}
def ops(r):
    return [int(o, 16) if o.startswith("0x") else int(o) for o in r[0].split(",") if o]
snacks = [r for r in rows if r and 0x10 in ops(r)]
rejects = [r for r in rows if len(r) > 3 and 0x3f in ops(r) and r[3] and int(r[3], 0) == 2]
print(f"bench: {rec}")
print(f"tshark: {len(rows)} iSCSI frames, {len(snacks)} SNACK, {len(rejects)} Reject (data digest error)")
assert rec["reinstatements"] == 0, "the session dropped"
assert rec["data_snacks"] > 0 and rec["data_out_rejects"] + rec["command_retries"] > 0, rec
assert len(snacks) >= rec["data_snacks"], "every SNACK the bench counted is on the wire"
assert all(r[1] in ("0", "0x00", "0x0") or r[1] == "" for r in snacks), "Data/R2T SNACKs"
assert len(rejects) >= rec["data_out_rejects"] + rec["command_retries"], "every Reject is decoded"
assert len(rows) > 500, "the run decoded"
print("ok: SNACKs and Rejects (reason 0x02) decoded by tshark; every command verified, no reinstatement")
PY

# ErrorRecoveryLevel 2: a target at level 2 behind a proxy that cuts a connection at one
# Data-Out and one Data-In in 150 (every connection, the recovered ones too); the bench
# runs two connections at level 2. Each cut connection is logged in again and its commands
# reassigned: every command verified, no reinstatement, and the TASK REASSIGN requests
# (function 8) and their "function complete" answers decoded by tshark in the trace.
"$IRONSAN" target --portal 127.0.0.1:$((port + 2)) --error-recovery-level 2 >"$work/target2.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -qs "serving iSCSI" "$work/target2.log" && break; sleep 0.1; done
"$IRONSAN" delay-proxy --listen 127.0.0.1:$((port + 3)) --upstream 127.0.0.1:$((port + 2)) \
  --fault 'up:data-out%150:reset' --fault 'down:data-in%150:reset' >"$work/proxy2.log" 2>&1 &
pids+=($!)
sleep 0.5
IRONSAN_LOG=iscsi_initiator=info timeout 150 "$IRONSAN" bench "iscsi://127.0.0.1:$((port + 3))/iqn.2026-11.org.ironsan:default/0" \
  --error-recovery-level 2 --connections 2 \
  --rw write,read --size 128k --qd 4 --count 200 --span 16m --verify \
  --trace "$work/run2.pcapng" --json "$work/bench2.json" >"$work/bench2.log" 2>&1 || {
  echo "FAIL: bench at ERL 2 through the cutting proxy"; tail -5 "$work/bench2.log"; tail -5 "$work/target2.log"; exit 1; }
grep -q "no difference" "$work/bench2.log" || { echo "FAIL: verify at ERL 2"; tail -5 "$work/bench2.log"; exit 1; }
tshark -r "$work/run2.pcapng" -d tcp.port==$((port + 3)),iscsi \
  -Y 'iscsi.opcode == 0x02 || iscsi.opcode == 0x22' -T fields -e iscsi.opcode \
  -e iscsi.taskmanfun.function -e iscsi.taskmanfun.response 2>/dev/null >"$work/tmf.tsv" || true
# The bench's log (its points count only what happens inside them; the cuts may land in
# the verify passes) says how many connections were logged in again and reinstated.
python3 - "$work/tmf.tsv" "$work/bench2.log" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
log = open(sys.argv[2]).read()
rec = {"connection_recoveries": log.count("connection logged in again"),
       "reinstatements": log.count("session reinstated"),
       "task_reassigns": log.count("reassigned to it")}
def values(r, i):  # one value per PDU of the frame that has the field
    return [int(v, 0) for v in r[i].split(",") if v] if len(r) > i else []
reassigns = [f for r in rows for f in values(r, 1) if f == 8]
complete = [x for r in rows for x in values(r, 2) if x == 0]
print(f"bench: {rec}")
print(f"tshark: {len(reassigns)} TASK REASSIGN, {len(complete)} TMF responses 'function complete'")
assert rec["reinstatements"] == 0, "the session dropped"
assert rec["connection_recoveries"] > 0, rec
assert reassigns and complete, "TASK REASSIGN on the wire, answered 'function complete'"
print("ok: cut connections recovered at ERL 2 (TASK REASSIGN decoded by tshark); every command verified, no reinstatement")
PY
