#!/usr/bin/env bash
# ironsan analyze against tshark on captures of a foreign initiator (libiscsi's iscsi-perf
# and iscsi-test-cu) talking to a foreign target (tgtd), all inside a private network
# namespace: per-opcode PDU counts must equal what `tshark -Y iscsi` reports on the same file,
# TCP retransmissions found must equal tshark's, and the timeline SVG must have one lane per
# connection and direction and one mark per PDU.
# Counting rule: tshark prints the opcodes of every iSCSI PDU completed in a frame as a
# comma-separated list (its TCP reassembly attributes a PDU split over segments to the frame
# holding its last byte), so the opcode lists are split on commas before counting.
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
for tool in tgtd tgtadm tcpdump tshark iscsi-perf iscsi-test-cu python3 ip; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/install-deps.sh)"; exit 1; }
done
# shellcheck source=lib/tgtd-netns.sh
source "$(dirname "$0")/lib/tgtd-netns.sh"
iqn=iqn.2024-01.org.ironsan:analyze50
tgtd_in_netns an50 "$iqn"
url="iscsi://127.0.0.1:3260/$iqn/1"

# A capture is only comparable when tcpdump kept every packet: after a kernel drop the two
# decoders resynchronise differently. Captures go to tmpfs (tgtd_in_netns puts $work there when
# it can) with a 256 MiB buffer, and a capture with drops is taken again (3 attempts).
complete=()
capture() { # name, command...
  local name=$1; shift
  local attempt
  for attempt in 1 2 3; do
    ip netns exec "$ns" tcpdump -i lo -s 0 -B 262144 -w "$work/$name.pcap" tcp port 3260 \
      >"$work/$name.tcpdump.log" 2>&1 &
    local td=$!
    for _ in $(seq 50); do grep -qs "listening on" "$work/$name.tcpdump.log" && break; sleep 0.1; done
    ip netns exec "$ns" "$@" >"$work/$name.log" 2>&1 || true
    sleep 0.3
    kill -INT "$td"; wait "$td" || true
    if grep -q "^0 packets dropped by kernel" "$work/$name.tcpdump.log"; then
      complete+=("$name"); return
    fi
    echo "note: tcpdump dropped packets for $name (attempt $attempt): $(grep 'dropped by kernel' "$work/$name.tcpdump.log")"
  done
}

capture perf timeout -s INT 1 iscsi-perf -m 4 -b 16 "$url"
capture cu timeout 120 iscsi-test-cu -d \
  -t "ALL.Inquiry,ALL.Read10,ALL.Write10,ALL.iSCSIcmdsn,ALL.iSCSIdatasn,ALL.iSCSIResiduals,ALL.iSCSITMF,ALL.TestUnitReady,ALL.ModeSense6" \
  "$url"

fail=0
for name in perf cu; do
  f="$work/$name.pcap"
  # tshark reassembles out-of-order segments only when asked; loopback captures have some.
  tshark -r "$f" -o tcp.reassemble_out_of_order:TRUE -d tcp.port==3260,iscsi -Y iscsi -T fields -e iscsi.opcode 2>/dev/null \
    | tr ',' '\n' | grep -v '^$' | sort | uniq -c | awk '{printf "%s %s\n", $2, $1}' >"$work/$name.tshark"
  "$IRONSAN" analyze --counts "$f" | awk '/^0x/ {printf "%s %s\n", $1, $NF}' | sort >"$work/$name.ours"
  total=$(awk '{s+=$2} END {print s+0}' "$work/$name.ours")
  if [[ "$total" -lt 100 ]]; then
    echo "FAIL $name: only $total PDUs decoded"; fail=1
  elif [[ " ${complete[*]} " != *" $name "* ]]; then
    # Drops on every attempt: only a weaker check is honest. After a gap ironsan resyncs on
    # the next plausible header while tshark waits for a segment that starts a PDU, so
    # ironsan must find at least as many PDUs of every opcode, and no opcode tshark lacks.
    if join -a1 -a2 -e0 -o 0,1.2,2.2 "$work/$name.tshark" "$work/$name.ours" | awk '$2 > $3 || $2 == 0 {bad=1} END {exit bad}'; then
      echo "ok $name (capture incomplete): $total PDUs, no opcode below tshark's count"
    else
      echo "FAIL $name: incomplete capture, yet ironsan finds fewer PDUs or other opcodes than tshark"
      join -a1 -a2 -e0 -o 0,1.2,2.2 "$work/$name.tshark" "$work/$name.ours"; fail=1
    fi
  elif diff -u "$work/$name.tshark" "$work/$name.ours"; then
    echo "ok $name: $total PDUs, per-opcode counts equal tshark's: $(tr '\n' ' ' <"$work/$name.ours")"
  else
    echo "FAIL $name: per-opcode counts differ from tshark (- tshark, + ironsan analyze)"; fail=1
  fi
  # A segment that fills a hole (its first copy never reached the capture) is a loss to
  # ironsan analyze and, to tshark, a retransmission or out-of-order depending on how late it
  # came; duplicates of bytes already seen are retransmissions to both. So tshark's count lies
  # between ironsan's retransmissions and those plus its filled losses. Bytes sent again after
  # the receiver had acknowledged them are a spurious retransmission to tshark, not a
  # retransmission, and a FIN sent again carries no bytes: ironsan counts bytes seen twice.
  theirs=$(tshark -r "$f" -Y "(tcp.analysis.retransmission || tcp.analysis.fast_retransmission || tcp.analysis.spurious_retransmission) && tcp.len > 0" 2>/dev/null | wc -l)
  read -r ours lost < <("$IRONSAN" analyze --json "$f" | python3 -c 'import json,sys; d=json.load(sys.stdin); c=d["connection_stats"]; print(sum(x["retransmissions"] for x in c), sum(x["lost_segments"] for x in c))')
  if ((theirs < ours || theirs > ours + lost)); then
    echo "FAIL $name: tshark finds $theirs retransmissions, ironsan analyze $ours (+ $lost filled losses)"; fail=1
  else
    echo "ok $name: $ours retransmissions and $lost filled losses, tshark's $theirs between them"
  fi
done

# Timeline of the conformance run: well-formed SVG, lanes and marks as promised.
"$IRONSAN" analyze --summary --svg "$work/cu.svg" --html "$work/cu.html" "$work/cu.pcap" >/dev/null
python3 - "$work/cu.svg" "$work/cu.html" "$work/cu.ours" <<'PY' || fail=1
import sys, xml.etree.ElementTree as ET
svg, html, counts = sys.argv[1:4]
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(svg).getroot()
lanes = root.findall(".//s:g[@class='lane']", ns)
marks = root.findall(".//s:rect[@class='pdu']", ns)
total = sum(int(l.split()[1]) for l in open(counts))
conns = {l.get("data-conn") for l in lanes}
assert len(lanes) == 2 * len(conns), (len(lanes), len(conns))
assert len(marks) == total, (len(marks), total)
page = open(html).read()
# The page draws on a canvas from its embedded data (stage 55 runs it in a browser); here it
# must be self-contained: the data and script inline, nothing fetched from elsewhere.
assert "<canvas" in page and '<script type="application/json" id="data">' in page, "no canvas or data"
assert "<script>" in page, "no script"
for fetch in ("<script src", "<link", "http://", "https://"):
    assert fetch not in page, f"page not self-contained: {fetch}"
print(f"ok timeline: {len(conns)} connections, {len(lanes)} lanes, {len(marks)} PDU marks")
PY
# A failed comparison keeps its captures (the scratch directory goes with the namespace).
if ((fail)); then
  keep=${STAGE_KEEP_DIR:-target/stage-logs/50-analyze-tshark-captures}
  mkdir -p "$keep" && cp "$work"/*.pcap "$keep"/ && echo "captures kept in $keep"
fi
exit $fail
