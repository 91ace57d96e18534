#!/usr/bin/env bash
# `ironsan analyze --html` in a real browser: `ironsan bench` runs 8 KiB random reads, then
# writes, 16 outstanding, against `ironsan target` on loopback while tcpdump captures (so the
# SYNs' options give the bytes-in-flight and window lanes) and both ends sample TCP_INFO.
# The page is written with the bench's samples (cwnd and RTT lanes) and opened in headless
# Chromium at #selftest: the page's own check finds the legend entry of every colour it drew
# and every lane of every connection, zooms in with wheel events on a PDU until its pixel
# column turns from a density bar into single marks (the span must shrink), hovers the PDU
# and compares the tooltip with the PDU's listing line, then writes
# <pre id="selftest">PASS ...</pre> into the DOM, which this stage greps. Also: the target's
# per-connection TCP_INFO directory and its --trace file make a page too, the fixture pcap
# makes one, --svg still works, and a screenshot must be a real picture.
# stage-timeout: 240
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in chromium tcpdump python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/ironsan-55.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
port=3297
iqn=iqn.2026-11.org.ironsan:default

tcpdump -i lo -s 0 -B 65536 -w "$work/run.pcap" tcp port $port >"$work/td.log" 2>&1 &
td=$!; pids+=("$td")
for _ in $(seq 50); do grep -qs "listening on" "$work/td.log" && break; sleep 0.1; done
"$IRONSAN" target --portal 127.0.0.1:$port --trace "$work/trace.pcapng" \
  --tcp-info "$work/ti-target" --tcp-info-interval-ms 5 >"$work/target.log" 2>&1 &
tg=$!; pids+=("$tg")
# Wait for the log line, not with a probe connection (it would be one more in the capture).
for _ in $(seq 100); do grep -qs "serving iSCSI" "$work/target.log" && break; sleep 0.1; done
timeout 60 "$IRONSAN" bench "iscsi://127.0.0.1:$port/$iqn/0" --rw read,write --pattern rand \
  --size 8k --qd 16 --count 4000 --tcp-info "$work/ti-bench.csv" --tcp-info-interval-ms 2 \
  >"$work/bench.log" 2>&1
tail -2 "$work/bench.log"
sleep 0.3
kill -INT "$tg"; wait "$tg" || true
kill -INT "$td"; wait "$td" || true

fail=0
pdus=$("$IRONSAN" analyze --port $port --counts "$work/run.pcap" | awk '$1 == "total" {print $2}')
echo "capture: $pdus PDUs"
[ "${pdus:-0}" -ge 10000 ] || { echo "FAIL only ${pdus:-0} PDUs captured"; fail=1; }
"$IRONSAN" analyze --port $port --counts --html "$work/run.html" --tcp-info "$work/ti-bench.csv" \
  --svg "$work/run.svg" "$work/run.pcap" >/dev/null
"$IRONSAN" analyze --port $port --counts --html "$work/trace.html" --tcp-info "$work/ti-target" \
  "$work/trace.pcapng" >/dev/null
"$IRONSAN" analyze --counts --html "$work/fixture.html" \
  "$here/../../crates/analyze/tests/fixtures/ffp-text-request.pcap" >/dev/null
ls -l "$work"/*.html "$work/run.svg" | awk '{print $5, $NF}'
grep -q '"ti":{"name":"s0c0"' "$work/run.html" || { echo "FAIL no TCP_INFO lanes in run.html"; fail=1; }
grep -q '"ti":{"name":"conn-' "$work/trace.html" || { echo "FAIL no TCP_INFO lanes from the target's directory"; fail=1; }
python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$work/run.svg" || { echo "FAIL run.svg is not XML"; fail=1; }

browse() { # URL, then chromium options
  local url=$1; shift
  timeout 60 chromium --headless=new --no-sandbox --disable-gpu --user-data-dir="$work/chrome" \
    --hide-scrollbars "$@" "$url" 2>>"$work/chromium.log"
}
for page in run trace; do
  browse "file://$work/$page.html#selftest" --virtual-time-budget=5000 --dump-dom >"$work/$page.dom" || true
  line=$(grep -o '<pre id="selftest">[^<]*' "$work/$page.dom" | sed 's/<pre id="selftest">//; s/&gt;/>/g; s/&lt;/</g; s/&amp;/\&/g' || true)
  echo "$page: ${line:-no self-test result}"
  case "$line" in PASS*) ;; *) fail=1; tail -3 "$work/chromium.log" ;; esac
done
browse "file://$work/run.html" --virtual-time-budget=3000 --screenshot="$work/run.png" --window-size=1400,900 >/dev/null || true
size=$(stat -c %s "$work/run.png" 2>/dev/null || echo 0)
# A blank 1400x900 PNG is a few kB; lanes, legend and text make tens of kB.
if [ "$size" -gt 30000 ] && head -c 8 "$work/run.png" | grep -q PNG; then
  echo "ok screenshot $size bytes"
else
  echo "FAIL screenshot $size bytes"; fail=1
fi
if [ -n "${TIMELINE_SCREENSHOT:-}" ]; then cp "$work/run.png" "$TIMELINE_SCREENSHOT"; fi
exit $fail
