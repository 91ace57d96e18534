#!/usr/bin/env bash
# `ironsan analyze --explain` on a staged TCP window bound: the initiator and an ironsan target
# in two network namespaces joined by a real 16 ms round trip (lib/tun-delay.py: two TUN
# devices and a process that holds each packet 8 ms; sch_netem is not needed), the initiator's
# receive buffer capped at 64 KiB (net.ipv4.tcp_rmem in its namespace). Eight 256 KiB READs
# outstanding want 128 MB/s; the window lets through about window / RTT. `--explain` must rank
# "the TCP receive window" first with a bound near the measured throughput; with the default
# buffer (the cause removed) the same workload is several times faster and the window is not
# the top limit. The capture is taken by tcpdump on the link, so it has
# the real handshakes, windows and acknowledgements; it is taken at the sender of the read data
# (the target), where a full window shows as bytes in flight reaching it.
# stage-timeout: 180
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in tcpdump python3 ip; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
# The link needs TUN devices: make the node where a container left it out.
if [[ ! -c /dev/net/tun ]]; then
  mkdir -p /dev/net && mknod /dev/net/tun c 10 200 2>/dev/null || true
fi
if ! python3 -c 'import os; os.close(os.open("/dev/net/tun", os.O_RDWR))' 2>/dev/null; then
  echo "SKIP: this machine cannot open /dev/net/tun (no TUN devices): the window stage needs them"
  exit 0
fi
here=$(dirname "$0")
work=$(mktemp -d)
nsi=an52-ini-$$
nst=an52-tgt-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$nsi" 2>/dev/null || true
  ip netns del "$nst" 2>/dev/null || true
  [[ -n "${STAGE_KEEP:-}" ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
for ns in "$nsi" "$nst"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
python3 "$here/lib/tun-delay.py" "$nsi" "$nst" 8 150 >"$work/link.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -qs ready "$work/link.log" && break; sleep 0.1; done
grep -q ready "$work/link.log" || { cat "$work/link.log"; exit 1; }
ip netns exec "$nst" "$IRONSAN" target --portal 10.77.0.2:3260 >"$work/target.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -qs "serving iSCSI" "$work/target.log" && break; sleep 0.1; done
url=iscsi://10.77.0.2:3260/iqn.2026-11.org.ironsan:default/0

# One run: capture, bench, explain as JSON. $1: name, $2: the initiator's tcp_rmem.
run() {
  local name=$1 rmem=$2
  ip netns exec "$nsi" sysctl -qw net.ipv4.tcp_rmem="$rmem"
  ip netns exec "$nst" tcpdump -i tunB -s 0 -B 65536 -w "$work/$name.pcap" tcp port 3260 \
    >"$work/$name.td.log" 2>&1 &
  local td=$!
  for _ in $(seq 50); do grep -qs "listening on" "$work/$name.td.log" && break; sleep 0.1; done
  ip netns exec "$nsi" timeout 60 "$IRONSAN" bench "$url" --rw read --size 256k --qd 8 \
    --duration 4 >"$work/$name.bench.log" 2>&1
  sed -n 3p "$work/$name.bench.log"
  # libpcap hands packets over a block at a time, a partly filled block after its 1 s timeout.
  sleep 1.2
  kill -INT "$td"; wait "$td" || true
  "$IRONSAN" analyze --port 3260 --explain "$work/$name.pcap" | tee "$work/$name.explain.txt" | head -12
  "$IRONSAN" analyze --port 3260 --explain --json "$work/$name.pcap" >"$work/$name.json"
}

echo "--- a 64 KiB receive buffer"
run window "4096 65536 65536"
echo "--- the default receive buffer"
run open "4096 131072 6291456"

python3 - "$work/window.json" "$work/open.json" <<'PY'
import json, sys
def top(path):
    d = json.load(open(path))["explain"]
    assert d["findings"], f"{path}: no finding: {d.get('note')}"
    return d["findings"]
window, opened = top(sys.argv[1]), top(sys.argv[2])
w = window[0]
if w["limit"] != "tcp_window":
    sys.exit(f"FAIL window-bound run: top limit {w['limit']}, not tcp_window: {[f['limit'] for f in window]}")
ratio = w["bound_mbps"] / w["measured_mbps"]
if not 0.5 <= ratio <= 3.0:
    sys.exit(f"FAIL window bound {w['bound_mbps']:.2f} MB/s is not near the measured {w['measured_mbps']:.2f} MB/s")
o = opened[0]
if o["limit"] == "tcp_window":
    sys.exit(f"FAIL with the default buffer the window is still the top limit: {o}")
if o["measured_mbps"] < 2 * w["measured_mbps"]:
    sys.exit(f"FAIL the cause removed: {o['measured_mbps']:.2f} MB/s is not well above {w['measured_mbps']:.2f} MB/s")
print(f"ok window: top limit tcp_window, bound {w['bound_mbps']:.2f} MB/s, measured {w['measured_mbps']:.2f} MB/s; "
      f"default buffer: {o['measured_mbps']:.2f} MB/s, top limit {o['limit']}")
PY
