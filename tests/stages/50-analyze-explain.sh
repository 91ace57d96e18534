#!/usr/bin/env bash
# `ironsan analyze --explain` on a staged loss (the in-process causes are
# crates/lab/tests/staged_causes.rs; a real segment loss needs root, a network namespace and
# a capture below TCP): the ironsan initiator reads 4 KiB at a time, one outstanding, from tgtd
# through `ironsan delay-proxy --drop-nth`, which drops one segment towards the initiator after
# tcpdump saw it. Each answer is one segment with nothing behind it, so the kernel resends it
# only after a timeout (a tail-loss probe or the retransmission timeout) while nothing moves:
# `--explain` must rank "losses" first, and the JSON must carry the finding with its bound
# beside the measured throughput. (A loss inside a larger transfer is repaired within a round
# trip by fast retransmit and is rightly not the top limit.)
# stage-timeout: 120
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in tgtd tgtadm tcpdump iptables-legacy python3 ip; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
# shellcheck source=lib/tgtd-netns.sh
source "$(dirname "$0")/lib/tgtd-netns.sh"
iqn=iqn.2024-01.org.ironsan:analyze50x
tgtd_in_netns an50x "$iqn"
port=3273

ip netns exec "$ns" tcpdump -i lo -s 0 -B 65536 -w "$work/loss.pcap" tcp port $port >"$work/td.log" 2>&1 &
td=$!
for _ in $(seq 50); do grep -qs "listening on" "$work/td.log" && break; sleep 0.1; done
ip netns exec "$ns" "$IRONSAN" delay-proxy --listen 127.0.0.1:$port --upstream 127.0.0.1:3260 \
  --drop-nth 20 --drop-dir down --duration-s 20 2>"$work/proxy.log" &
px=$!
# The proxy drops a segment of the first connection it relays: no probe connection before.
sleep 0.5
ip netns exec "$ns" timeout 30 "$IRONSAN" bench "iscsi://127.0.0.1:$port/$iqn/1" \
  --rw read --pattern rand --size 4k --qd 1 --count 30 >"$work/bench.log" 2>&1 || true
tail -1 "$work/bench.log"
sleep 0.3
kill -INT "$td"; wait "$td" || true
kill "$px" 2>/dev/null; wait "$px" 2>/dev/null || true

fail=0
"$IRONSAN" analyze --port $port --summary "$work/loss.pcap" | grep -E "Retransmission|LostRetransmitted" || true
"$IRONSAN" analyze --port $port --explain "$work/loss.pcap" | tee "$work/explain.txt"
"$IRONSAN" analyze --port $port --explain --json "$work/loss.pcap" >"$work/explain.json"
python3 - "$work/explain.json" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))["explain"]
findings = d["findings"]
if not findings:
    print("FAIL no finding:", d.get("note")); sys.exit(1)
top = findings[0]
if top["limit"] != "losses":
    print("FAIL top limit", top["limit"], "not losses:", [f["limit"] for f in findings]); sys.exit(1)
if not (top["bound_mbps"] >= top["measured_mbps"] > 0):
    print("FAIL bound", top["bound_mbps"], "measured", top["measured_mbps"]); sys.exit(1)
print(f'ok explain: top limit losses (share {top["share"]:.2f}, bound {top["bound_mbps"]:.2f} MB/s, measured {top["measured_mbps"]:.2f} MB/s)')
PY
exit $fail
