#!/usr/bin/env bash
# iWARP wire compatibility judged by an independent decoder: capture `ironsan rdma ping` on
# loopback (MPA CRC off, then on), and across a veth pair between two network namespaces
# (MTU 1500, so 1448-byte segments: FPDUs must start segments, which tshark's MPA dissector
# assumes and RFC 5044 asks of a sender), and decode it with tshark's iwarp_mpa /
# iwarp_ddp_rdmap dissectors: every payload segment must decode as iWARP, none malformed, CRCs
# good, and the opcodes, MSNs and STags must be the ones the rping protocol exchanged.
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
tmp=$(mktemp -d)
pids=()
nsa=ironsan-iwa-$$ nsb=ironsan-iwb-$$
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$nsa" 2>/dev/null || true
  ip netns del "$nsb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "40-iwarp-tshark: FAIL: $*" >&2; exit 1; }
COUNT=5
# Where the server and the client run and what is captured: loopback unless set_veth ran.
srv=() cli=() CAP_IF=lo SRV_ADDR=127.0.0.1

set_veth() { # the server in one namespace, the client in another, a veth pair between them
  ip netns add "$nsa"
  ip netns add "$nsb"
  ip link add "iwa$$" type veth peer name "iwb$$"
  ip link set "iwa$$" netns "$nsa"
  ip link set "iwb$$" netns "$nsb"
  ip -n "$nsa" addr add 10.211.0.1/24 dev "iwa$$"
  ip -n "$nsb" addr add 10.211.0.2/24 dev "iwb$$"
  for n in "$nsa:iwa$$" "$nsb:iwb$$"; do
    ip -n "${n%%:*}" link set lo up
    ip -n "${n%%:*}" link set "${n#*:}" mtu 1500 up
  done
  srv=(ip netns exec "$nsa") cli=(ip netns exec "$nsb") CAP_IF="iwa$$" SRV_ADDR=10.211.0.1
}

run_capture() { # name port ping-args...
  local name=$1 port=$2; shift 2
  timeout 60 "${srv[@]}" dumpcap -q -i "$CAP_IF" -f "tcp port $port" -w "$tmp/$name.pcapng" -a duration:50 2>"$tmp/$name.dumpcap" &
  local cap=$!; pids+=("$cap")
  for _ in $(seq 50); do [[ -s "$tmp/$name.pcapng" ]] && break; sleep 0.1; done
  sleep 0.5
  timeout 30 "${srv[@]}" "$IRONSAN" rdma ping --server --listen "$SRV_ADDR:$port" --timeout 20 >"$tmp/$name.server" 2>&1 &
  local srv=$!; pids+=("$srv")
  sleep 0.3
  timeout 30 "${cli[@]}" "$IRONSAN" rdma ping "$SRV_ADDR:$port" --count "$COUNT" "$@" | tee "$tmp/$name.client" | tail -1
  wait "$srv" || fail "$name: ping server failed: $(cat "$tmp/$name.server")"
  sleep 0.5
  kill -INT "$cap" 2>/dev/null || true
  wait "$cap" 2>/dev/null || true
  grep -q "$COUNT/$COUNT pings ok" "$tmp/$name.client" || fail "$name: ping did not complete"
}

check_capture() { # name crc(0|1)
  local name=$1 crc=$2
  local f="$tmp/$name.pcapng"
  local bad
  bad=$(tshark -r "$f" -Y "_ws.malformed || _ws.expert.severity == error" 2>/dev/null | wc -l)
  [[ "$bad" == 0 ]] || fail "$name: $bad malformed/error frames"
  # tshark's MPA dissector follows the stream in order, so a segment a veth queue delivered late
  # or TCP sent again is left undecoded: those must still hold whole FPDUs, checked by length.
  local late="tcp.analysis.out_of_order || tcp.analysis.retransmission || tcp.analysis.fast_retransmission || tcp.analysis.spurious_retransmission"
  bad=$(tshark -r "$f" -Y "tcp.len > 0 && !iwarp_mpa && !($late)" 2>/dev/null | wc -l)
  [[ "$bad" == 0 ]] || fail "$name: $bad payload segments not decoded as MPA"
  tshark -r "$f" -Y "tcp.len > 0 && !iwarp_mpa && ($late)" -T fields -e frame.number -e tcp.payload 2>/dev/null |
    python3 -c '
import sys
for line in sys.stdin:
    frame, payload = line.split()
    b, at = bytes.fromhex(payload), 0
    while at + 2 <= len(b):  # ULPDU length, the ULPDU, pad to 4, CRC
        at += 2 + int.from_bytes(b[at:at + 2], "big")
        at += (-at) % 4 + 4
    if at != len(b):
        sys.exit(f"frame {frame}: a late segment that does not hold whole FPDUs")
' || fail "$name: a resent or reordered segment is not FPDU-aligned"
  if [[ "$crc" == 1 ]]; then
    tshark -r "$f" -V 2>/dev/null | grep -c "Bad CRC32" >/dev/null && fail "$name: tshark reports a bad MPA CRC"
    good=$(tshark -r "$f" -V 2>/dev/null | grep -c "Good CRC32" || true)
    [[ "$good" -gt 0 ]] || fail "$name: no CRC checked"
    echo "$name: $good FPDU CRCs verified good by tshark"
  fi
  tshark -r "$f" -T fields -E occurrence=a -E aggregator=';' -e tcp.srcport -e iwarp_mpa.crc_flag -e iwarp_rdma.opcode \
    -e iwarp_ddp.msn -e iwarp_ddp.stag -e iwarp_rdma.srcstag -e iwarp_rdma.sinkstag -e data.data 2>/dev/null >"$tmp/$name.fields"
  python3 - "$tmp/$name.fields" "$COUNT" "$crc" <<'PY'
import sys
path, count, crc = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rows = [l.rstrip("\n").split("\t") for l in open(path)]
client = None
ops = {}; sends = {}; rr_src = []; writes = []; rkeys = {}
crc_flags = []
for r in rows:
    r += [""] * (8 - len(r))
    port, cflag, opc, msn, stag, src, sink, data = r
    if cflag:
        crc_flags.append(cflag.split(";")[0])
        if client is None:
            client = port  # the MPA Request comes from the client
    if not opc:
        continue
    opcs = opc.split(";"); msns = msn.split(";") if msn else []
    for o in opcs:
        ops[(port, int(o, 0))] = ops.get((port, int(o, 0)), 0) + 1
    if int(opcs[0], 0) == 3:
        sends.setdefault(port, []).extend(int(m) for m in msns)
        if port == client and data:
            d = bytes.fromhex(data.split(";")[0])
            if len(d) == 16:
                rkeys.setdefault("all", []).append(int.from_bytes(d[8:12], "big"))
    if int(opcs[0], 0) == 1:
        rr_src.extend(int(s, 0) for s in src.split(";"))
    if int(opcs[0], 0) == 0:
        writes.extend(int(s.replace(":", ""), 16) for s in stag.split(";"))
server = [p for (p, _) in ops if p != client]
assert client and server, "no MPA Request seen"
server = server[0]
def need(cond, msg):
    if not cond:
        print("FAIL:", msg); sys.exit(1)
need(all((f in ("True", "1")) == crc for f in crc_flags[:1]), f"MPA Request CRC flag {crc_flags} != {crc}")
need(ops.get((server, 1), 0) == count, f"{ops.get((server,1),0)} Read Requests, expected {count}")
need(ops.get((client, 2), 0) >= count, "Read Responses missing")
need(ops.get((server, 0), 0) >= count, "RDMA Writes missing")
need(sends.get(client) == list(range(1, 2 * count + 1)), f"client Send MSNs {sends.get(client)}")
need(sends.get(server) == list(range(1, 2 * count + 1)), f"server Send MSNs {sends.get(server)}")
keys = rkeys.get("all", [])
need(len(keys) == 2 * count, f"{len(keys)} buffer descriptors decoded")
need(rr_src == keys[0::2], f"Read Request source STags {rr_src} != advertised {keys[0::2]}")
need(set(writes) == set(keys[1::2]), f"RDMA Write STags {set(writes)} != advertised {set(keys[1::2])}")
print(f"decoded: {sum(ops.values())} DDP segments; Read Requests {len(rr_src)}, Sends {len(sends[client])}+{len(sends[server])}, "
      f"STags match the advertised rkeys, MSNs 1..{2*count} in each direction")
PY
}

command -v tshark >/dev/null || fail "tshark not installed (scripts/install-deps.sh)"
command -v dumpcap >/dev/null || fail "dumpcap not installed (scripts/install-deps.sh)"
run_capture nocrc 17201 --size 65000
check_capture nocrc 0
run_capture crc 17202 --size 65000 --crc
check_capture crc 1
set_veth
run_capture veth-crc 17203 --size 65000 --crc
check_capture veth-crc 1
echo "40-iwarp-tshark: OK"
