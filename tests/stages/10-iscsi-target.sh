#!/usr/bin/env bash
# The iSCSI target against libiscsi's tools and iSCSI-level conformance suites:
# discovery, inquiry, capacity, perf, with and without digests and CHAP; then the
# iSCSI family of iscsi-test-cu (CmdSN window, DataSN, residuals, task management),
# its CUnit summary checked, and bad input from the network (malformed PDUs).
set -euo pipefail
IRONSAN=${IRONSAN:-target/release/ironsan}
work=$(mktemp -d)
port=13260
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- target log"; tail -30 "$work/target.log" || true; exit 1; }

iqn=iqn.2026-11.org.ironsan:stage
chap=iqn.2026-11.org.ironsan:chap
cat > "$work/target.toml" <<CONF
portals = ["127.0.0.1:$port"]
nop_interval_secs = 2
nop_timeout_secs = 4

[[target]]
name = "$iqn"
[target.lun.0]
size = "256MiB"
backend = "memory"

[[target]]
name = "$chap"
chap = { user = "stageuser", secret = "stagesecret1234" }
header_digest = "required"
data_digest = "allowed"      # libiscsi has no DataDigest support (it always offers None)
[target.lun.0]
size = "64MiB"
backend = "memory"
CONF
"$IRONSAN" target --config "$work/target.toml" > "$work/target.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q "serving iSCSI" "$work/target.log" 2>/dev/null && break; sleep 0.1; done
grep -q "serving iSCSI" "$work/target.log" || fail "target did not start"

host="127.0.0.1:$port"
url="iscsi://$host/$iqn/0"
curl="iscsi://stageuser%stagesecret1234@$host/$chap/0?header_digest=crc32c"

echo "--- discovery and inquiry"
# (iscsi-ls -s would also log in to the CHAP target; plain discovery lists both.)
out=$(timeout 20 iscsi-ls "iscsi://$host/") || fail "iscsi-ls"
echo "$out"
grep -q "Target:$iqn Portal:127.0.0.1:$port,1" <<<"$out" || fail "SendTargets did not list $iqn"
grep -q "Target:$chap Portal:127.0.0.1:$port,1" <<<"$out" || fail "SendTargets did not list $chap"
timeout 20 iscsi-inq "$url" | grep -c "DIRECT_ACCESS" >/dev/null || fail "iscsi-inq"
cap=$(timeout 20 iscsi-readcapacity16 "$url") || fail "iscsi-readcapacity16"
grep -q "Total size:268435456" <<<"$cap" || fail "capacity: $cap"

echo "--- CHAP with a required header digest"
timeout 20 iscsi-inq "$curl" | grep -c "DIRECT_ACCESS" >/dev/null || fail "CHAP login with the right secret"
# libiscsi always offers None,CRC32C; ironsan's initiator can refuse digests outright.
refused=$(timeout 20 "$IRONSAN" inq "${curl%%\?*}?header_digest=none" 2>&1) \
  && fail "an initiator refusing the required HeaderDigest logged in"
grep -q "0x0200" <<<"$refused" || fail "refused digest: expected login status 0x0200, got: $refused"
if timeout 20 iscsi-inq "iscsi://stageuser%wrongsecret999@$host/$chap/0" >/dev/null 2>&1; then
  fail "CHAP login with a wrong secret succeeded"
fi
timeout 20 iscsi-inq "iscsi://$host/$chap/0" >/dev/null 2>&1 && fail "login without CHAP to a CHAP target succeeded"

echo "--- iscsi-perf, 128 KiB reads at queue depth 32, plain and with digests"
timeout 30 iscsi-perf -t 3 -b 256 -m 32 "$url" > "$work/perf1" 2>&1 || fail "iscsi-perf"
tr '\r' '\n' < "$work/perf1" | grep "iops average" | tail -1
timeout 30 iscsi-perf -t 3 -b 256 -m 32 "$curl" > "$work/perf2" 2>&1 || fail "iscsi-perf with CHAP+digests"
tr '\r' '\n' < "$work/perf2" | grep "iops average" | tail -1

echo "--- iscsi-test-cu, iSCSI family"
timeout 300 iscsi-test-cu -i iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test -t iSCSI --dataloss "$url" > "$work/cu" 2>&1 || true
grep -E "^\s+tests" "$work/cu" || fail "no CUnit summary"
read -r total ran passed failed _ < <(awk '/^ +tests/ {print $2, $3, $4, $5}' "$work/cu")
echo "iSCSI family: $passed of $total passed, $failed failed"
[[ "$failed" == 0 && "$ran" == "$total" && "$total" -ge 15 ]] || { grep -B2 FAILED "$work/cu" | head -40; fail "iscsi-test-cu iSCSI family"; }

echo "--- malformed input does not disturb other sessions"
python3 - "$port" <<'PY'
import socket, struct, sys
port = int(sys.argv[1])
cases = [
    b"\x43" + b"\x00" * 10,                       # truncated BHS, then close
    b"\x3b" + b"\x00" * 47,                       # unknown opcode before login
    b"\x43\x87" + b"\x00" * 2 + b"\x00\xff\xff\xff" + b"\x00" * 40,  # login with a 16 MiB data segment
    b"\x01" + b"\xff" * 47,                       # SCSI command before login
]
for c in cases:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(c)
    s.settimeout(2)
    try:
        s.recv(4096)
    except Exception:
        pass
    s.close()
print("sent", len(cases), "malformed connections")
PY
timeout 20 iscsi-inq "$url" | grep -c "DIRECT_ACCESS" >/dev/null || fail "target stopped answering after malformed input"
kill -0 "${pids[0]}" || fail "target process died"

echo "--- output into a pipe closed early ends quietly (status 141, no panic)"
set +o pipefail
"$IRONSAN" bench crc --sizes 8k --samples 3 2> "$work/pipe.err" | true
status=${PIPESTATUS[0]}
set -o pipefail
[[ $status == 141 ]] && ! grep -q panicked "$work/pipe.err" || fail "closed stdout: status $status, $(cat "$work/pipe.err")"

echo "--- ironsan bench vs-tgt (one short round; the ratio bars are for the closing note, not CI)"
timeout 120 "$IRONSAN" bench vs-tgt --seconds 1 --repeat 1 --json "$work/vs.json" --svg "$work/vs.svg" \
  || fail "bench vs-tgt"
python3 - "$work/vs.json" "$work/vs.svg" <<'PY' || fail "bench vs-tgt output"
import json, sys, xml.etree.ElementTree as ET
rows = json.load(open(sys.argv[1]))
assert [r["workload"] for r in rows] == ["seq read 128 KiB QD32", "rand read 4 KiB QD32"], rows
assert all(r["tgtd IOPS"] > 0 and r["ironsan IOPS"] > 0 for r in rows), rows
ET.parse(sys.argv[2])
print("bench vs-tgt: " + ", ".join(f'{r["workload"]} {r["ironsan/tgtd"]:.2f}x' for r in rows))
PY
echo "--- ironsan target --trace and --tcp-info: a PDU trace tshark decodes, TCP_INFO samples and plots"
tport=$((port + 7))
"$IRONSAN" target --portal "127.0.0.1:$tport" --trace "$work/trace.pcapng" --tcp-info "$work/tcpinfo" \
  --tcp-info-interval-ms 20 > "$work/traced.log" 2>&1 &
traced=$!
pids+=("$traced")
for _ in $(seq 50); do grep -q "serving iSCSI" "$work/traced.log" 2>/dev/null && break; sleep 0.1; done
turl="iscsi://127.0.0.1:$tport/iqn.2026-11.org.ironsan:default/0"
timeout 20 iscsi-perf -t 1 -b 64 -m 4 "$turl" > /dev/null 2>&1 || true
timeout 20 iscsi-inq "$turl" | grep -c DIRECT_ACCESS >/dev/null || fail "traced target did not answer"
kill -TERM "$traced"
for _ in $(seq 50); do kill -0 "$traced" 2>/dev/null || break; sleep 0.1; done
kill -0 "$traced" 2>/dev/null && fail "traced target did not stop on SIGTERM"
"$IRONSAN" analyze --port "$tport" --json "$work/trace.pcapng" > "$work/trace.json" || fail "analyze the trace"
tshark -r "$work/trace.pcapng" -d "tcp.port==$tport,iscsi" -Y iscsi -T fields -e iscsi.opcode \
  2>/dev/null | tr ',' '\n' | grep -v '^$' | sort | uniq -c > "$work/tshark-ops" || fail "tshark on the trace"
python3 - "$work/trace.json" "$work/tshark-ops" "$work/tcpinfo" <<'PY' || fail "trace/TCP_INFO checks"
import collections, csv, glob, json, sys, xml.etree.ElementTree as ET
d = json.load(open(sys.argv[1]))
ours = {int(k, 16): n for k, n in d["opcode_counts"].items()}
theirs = {}
for line in open(sys.argv[2]):
    n, op = line.split()
    theirs[int(op, 0)] = int(n)
assert sum(ours.values()) > 100, ours
assert set(theirs) == set(ours) and all(theirs[o] == ours[o] for o in ours), (ours, theirs)
rows = []
for f in glob.glob(sys.argv[3] + "/conn-*.csv"):
    rows += list(csv.DictReader(open(f)))
assert len(rows) >= 5 and max(int(r["cwnd"]) for r in rows) >= 10, rows[:3]
assert max(int(r["bytes_acked"]) for r in rows) > 1 << 20
for f in glob.glob(sys.argv[3] + "/conn-*.svg"):
    ET.parse(f)
print(f"trace: {sum(ours.values())} PDUs, per-opcode counts equal tshark's; TCP_INFO: {len(rows)} samples")
PY

echo "iSCSI target stage passed"
