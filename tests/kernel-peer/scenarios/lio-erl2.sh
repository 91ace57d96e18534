# The ironsan initiator at ErrorRecoveryLevel 2 against the kernel LIO target (which implements
# levels 1 and 2) in the guest, over TCP with both digests, through `ironsan delay-proxy` in
# front of the slirp port forward 127.0.0.1:$KP_FWD_PORT -> 10.0.2.15:3260. LIO is set to
# ErrorRecoveryLevel=2 and MaxConnections=2 on a 64 MiB fileio LUN of random data.
# One `ironsan bench --verify` of 1 MiB writes then reads, two connections, no --reconnect,
# while the proxy damages it: a Data-Out payload byte flipped and a cut at the 30th Data-In on
# connection 0, a cut 12 MB into connection 1, and a Data-In payload byte flipped on the
# connection that replaces it. Every command must complete with the right data, the session
# must never be reinstated, and the initiator's trace must show tshark the recovery PDUs: SNACK
# (Data-In asked for again), TASK REASSIGN and its answer (LIO says 255 for one it carried
# out), and R2Ts asking for write data again. Then 32 MiB written through a proxy cutting the session's only connection:
# the guest finds the bytes in LIO's backing file.
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=420
host_available() {
  [ -x "${IRONSAN:-}" ] || { echo "no ironsan binary"; return 1; }
  command -v tshark >/dev/null || { echo "no tshark"; return 1; }
}

guest_main() {
  export HOME=/root
  IQN=$KP_IQN_PREFIX:lio-erl2
  for m in configfs target_core_mod target_core_file iscsi_target_mod; do modprobe $m; done
  [ -e /run/dbus/pid ] || { mkdir -p /run/dbus && dbus-daemon --system --fork; }
  step "backing file with random data"
  dd if=/dev/urandom of=/tmp/lio.img bs=1M count=64 2>/dev/null
  step "LIO: fileio LUN, ErrorRecoveryLevel=2, MaxConnections=2, portal 10.0.2.15:3260"
  targetcli set global auto_save_on_exit=false auto_add_default_portal=false >/dev/null
  targetcli /backstores/fileio create name=kp0 file_or_dev=/tmp/lio.img size=64M write_back=false &&
    targetcli /iscsi create "$IQN" &&
    targetcli "/iscsi/$IQN/tpg1/luns" create /backstores/fileio/kp0 &&
    targetcli "/iscsi/$IQN/tpg1" set attribute authentication=0 demo_mode_write_protect=0 \
      generate_node_acls=1 cache_dynamic_acls=1 >/dev/null &&
    targetcli "/iscsi/$IQN/tpg1" set parameter ErrorRecoveryLevel=2 MaxConnections=2 >/dev/null &&
    # A new session's ErrorRecoveryLevel is the node ACL's default_erl (demo-mode ACLs take
    # the TPG's), whatever the TPG parameter says.
    targetcli "/iscsi/$IQN/tpg1" set attribute default_erl=2 >/dev/null &&
    targetcli "/iscsi/$IQN/tpg1/portals" create 10.0.2.15 3260
  check "LIO configured" test $? -eq 0
  tpg=/sys/kernel/config/target/iscsi/$IQN/tpgt_1
  check "LIO offers ErrorRecoveryLevel 2" test "$(cat "$tpg/param/ErrorRecoveryLevel")$(cat "$tpg/attrib/default_erl")" = 22
  echo "  LIO's digests: HeaderDigest=$(cat "$tpg/param/HeaderDigest") DataDigest=$(cat "$tpg/param/DataDigest")"

  step "bench --verify at ERL 2, two connections, through the damaging proxy"
  host_call erl2_bench "$IQN"
  check "every command verified, no reinstatement, recovery PDUs decoded by tshark" test $? -eq 0
  step "32 MiB written while the only connection is cut"
  host_call erl2_write "$IQN"
  check "the write completed at ERL 2 through a cut" test $? -eq 0
  grep -a '^WROTE_REGION ' "$HOST_OUT" >/tmp/regions || true
  n=0
  while read -r _ off len want; do
    n=$((n + 1))
    got=$(dd if=/tmp/lio.img bs=1M skip="$off" count="$len" 2>/dev/null | sha256sum | cut -d' ' -f1)
    check "backing file [$off MiB, +$len MiB) holds the host's bytes" test "$got" = "$want"
  done </tmp/regions
  check "the host reported what it wrote" test "$n" -gt 0
  echo "  LIO's kernel log on recovery:"
  dmesg | grep -i -E 'reassign|recover|snack|time2retain|digest|reinstat' | tail -12 | sed 's/^/  dmesg| /'
  targetcli clearconfig confirm=True >/dev/null
  finish
}

# ----------------------------------------------------------------------------- host side

# erl2_proxy NAME FAULT...: a damaging proxy in front of the port forward; prints its port.
# (The guest parses this file with sh: no arrays; fault specs have no spaces.)
erl2_proxy() {
  local name=$1 port
  shift
  port=$(free_port)
  # shellcheck disable=SC2046 # one word per fault
  spawn "$name" "$IRONSAN" delay-proxy --listen "127.0.0.1:$port" --upstream "127.0.0.1:$KP_FWD_PORT" \
    $(printf -- '--fault %s ' "$@")
  wait_for 10 listening "$port" || true
  echo "$port"
}

host_erl2_bench() {
  local iqn=$1 fails=0 d=$KP_RUN/host port url
  port=$(erl2_proxy erl2-proxy 'up:data-out#20:corrupt=data+100' 'down:data-in#30:reset' \
    'up:byte=12000000:reset:conn=1' 'down:data-in#10:corrupt=data+100:conn=2')
  url="iscsi://127.0.0.1:$port/$iqn/0?header_digest=crc32c&data_digest=crc32c&error_recovery_level=2"
  IRONSAN_LOG=iscsi_initiator=info timeout -s INT 120 "$IRONSAN" bench "$url" --connections 2 \
    --rw write,read --size 1m --qd 4 --count 48 --span 32m --verify \
    --trace "$d/erl2.pcapng" --trace-snap 0 --json "$d/erl2.json" >"$d/erl2-bench.log" 2>&1
  c "bench --verify at ERL 2 through the proxy" test $? -eq 0
  stop erl2-proxy
  grep -v ' INFO \| WARN ' "$d/erl2-bench.log" | tail -5
  grep -E 'WARN|logged in again|reassigned' "$d/erl2-bench.log" | cut -c28-220 | sed 's/^/  | /' | head -12
  echo "  proxy: $(grep -c fired "$KP_RUN/host/erl2-proxy.log") fault(s) fired"
  sed -n 's/^delay-proxy: fault /  fired: /p' "$KP_RUN/host/erl2-proxy.log"
  c "every byte read back as written" grep -q 'no difference' "$d/erl2-bench.log"
  c "no session reinstatement" test "$(grep -c 'session reinstated' "$d/erl2-bench.log")" -eq 0
  c "cut connections logged in again" test "$(grep -c 'connection logged in again' "$d/erl2-bench.log")" -ge 1
  tshark -r "$d/erl2.pcapng" -d "tcp.port==$port,iscsi" -Y iscsi -T fields -e iscsi.opcode \
    -e iscsi.taskmanfun.function -e iscsi.taskmanfun.response -e iscsi.snack.type \
    -e iscsi.initiatortasktag -e iscsi.bufferOffset -e iscsi.reject.reason \
    -e iscsi.desireddatalength >"$d/erl2-pdus.tsv" 2>/dev/null
  python3 - "$d/erl2-pdus.tsv" >"$d/erl2-pdus.out" <<'PY'
import collections, sys
snack = reassign = frames = again = 0
rejects = collections.Counter()
answers = collections.Counter()
asked = {}  # ITT -> [(offset, length)] its R2Ts asked for, since its SCSI Command
for line in open(sys.argv[1]):
    f = (line.rstrip("\n").split("\t") + [""] * 8)[:8]
    ops = [int(v, 0) for v in f[0].split(",") if v]
    frames += 1
    snack += ops.count(0x10)
    reassign += sum(1 for v in f[1].split(",") if v and int(v, 0) == 8)
    for v in (v for v in f[2].split(",") if v):
        answers[int(v, 0)] += 1
    for reason in (v for v in f[6].split(",") if v):
        rejects[int(reason, 0)] += 1
    # Every PDU has an ITT; R2T, Data-In and Data-Out a buffer offset; R2T a length.
    itt_it, off_it, len_it = (iter(f[i].split(",")) for i in (4, 5, 7))
    for op in ops:
        itt = next(itt_it, "")
        off = next(off_it, "0") if op in (0x31, 0x25, 0x05) else None
        if op == 0x01:
            asked[itt] = []
        elif op == 0x31:
            o, n = int(off, 0), int(next(len_it, "0"), 0)
            ranges = asked.setdefault(itt, [])
            if any(o < b + m and b < o + n for b, m in ranges):
                again += 1  # data asked for a second time: recovery R2T or after reassignment
            ranges.append((o, n))
print(f"frames={frames} snack={snack} task_reassign={reassign} tmf_answers={sum(answers.values())} r2t_again={again} tmf_answer_codes={dict(answers)} rejects={dict(rejects)}")
PY
  cat "$d/erl2-pdus.out"
  c "tshark: SNACK for the damaged Data-In" grep -qE 'snack=[1-9]' "$d/erl2-pdus.out"
  c "tshark: TASK REASSIGN" grep -qE 'task_reassign=[1-9]' "$d/erl2-pdus.out"
  # LIO answers a TASK REASSIGN it carried out with 255 (see the initiator's core/erl2.rs).
  c "tshark: TASK REASSIGN answered" grep -qE 'tmf_answers=[1-9]' "$d/erl2-pdus.out"
  c "tshark: R2Ts asking for write data again" grep -qE 'r2t_again=[1-9]' "$d/erl2-pdus.out"
  ((fails)) || rm -f "$d/erl2.pcapng" # kept to look into when a check failed
  return $((fails > 0))
}

host_erl2_write() {
  local iqn=$1 fails=0 d=$KP_RUN/host port url
  port=$(erl2_proxy erl2-write-proxy 'up:byte=10000000:reset')
  url="iscsi://127.0.0.1:$port/$iqn/0?error_recovery_level=2"
  head -c 32M /dev/urandom >"$d/erl2-write.img"
  IRONSAN_LOG=iscsi_initiator=info timeout 120 "$IRONSAN" write "$url" --offset 16MiB \
    --input "$d/erl2-write.img" --trace "$d/erl2-write.pcapng" --trace-snap 0 >"$d/erl2-write.log" 2>&1
  c "write 32 MiB at ERL 2 through a cut of its only connection" test $? -eq 0
  stop erl2-write-proxy
  echo "  login keys LIO answered: $(tshark -r "$d/erl2-write.pcapng" -d "tcp.port==$port,iscsi" \
    -Y 'iscsi.opcode == 0x23' -T fields -e iscsi.keyvalue 2>/dev/null | tr '\n' ' ' | cut -c1-600)"
  echo "  TMF exchanges: $(tshark -r "$d/erl2-write.pcapng" -d "tcp.port==$port,iscsi" \
    -Y 'iscsi.opcode == 0x02 || iscsi.opcode == 0x22' -T fields -e iscsi.opcode \
    -e iscsi.taskmanfun.function -e iscsi.taskmanfun.response 2>/dev/null | tr '\n\t' '; ' | cut -c1-400)"
  grep -E 'WARN|logged in again|reassigned|reinstated' "$d/erl2-write.log" | cut -c28-220 | sed 's/^/  | /' | head -6
  c "the connection was logged in again" grep -q 'connection logged in again' "$d/erl2-write.log"
  rm -f "$d/erl2-back.img"
  timeout 120 "$IRONSAN" read "iscsi://127.0.0.1:$KP_FWD_PORT/$iqn/0" --offset 16MiB --length 32MiB \
    --output "$d/erl2-back.img"
  c "read back identical" cmp "$d/erl2-write.img" "$d/erl2-back.img"
  echo "WROTE_REGION 16 32 $(sha256sum <"$d/erl2-write.img" | cut -d' ' -f1)"
  rm -f "$d"/erl2-*.img
  return $((fails > 0))
}
