#!/usr/bin/env bash
# The long-delay experiment and an injected loss, against tgtd in a private network namespace:
# (1) `ironsan delay-experiment` at 100 Mbit/s, against tgtd and against an ironsan target it
#     starts itself (the commands come from the ironsan initiator): 32 KiB WRITEs (command, R2T, data, status:
#     4 one-way trips) follow B/(4d+B/R) and 32 KiB READs (2 trips) follow B/(2d+B/R) within
#     20%, and 4 MiB READs stay within 80% of the raw-socket baseline through the same proxy;
# (2) a capture through `ironsan delay-proxy --drop-nth` shows the dropped segment's
#     retransmission in the analyzer summary and on the timeline.
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in tgtd tgtadm tcpdump iscsi-perf iptables-legacy python3 ip; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
# shellcheck source=lib/tgtd-netns.sh
source "$(dirname "$0")/lib/tgtd-netns.sh"
iqn=iqn.2024-01.org.ironsan:analyze50d
tgtd_in_netns an50d "$iqn"

fail=0
# check_experiment CSV LABEL: 32 KiB points with a delay within 20% of the model (at 0 ms the
# model is only B/R and the points measure per-command processing, not the delay), and
# 4 MiB READs at least half the raw-socket baseline (a collapse guard: the closing note measures).
check_experiment() {
  python3 - "$1" "$2" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
bad = []
for r in rows:
    ratio, of_base = float(r["measured/model"]), float(r["of_baseline"])
    if r["block"] == "32 KiB" and float(r["delay_ms"]) > 0 and not 0.8 <= ratio <= 1.2:
        bad.append(f'{r["op"]} 32 KiB at {r["delay_ms"]} ms: measured/model {ratio}')
    if r["op"] == "read" and r["block"] == "4 MiB" and of_base < 0.5:
        bad.append(f'read 4 MiB at {r["delay_ms"]} ms: {of_base} of the baseline')
for b in bad:
    print("FAIL", sys.argv[2], b)
print(f"delay experiment against {sys.argv[2]}: {len(rows)} points, {len(bad)} outside the bounds")
sys.exit(1 if bad or len(rows) == 0 else 0)
PY
}
timeout 300 ip netns exec "$ns" "$IRONSAN" delay-experiment --target-name "$iqn" \
  --delays-ms 0,4,16 --sizes 32k,4m --ops read,write --rate-mbit 100 --duration-ms 600 --min-commands 10 \
  --csv "$work/exp.csv" --svg "$work/exp.svg" 2>/dev/null || fail=1
check_experiment "$work/exp.csv" tgtd || fail=1
# The same sweep (fewer delays) against an ironsan target the command starts itself.
timeout 300 ip netns exec "$ns" "$IRONSAN" delay-experiment --target ironsan \
  --delays-ms 0,16 --sizes 32k,4m --ops read,write --rate-mbit 100 --duration-ms 600 --min-commands 10 \
  --csv "$work/exp-ironsan.csv" 2>/dev/null || fail=1
check_experiment "$work/exp-ironsan.csv" ironsan || fail=1

# Injected loss: drop the 20th data segment towards the initiator.
ip netns exec "$ns" tcpdump -i lo -s 0 -B 65536 -w "$work/loss.pcap" tcp port 3262 >"$work/td.log" 2>&1 &
td=$!
for _ in $(seq 50); do grep -qs "listening on" "$work/td.log" && break; sleep 0.1; done
ip netns exec "$ns" "$IRONSAN" delay-proxy --listen 127.0.0.1:3262 --upstream 127.0.0.1:3260 \
  --delay-ms 2 --drop-nth 20 --drop-dir down --duration-s 4 2>/dev/null &
px=$!
sleep 0.5
ip netns exec "$ns" timeout -s INT 2 iscsi-perf -m 1 -b 64 "iscsi://127.0.0.1:3262/$iqn/1" >/dev/null 2>&1 || true
sleep 0.3
kill -INT "$td"; wait "$td" || true
wait "$px" || true
"$IRONSAN" analyze --port 3262 --json --svg "$work/loss.svg" "$work/loss.pcap" >"$work/loss.json"
python3 - "$work/loss.json" "$work/loss.svg" <<'PY' || fail=1
import json, sys, xml.etree.ElementTree as ET
d = json.load(open(sys.argv[1]))
retrans = sum(c["retransmissions"] + c["lost_segments"] for c in d["connection_stats"])
root = ET.parse(sys.argv[2]).getroot()
events = root.findall(".//{http://www.w3.org/2000/svg}rect[@class='tcp-event']")
if retrans < 1 or len(events) < 1:
    print(f"FAIL injected loss not found: {retrans} retransmissions, {len(events)} timeline marks")
    sys.exit(1)
print(f"ok injected loss: {retrans} retransmission(s) in the summary, {len(events)} on the timeline")
PY
exit $fail
