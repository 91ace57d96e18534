#!/usr/bin/env bash
# Object storage (OSD-2) end to end: `ironsan target` serves an OSD LUN (objects in files,
# attributes in SQLite) on one port for iSCSI/TCP and iSER (the software RNIC); `ironsan osd`
# creates partitions, objects and collections, writes/appends/reads objects (bytes compared),
# sets and gets attributes, pages through LIST, and is refused where the standard says
# (missing object, partition still holding objects); the target restarts and every object
# and attribute is still there; the same commands run over iser://; tshark's OSD dissector
# decodes the client's own capture (--trace) with no malformed packet; the object bench
# runs over both transports; `ironsan analyze` names the OSD commands of a capture.
# stage-timeout: 600
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
work=$(mktemp -d)
tpid=
cleanup() { [[ -n $tpid ]] && kill "$tpid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() {
  echo "--- target log:" >&2
  tail -20 "$work/target.log" >&2 || true
  echo "65-osd: FAIL: $*" >&2
  exit 1
}
ok() { echo "  ok: $*"; }
iqn=iqn.2026-11.org.ironsan:objects
# Below Linux's ephemeral ports (32768 and up), which a connection may hold at any moment.
port=$((20000 + RANDOM % 12000))
cat >"$work/target.toml" <<EOT
portals = ["tcp://127.0.0.1:$port", "iser://127.0.0.1:$port"]
[[target]]
name = "$iqn"
[target.lun.0]
size = "512MiB"
backend = { type = "osd", path = "$work/store" }
[target.lun.1]
size = "64MiB"
backend = "memory"
EOT
start_target() { # waits for this start's "serving" line (the log is appended across restarts)
  local before
  before=$(grep -c "serving iSCSI" "$work/target.log" 2>/dev/null || true)
  "$IRONSAN" target --config "$work/target.toml" >>"$work/target.log" 2>&1 &
  tpid=$!
  for _ in $(seq 100); do
    (($(grep -c "serving iSCSI" "$work/target.log" || true) > ${before:-0})) && return
    sleep 0.1
  done
  fail "target did not start"
}
start_target
url=iscsi://127.0.0.1:$port/$iqn/0
osd() { timeout 60 "$IRONSAN" osd "$url" "$@"; }
# traced NAME ARGS...: an osd command whose connection is captured to NAME.pcapng.
traced() {
  local name=$1
  shift
  timeout 60 "$IRONSAN" osd "$url" --trace "$work/trace-$name.pcapng" "$@"
}

echo "== inq and ls name the OSD LUN"
timeout 30 "$IRONSAN" inq "$url" >"$work/inq.txt" || fail "inq"
grep -q "Device type: 0x11 (object-based storage device (OSD))" "$work/inq.txt" || fail "inq: $(cat "$work/inq.txt")"
timeout 30 "$IRONSAN" ls "iscsi://127.0.0.1:$port" >"$work/ls.txt" || fail "ls"
grep -q "Lun: 0  object-based storage device" "$work/ls.txt" && grep -q "Lun: 1  Size: 64 MiB" "$work/ls.txt" ||
  fail "ls: $(cat "$work/ls.txt")"
ok "INQUIRY peripheral device type 0x11; ls lists the OSD LUN beside a block LUN"

echo "== objects over iSCSI/TCP (client capture for tshark)"
pid=$(osd create-partition 0x20000) && [[ $pid == 0x20000 ]] || fail "create-partition 0x20000 printed '$pid'"
auto=$(osd create "$pid") && [[ $auto =~ ^0x[0-9a-f]+$ ]] || fail "create with a device-chosen id printed '$auto'"
osd create "$pid" 0x30000 >/dev/null || fail "create 0x30000"
head -c 3000000 /dev/urandom >"$work/a.bin"
traced write write "$pid" 0x30000 -i "$work/a.bin" || fail "write 3 MB"
traced read read "$pid" 0x30000 -o "$work/a.out" || fail "read"
cmp -s "$work/a.bin" "$work/a.out" || fail "3 MB object read back differs"
printf 'tail bytes' | osd append "$pid" 0x30000 >"$work/append.txt" || fail "append"
grep -q "appended 10 bytes at 3000000" "$work/append.txt" || fail "append said: $(cat "$work/append.txt")"
osd read "$pid" 0x30000 --offset 2999995 >"$work/tail.out" || fail "read the tail"
[[ $(tail -c 10 "$work/tail.out") == "tail bytes" && $(stat -c %s "$work/tail.out") == 15 ]] || fail "tail after append"
ok "3 MB object written and read back; append lands at the logical length"
traced getlen get-attr "$pid" 0x30000 1 0x82 >"$work/len.txt" || fail "get-attr logical length"
grep -q "page 0x1 attr 0x82 = 3000010 " "$work/len.txt" || fail "logical length: $(cat "$work/len.txt")"
traced set set-attr "$pid" 0x30000 0x10000 7 "blue label" || fail "set-attr"
traced getpage get-attr "$pid" 0x30000 0x10000 >"$work/user.txt" || fail "get-attr page"
grep -q 'attr 0x7 = "blue label"' "$work/user.txt" || fail "user page: $(cat "$work/user.txt")"
ok "attributes: logical length 3000010 (user information page), a user-defined attribute round-trips"
coll=$(osd create-collection "$pid") || fail "create-collection"
osd set-attr "$pid" 0x30000 4 1 "0x$(printf '%016x' "$coll")" || fail "join collection"
osd list-collection "$pid" "$coll" >"$work/members.txt" || fail "list-collection"
[[ $(cat "$work/members.txt") == 0x30000 ]] || fail "collection members: $(cat "$work/members.txt")"
for _ in $(seq 40); do osd create "$pid" >/dev/null || fail "create many"; done
traced list list "$pid" >"$work/list.txt" || fail "list"
[[ $(grep -c . "$work/list.txt") -ge 42 ]] && grep -qx 0x30000 "$work/list.txt" || fail "list: $(wc -l <"$work/list.txt") ids"
ok "collection membership listed; LIST of 42+ objects"
traced missing read "$pid" 0x77777 2>"$work/missing.err" && fail "read of a missing object succeeded"
grep -q "GET ATTRIBUTES failed: CHECK CONDITION, ILLEGAL REQUEST (ASC/ASCQ 0x24/0x00" "$work/missing.err" ||
  fail "missing object said: $(cat "$work/missing.err")"
osd remove-partition "$pid" 2>"$work/busy.err" && fail "removed a partition holding objects"
grep -q "partition or collection contains user objects" "$work/busy.err" || fail "busy partition said: $(cat "$work/busy.err")"
ok "missing object and busy partition refused with their sense codes, one line each"
timeout 30 "$IRONSAN" read "iscsi://127.0.0.1:$port/$iqn/0" 2>"$work/blockread.err" && fail "block read of the OSD LUN succeeded"
ok "a block command on the OSD LUN fails cleanly: $(head -1 "$work/blockread.err")"

echo "== restart: objects and attributes survive"
kill "$tpid"
wait "$tpid" 2>/dev/null || true
start_target
osd read "$pid" 0x30000 -o "$work/b.out" || fail "read after restart"
head -c 3000000 "$work/b.out" | cmp -s - "$work/a.bin" || fail "object differs after restart"
osd get-attr "$pid" 0x30000 0x10000 7 | grep -q '"blue label"' || fail "attribute lost in restart"
ok "3 MB object and its attribute read back after a restart"

echo "== over iSER (software RNIC)"
iurl=iser://127.0.0.1:$port/$iqn/0
head -c 1500000 /dev/urandom >"$work/c.bin"
timeout 60 "$IRONSAN" osd "$iurl" create "$pid" 0x40000 >/dev/null || fail "iser create"
timeout 60 "$IRONSAN" osd "$iurl" write "$pid" 0x40000 -i "$work/c.bin" || fail "iser write"
timeout 60 "$IRONSAN" osd "$iurl" read "$pid" 0x40000 -o "$work/c.out" || fail "iser read"
cmp -s "$work/c.bin" "$work/c.out" || fail "object written and read over iSER differs"
timeout 60 "$IRONSAN" osd "$iurl" get-attr "$pid" 0x40000 1 0x82 | grep -q "= 1500000 " || fail "iser get-attr (bidirectional)"
ok "1.5 MB object over iser://, attributes retrieved by a bidirectional command"

echo "== tshark's OSD dissector decodes the client's capture"
if command -v tshark >/dev/null; then
  for f in "$work"/trace-*.pcapng; do
    tshark -r "$f" -d "tcp.port==$port,iscsi" -V -o "scsi.decode_scsi_messages_as:Object Based Storage Device" >>"$work/decode.txt" 2>&1 ||
      fail "tshark could not read $(basename "$f")"
  done
  for want in "Write (OSD-2)" "Get Attributes (OSD-2)" "Set Attributes (OSD-2)" "List (OSD-2)" "Read (OSD-2)" \
    "Additional CDB Length: 228" "User Object Logical Length: 3000010" "Object ID: 0x0000000000077777" \
    "Read part of bi-directional command underflowed"; do
    grep -qF "$want" "$work/decode.txt" || fail "tshark decode lacks '$want'"
  done
  ! grep -q "Malformed" "$work/decode.txt" || fail "tshark found a malformed packet: $(grep -m3 Malformed "$work/decode.txt")"
  ok "service actions, ids, attribute values, sense object identification and the bidirectional residual decoded; nothing malformed"
else
  fail "tshark is not installed (scripts/install-deps.sh installs it)"
fi

echo "== ironsan analyze names OSD commands"
timeout 60 "$IRONSAN" analyze --port "$port" "$work/trace-write.pcapng" >"$work/analyze.txt" 2>&1 || fail "analyze"
grep -q "OSD WRITE partition 0x20000 object 0x30000 offset 0 len 3000000" "$work/analyze.txt" ||
  fail "analyze listing: $(grep 'SCSI Command' "$work/analyze.txt" | head -3)"
# To a file, not a pipe: grep -q leaves at the first match, and under pipefail the writer's
# SIGPIPE would fail the check (it did once in CI, by timing).
timeout 60 "$IRONSAN" analyze --port "$port" "$work/trace-list.pcapng" >"$work/analyze-list.txt" 2>&1 ||
  fail "analyze of the LIST capture"
grep -q "OSD LIST partition 0x20000" "$work/analyze-list.txt" || fail "analyze: no OSD LIST"
ok "the listing names service actions, partition and object ids, offset and length"

echo "== object bench over iSCSI/TCP and iSER"
for u in "$url" "$iurl"; do
  timeout 120 "$IRONSAN" osd "$u" bench --size 4k..1m --bytes 4MiB --json "$work/bench.json" --svg "$work/bench.svg" ||
    fail "bench over $u"
  python3 - "$work/bench.json" <<'PY' || fail "bench JSON over $u"
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 9 and all(r["read MB/s"] > 0 and r["write MB/s"] > 0 for r in rows), rows
PY
  grep -q "<svg" "$work/bench.svg" || fail "bench SVG"
  ok "bench over ${u%%://*}: 9 sizes, JSON and SVG"
done
echo "65-osd: PASS"
