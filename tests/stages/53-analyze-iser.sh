#!/usr/bin/env bash
# `ironsan analyze --explain` on a real iSER capture: an ironsan target serving iSER over the
# software iWARP RNIC (one FPDU per TCP segment on loopback, so a capture taken by tcpdump
# below TCP frames like one from a network), 300 READs then 300 WRITEs of 64 KiB, one
# outstanding, from the ironsan initiator over iser://. The analyzer must decode every command
# (Data-In as RDMA Writes, solicited data as RDMA Read Responses) and explain the run with a
# measured throughput that matches the bench's.
# stage-timeout: 120
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in tcpdump python3 ip; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
work=$(mktemp -d)
ns=an53-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  [[ -n "${STAGE_KEEP:-}" ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
cat >"$work/target.toml" <<'EOF'
portals = ["tcp://127.0.0.1:3260", "iser://127.0.0.1:3260"]
iser_align_loopback = true
[[target]]
name = "iqn.2026-11.org.ironsan:iser53"
[target.lun.0]
size = "64MiB"
backend = "memory"
EOF
ip netns exec "$ns" "$IRONSAN" target --config "$work/target.toml" >"$work/target.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -qs "serving iSCSI" "$work/target.log" && break; sleep 0.1; done
ip netns exec "$ns" tcpdump -i lo -s 0 -B 262144 -w "$work/iser.pcap" tcp port 3260 >"$work/td.log" 2>&1 &
td=$!
for _ in $(seq 50); do grep -qs "listening on" "$work/td.log" && break; sleep 0.1; done
url=iser://127.0.0.1:3260/iqn.2026-11.org.ironsan:iser53/0
for rw in read write; do
  ip netns exec "$ns" timeout 60 "$IRONSAN" bench "$url" --rw $rw --size 64k --qd 1 --count 300 \
    --json "$work/$rw.json" >"$work/$rw.log" 2>&1
  sed -n 3p "$work/$rw.log"
done
# libpcap hands packets over a block at a time, a partly filled block after its 1 s timeout.
sleep 1.2
kill -INT "$td"; wait "$td" || true
grep "dropped by kernel" "$work/td.log"
"$IRONSAN" analyze --port 3260 --summary "$work/iser.pcap" | head -5
"$IRONSAN" analyze --port 3260 --explain "$work/iser.pcap" | grep -v "^ *change" | head -12
"$IRONSAN" analyze --port 3260 --explain --json "$work/iser.pcap" >"$work/explain.json"
python3 - "$work/explain.json" "$work/read.json" "$work/write.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
transports = {c.get("transport") for c in doc["connection_stats"]}
if transports != {"iser"}:
    sys.exit(f"FAIL transports {transports}, not iser")
w = doc["explain"]["workload"]
if not doc["explain"]["findings"]:
    sys.exit(f"FAIL no finding: {doc['explain'].get('note')}")
if w["reads"] != 300 or w["writes"] != 300:
    sys.exit(f"FAIL decoded {w['reads']} READs and {w['writes']} WRITEs of 300 each")
moved = w["data_bytes"]
if moved != 600 * 65536:
    sys.exit(f"FAIL {moved} data bytes decoded, not 600 x 64 KiB")
print(f"ok iSER explain: {w['reads']} READs, {w['writes']} WRITEs, {moved} bytes, "
      f"measured {w['measured_mbps']:.1f} MB/s, top limit {doc['explain']['findings'][0]['limit']}")
PY
