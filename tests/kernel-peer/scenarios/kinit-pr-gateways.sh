# Scenario: persistent reservations across two ironsan gateways (docs/reservations.md). Two
# target processes on the host serve one shared file LUN (same serial and NAA, a [gateway]
# group, an owner lock file, `reservations = "PATH"`). The guest logs in to both gateways, no
# dm-multipath: two sd devices for one LUN, each an I_T nexus of its own (the relative target
# ports differ). With sg_persist (sg3-utils): a key registered and WRITE EXCLUSIVE reserved
# through A is seen through B (--read-keys, --read-reservation); a WRITE through B gets
# RESERVATION CONFLICT (sg_raw) while one through A is GOOD; the reservation survives a
# kill -9 and restart of gateway A; --read-full-status shows each registration's relative
# target port; B registers and CLEARs. A registration made with ALL_TG_PT through A covers
# every target port of the same initiator port (iSCSI name and ISID): open-iscsi gives each
# session its own ISID, so B's WRITE still conflicts unless both sessions share one.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=600
host_available() { ironsan_target_available; }

PRGW_IQN_SUFFIX=pr-gateways

guest_main() {
  IQN=$KP_IQN_PREFIX:$PRGW_IQN_SUFFIX
  start_iscsid
  step "host: gateways A and B for $IQN"
  if ! host_call prgw_start; then
    bad "the gateways did not start"
    finish
    return
  fi
  port_b=$(sed -n 's/^port_b=//p' "$HOST_OUT")
  A=10.0.2.2:$KP_HOST_PORT
  B=10.0.2.2:$port_b
  for p in "$A" "$B"; do
    iscsiadm -m node -o new -T "$IQN" -p "$p" >/dev/null
    node_set "$p" "$IQN" node.session.timeo.replacement_timeout 60
    check "login through $p" login "$p" "$IQN"
  done
  if ! session_disks "$IQN" 2 >/tmp/lun-disks; then
    bad "two disks attached (one per gateway)"
    prgw_end
    return
  fi
  read -r da db <<EOF2
$(prgw_devs_by_port)
EOF2
  echo "through A: /dev/$da, through B: /dev/$db"
  check "two sd devices, one per gateway" test -n "$da" -a -n "$db" -a "$da" != "$db"
  slow_guest_timeouts "$da"
  slow_guest_timeouts "$db"
  pa=/dev/$da
  pb=/dev/$db

  step "register 0xa1 and reserve WRITE EXCLUSIVE through A"
  check "register 0xa1 through A" sgp --out --register --param-sark=0xa1 "$pa"
  check "reserve WRITE EXCLUSIVE through A" sgp --out --reserve --param-rk=0xa1 --prout-type=1 "$pa"
  prgw_seen_through_b 0xa1 "after the reservation"
  step "WRITE through B (another I_T nexus) conflicts; through A it is GOOD"
  check "WRITE(10) through B: RESERVATION CONFLICT" prgw_write_status "$pb" conflict
  check "WRITE(10) through A: GOOD" prgw_write_status "$pa" good

  step "gateway A killed (kill -9) and restarted: the reservation stays"
  host_call prgw_kill a
  host_call prgw_restart a || bad "gateway A restarted"
  i=0
  while [ $i -lt 60 ] && ! sgp --in --read-reservation "$pa" >/tmp/prgw-a 2>&1; do
    sleep 1
    i=$((i + 1))
  done
  check "through A after its restart: reservation 0xa1, Write Exclusive" \
    grep -q -i 'Key=0xa1' /tmp/prgw-a
  sed 's/^/  /' /tmp/prgw-a
  prgw_seen_through_b 0xa1 "after A's restart"
  check "WRITE(10) through B still conflicts" prgw_write_status "$pb" conflict

  step "register 0xb2 and CLEAR through B"
  check "register 0xb2 through B" sgp --out --register --param-sark=0xb2 "$pb"
  # Both registrations with their I_T nexuses: an initiator port is the initiator's name and
  # the session's ISID, a target port is the relative port (1: A, 2: B).
  sgp --in --read-full-status "$pa" >/tmp/prgw-full
  sed 's/^/  /' /tmp/prgw-full
  check "full status through A: 0xa1 on relative port 1, 0xb2 on relative port 2" \
    sh -c "grep -A3 -i 'Key=0xa1' /tmp/prgw-full | grep -q -i 'Relative port address: 0x1' &&
           grep -A3 -i 'Key=0xb2' /tmp/prgw-full | grep -q -i 'Relative port address: 0x2'"
  ports=$(grep -i 'iSCSI world wide unique port id' /tmp/prgw-full | sed 's/.*: *//' | sort -u | wc -l)
  check "CLEAR through B" sgp --out --clear --param-rk=0xb2 "$pb"
  sgp --in --read-keys "$pa" >/tmp/prgw-keys 2>&1
  check "through A: no keys left" grep -q -i 'there are NO registered reservation keys' /tmp/prgw-keys
  sed 's/^/  /' /tmp/prgw-keys
  check "WRITE(10) through B: GOOD once cleared" prgw_write_status "$pb" good

  step "ALL_TG_PT: registered through A for every target port"
  check "register 0xc3 through A with ALL_TG_PT" \
    sgp --out --register --param-sark=0xc3 --param-alltgpt "$pa"
  check "reserve WRITE EXCLUSIVE through A" sgp --out --reserve --param-rk=0xc3 --prout-type=1 "$pa"
  prgw_seen_through_b 0xc3 "ALL_TG_PT"
  sgp --in --read-full-status "$pb" >/tmp/prgw-full
  check "full status through B: 0xc3 registered for all target ports" \
    sh -c "grep -A1 -i 'Key=0xc3' /tmp/prgw-full | grep -q -i 'All target ports bit set'"
  # ALL_TG_PT extends a registration to every target port of the same initiator port. open-iscsi
  # gives each session an ISID of its own, so the nexus through B is another initiator port
  # (the full status above shows $ports): still not the holder.
  if [ "$ports" -eq 1 ]; then
    check "WRITE(10) through B: GOOD (one initiator port: the registration covers B's port)" \
      prgw_write_status "$pb" good
  else
    check "WRITE(10) through B: RESERVATION CONFLICT (B's session is another initiator port)" \
      prgw_write_status "$pb" conflict
  fi
  check "release through A" sgp --out --release --param-rk=0xc3 --prout-type=1 "$pa"
  sgp --in --read-reservation "$pb" >/tmp/prgw-res 2>&1
  check "through B: no reservation after the release" grep -q -i 'no reservation' /tmp/prgw-res
  sed 's/^/  /' /tmp/prgw-res
  check "clear through A" sgp --out --clear --param-rk=0xc3 "$pa"
  prgw_end
}

# sgp ARGS...: sg_persist -n, sent again (at most 30 tries) while it ends in a unit attention
# (a gateway's restart or an ALUA state change reports one once per nexus) or NOT READY (the
# gateway in ALUA transition: taking the LUN over, or in its hold-down after losing it to the
# other, whose PERSISTENT RESERVE OUT it refuses), as sd does; its output goes to stdout
# whatever the result.
sgp() {
  t=0
  while :; do
    sg_persist -n "$@" >/tmp/sgp.out 2>&1
    rc=$?
    t=$((t + 1))
    if [ $rc -eq 0 ] || [ $t -ge 30 ] || ! grep -q -i -e 'unit attention' -e 'not ready' /tmp/sgp.out; then break; fi
    grep -q -i 'not ready' /tmp/sgp.out && sleep 0.5
  done
  cat /tmp/sgp.out
  return $rc
}

# prgw_seen_through_b KEY LABEL: B reports KEY registered and holding WRITE EXCLUSIVE.
prgw_seen_through_b() {
  sgp --in --read-keys "$pb" >/tmp/prgw-keys 2>&1
  check "through B ($2): --read-keys lists $1" grep -q -i "$1" /tmp/prgw-keys
  sed 's/^/  /' /tmp/prgw-keys
  sgp --in --read-reservation "$pb" >/tmp/prgw-res 2>&1
  check "through B ($2): --read-reservation: $1, Write Exclusive" \
    sh -c "grep -q -i 'Key=$1' /tmp/prgw-res && grep -q -i 'type: Write Exclusive\$' /tmp/prgw-res"
  sed 's/^/  /' /tmp/prgw-res
}

# prgw_write_status DEV good|conflict: one block written at LBA 4096 with sg_raw; its status.
prgw_write_status() {
  head -c 512 /dev/urandom >/tmp/prgw-blk
  t=0
  while [ $t -lt 30 ]; do
    sg_raw -s 512 -i /tmp/prgw-blk "$1" 2a 00 00 00 10 00 00 00 01 00 >/tmp/prgw-raw 2>&1
    grep -q -i -e 'unit attention' -e 'not ready' /tmp/prgw-raw || break
    grep -q -i 'not ready' /tmp/prgw-raw && sleep 0.5
    t=$((t + 1))
  done
  sed 's/^/    /' /tmp/prgw-raw
  case $2 in
    good) grep -q -i 'SCSI Status: Good' /tmp/prgw-raw ;;
    conflict) grep -q -i 'Reservation Conflict' /tmp/prgw-raw ;;
  esac
}

# prgw_devs_by_port: the sd names of the paths through A (the slirp side of $KP_HOST_PORT) and B.
prgw_devs_by_port() {
  a=
  b=
  for s in /sys/class/iscsi_session/session*; do
    conn=$(ls -d "$s"/device/connection*/iscsi_connection/connection* 2>/dev/null | head -1)
    port=$(cat "$conn/persistent_port" 2>/dev/null)
    d=$(ls "$s"/device/target*/*/block 2>/dev/null | head -1)
    if [ "$port" = "$KP_HOST_PORT" ]; then a=$d; else b=$d; fi
  done
  echo "$a $b"
}

prgw_end() {
  iscsiadm -m node --logoutall=all >/dev/null 2>&1
  host_call prgw_stop
  finish
}

# ---------------------------------------------------------------- host side
# The two gateways' configuration: one target, one LUN on a shared file with the same serial
# and NAA, its owner lock and its reservations beside it.
prgw_conf() {
  local gw=$1 port=$2 conf=$KP_RUN/host/prgw-$1.toml
  local me=1 peer=2 peer_name=b
  [[ $gw == b ]] && me=2 peer=1 peer_name=a
  cat >"$conf" <<EOF
portals = ["127.0.0.1:$port"]

[gateway]
group = "kernel-peer-pr"
name = "gw-$gw"
port_group = $me
relative_port = $me

[[gateway.peer]]
name = "gw-$peer_name"
port_group = $peer
relative_port = $peer

[[target]]
name = "$KP_IQN_PREFIX:$PRGW_IQN_SUFFIX"

[target.lun.0]
size = "64MiB"
backend = { type = "file", path = "$KP_RUN/host/prgw-lun0.img", create = true }
serial = "prgw-lun0"
wwn = "0x500140512345679b"
owner_lock = "$KP_RUN/host/prgw-lun0.owner"
reservations = "$KP_RUN/host/prgw-lun0.pr"
EOF
  echo "$conf"
}

prgw_gateway_start() {
  local gw=$1 port=$2 conf
  conf=$(prgw_conf "$gw" "$port")
  export IRONSAN_LOG=${IRONSAN_LOG:-info}
  spawn "prgw-$gw" "$IRONSAN" target --config "$conf"
  wait_for 15 listening "$port" || {
    echo "gateway $gw is not listening on 127.0.0.1:$port:"
    tail -20 "$KP_RUN/host/prgw-$gw.log"
    return 1
  }
  echo "gateway $gw serving on 127.0.0.1:$port"
}

host_prgw_start() {
  local port_b
  rm -f "$KP_RUN"/host/prgw-lun0.*
  port_b=$(free_port) || return 1
  echo "$port_b" >"$KP_RUN/host/prgw-port-b"
  prgw_gateway_start a "$KP_HOST_PORT" && prgw_gateway_start b "$port_b" || return 1
  echo "port_b=$port_b"
}

host_prgw_kill() {
  local f=$KP_RUN/pids/prgw-$1.pid
  [[ -f $f ]] || return 1
  kill -9 "$(cat "$f")" && rm -f "$f"
  echo "gateway $1 killed"
}

host_prgw_restart() {
  local port=$KP_HOST_PORT
  [[ $1 == b ]] && port=$(cat "$KP_RUN/host/prgw-port-b")
  prgw_gateway_start "$1" "$port"
}

host_prgw_stop() {
  stop prgw-a
  stop prgw-b
}
