# Scenario: one LUN through two ironsan gateways (two target processes on the host serving one
# shared file with the same identity, a [gateway] group with ALUA and an owner lock file), seen
# by the guest's dm-multipath with scsi_dh_alua as one device whose path groups carry the ALUA
# priorities (multipathd's detect_prio picks the sysfs prioritizer, which reads scsi_dh_alua's
# access_state and preferred_path: A, the owner, 50; B 10). A is the preferred gateway: its
# group carries the PREF bit in both gateways' REPORT TARGET PORT GROUPS (the kernel updates a
# group's state from any path's answer, so B must list A as preferred too), and
# failback_delay_ms = 5000. fio with crc32c verify runs on the multipath device while gateway A
# is killed with kill -9 and later restarted: B takes the LUN over (its path's priority becomes
# the owner's), fio sees no error and verifies every block. A's restarted path is reinstated;
# its new session hears 2A/06, so the kernel reads A's groups again (preferred_path 1, prio
# 10 + 80), and the LUN fails back to A (A takes it back after 5 s of health, or the host
# moves first because A's path now has the best priority): A's path has the owner's priority
# again, B's a non-owner's, and a second fio with verify runs through A alone.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=900
host_available() { ironsan_target_available; }

MPATH_IQN_SUFFIX=mpath

guest_main() {
  IQN=$KP_IQN_PREFIX:$MPATH_IQN_SUFFIX
  start_iscsid
  step "host: gateways A and B for $IQN"
  if ! host_call mpath_start; then
    bad "the gateways did not start"
    finish
    return
  fi
  port_b=$(sed -n 's/^port_b=//p' "$HOST_OUT")
  A=10.0.2.2:$KP_HOST_PORT
  B=10.0.2.2:$port_b
  mpath_daemons || {
    finish
    return
  }
  for p in "$A" "$B"; do
    check "discovery through $p lists $IQN" discover "$p" "$IQN"
    iscsiadm -m node -o new -T "$IQN" -p "$p" >/dev/null
    # dm-multipath takes over recovery: a path whose session is down fails over after 5 s
    # instead of holding I/O for the single-path default.
    node_set "$p" "$IQN" node.session.timeo.replacement_timeout 5
    check "login through $p" login "$p" "$IQN"
  done
  if ! session_disks "$IQN" 2 >/tmp/lun-disks; then
    bad "two paths attached"
    mpath_end
    return
  fi
  while read -r lun dev; do
    slow_guest_timeouts "$dev"
  done </tmp/lun-disks
  map=$(mpath_map) || {
    bad "one multipath map over both paths"
    multipath -ll 2>&1 | sed 's/^/  /'
    mpath_end
    return
  }
  ok "one multipath map over both paths: /dev/mapper/$map"
  multipath -ll 2>&1 | sed 's/^/  /'
  read -r dev_a dev_b <<EOF2
$(mpath_devs_by_port)
EOF2
  check "A's path has the owner's ALUA priority (50)" test "$(mpath_prio "$dev_a")" = 50
  check "B's path has the non-owner's ALUA priority (10)" test "$(mpath_prio "$dev_b")" = 10
  step "fio with crc32c verify through /dev/mapper/$map while gateway A dies and returns"
  fio --name=kp-mpath --filename=/dev/mapper/$map --direct=1 --ioengine=libaio --iodepth=8 \
    --rw=randwrite --bssplit=4k/40:64k/40:256k/20 --blockalign=4k --size=96m --offset=0 \
    --verify=crc32c --verify_fatal=1 --do_verify=1 --verify_backlog=0 --rate=,4m \
    --output-format=json --output=/tmp/fio-mpath.json >/tmp/fio-mpath.out 2>&1 &
  fio_pid=$!
  sleep 8
  host_call mpath_kill a
  sleep 15
  mpath_paths "after A died" | sed 's/^/  /'
  host_call mpath_restart a
  t_restart=$(date +%s)
  wait $fio_pid
  rc=$?
  check "fio exit status 0" test $rc -eq 0
  python3 - /tmp/fio-mpath.json 96 <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
w, r = job["write"], job["read"]
print(f"  fio: wrote {w['io_bytes']} B, verify read {r['io_bytes']} B, errors {job['error']}")
sys.exit(0 if job["error"] == 0 and w["io_bytes"] == int(sys.argv[2]) << 20 and r["io_bytes"] == w["io_bytes"] else 1)
PY
  if [ $? -eq 0 ]; then ok "fio wrote 96 MiB across the failover and verified all of it"; else
    bad "fio JSON check"
    sed 's/^/  /' /tmp/fio-mpath.out | tail -20
  fi
  step "failback: the LUN returns to the preferred gateway A"
  i=0
  while [ $i -lt 60 ] && { [ "$(mpath_active_paths "$map")" -lt 2 ] || [ "$(mpath_prio "$dev_a")" != 50 ] || [ "$(mpath_prio "$dev_b")" != 10 ]; }; do
    sleep 1
    i=$((i + 1))
  done
  echo "  $(($(date +%s) - t_restart)) s after A's restart:"
  mpath_sysfs "$dev_a" A
  mpath_sysfs "$dev_b" B
  check "both paths active again" test "$(mpath_active_paths "$map")" -ge 2
  check "A's kernel path state carries the PREF bit (preferred_path 1)" test "$(cat /sys/block/$dev_a/device/preferred_path 2>/dev/null)" = 1
  check "A's path has the owner's priority again (50): the LUN failed back" test "$(mpath_prio "$dev_a")" = 50
  check "B's path has a non-owner's priority (10)" test "$(mpath_prio "$dev_b")" = 10
  multipath -ll 2>&1 | sed 's/^/  /'
  host_call mpath_log_moves
  step "fio with crc32c verify through /dev/mapper/$map after the failback: A carries it"
  wa=$(mpath_written "$dev_a")
  wb=$(mpath_written "$dev_b")
  fio --name=kp-mpath2 --filename=/dev/mapper/$map --direct=1 --ioengine=libaio --iodepth=8 \
    --rw=randwrite --bs=64k --size=32m --offset=128m --verify=crc32c --verify_fatal=1 \
    --do_verify=1 --rate=,8m >/tmp/fio-mpath2.out 2>&1
  rc=$?
  check "fio after the failback: exit status 0" test $rc -eq 0
  [ $rc -eq 0 ] || sed 's/^/  /' /tmp/fio-mpath2.out | tail -20
  da=$(($(mpath_written "$dev_a") - wa))
  db=$(($(mpath_written "$dev_b") - wb))
  echo "  sectors written since: A $da, B $db"
  check "the writes went through A (64 Ki sectors)" test $da -ge 65536
  check "none through B" test $db -eq 0
  dmesg | grep -E 'I/O error|Buffer I/O|critical|blk_update_request' | grep -E 'dm-' >/tmp/mpath-errors
  check "no I/O error on the multipath device in dmesg" test ! -s /tmp/mpath-errors
  sed 's/^/  /' /tmp/mpath-errors
  dmesg | grep -E 'multipath|alua|device-mapper' | tail -15 | sed 's/^/  dmesg| /'
  mpath_end
}

# mpath_daemons: udevd (multipathd learns about paths from its events), dm-multipath and the
# ALUA device handler, multipath.conf with the settings the docs give a host, multipathd.
mpath_daemons() {
  step "udevd, dm-multipath, multipathd"
  for m in dm_multipath dm_round_robin scsi_dh_alua; do check "modprobe $m" modprobe $m; done
  mkdir -p /run/udev /etc/multipath
  /lib/systemd/systemd-udevd --daemon >/tmp/udevd.log 2>&1
  udevadm trigger --action=add >/dev/null 2>&1
  udevadm settle -t 20
  cat >/etc/multipath.conf <<'EOF'
defaults {
  user_friendly_names yes
  find_multipaths no
}
devices {
  device {
    vendor "IRONSAN"
    product ".*"
    hardware_handler "1 alua"
    path_grouping_policy failover
    prio alua
    path_checker tur
    failback immediate
    no_path_retry queue
  }
}
EOF
  multipathd -s >/tmp/multipathd.log 2>&1
  i=0
  while [ $i -lt 50 ] && ! multipathd show daemon >/dev/null 2>&1; do
    sleep 0.2
    i=$((i + 1))
  done
  if multipathd show daemon >/dev/null 2>&1; then ok "multipathd runs: $(multipathd show daemon)"; else
    bad "multipathd did not start"
    sed 's/^/  /' /tmp/multipathd.log | tail -10
    return 1
  fi
}

# mpath_map: the name of the one map with two paths (bounded wait).
mpath_map() {
  i=0
  while [ $i -lt 60 ]; do
    multipath -r >/dev/null 2>&1
    name=$(multipathd show maps raw format '%n %N' 2>/dev/null | awk '$2 >= 2 {print $1; exit}')
    if [ -n "$name" ] && [ -b "/dev/mapper/$name" ]; then
      echo "$name"
      return 0
    fi
    sleep 1
    i=$((i + 1))
  done
  return 1
}

# mpath_paths LABEL: multipathd's view of every path.
mpath_paths() {
  echo "$1:"
  multipathd show paths raw format '%d %t %T %s %p' 2>/dev/null
}

# mpath_devs_by_port: the sd names of the paths through A (the slirp side of $KP_HOST_PORT) and B.
mpath_devs_by_port() {
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

# mpath_prio DEV: the path's priority as multipathd last computed it.
mpath_prio() {
  multipathd show paths raw format '%d %p' 2>/dev/null | awk -v d="$1" '$1 == d {print $2}'
}

# mpath_sysfs DEV LABEL: the kernel's (scsi_dh_alua's) view of the path: ALUA state, PREF bit,
# and multipathd's priority.
mpath_sysfs() {
  echo "  $2 ($1): access_state $(cat /sys/block/$1/device/access_state 2>/dev/null)," \
    "preferred_path $(cat /sys/block/$1/device/preferred_path 2>/dev/null), prio $(mpath_prio "$1")"
}

# mpath_written DEV: sectors written through the path so far.
mpath_written() {
  awk '{print $7}' /sys/block/$1/stat
}

# mpath_active_paths MAP: how many of MAP's paths are up and running.
mpath_active_paths() {
  multipathd show paths raw format '%m %t %T' 2>/dev/null | awk -v m="$1" '$1 == m && $2 == "active" && $3 == "ready"' | wc -l
}

mpath_end() {
  iscsiadm -m node --logoutall=all >/dev/null 2>&1
  multipath -F >/dev/null 2>&1
  multipathd shutdown >/dev/null 2>&1
  udevadm control --exit >/dev/null 2>&1
  host_call mpath_stop
}

# ---------------------------------------------------------------- host side
# The two gateways' configuration: one target name, one LUN on a shared file, the same serial
# and NAA, so that the host sees one logical unit behind two portals.
mpath_conf() {
  local gw=$1 port=$2 conf=$KP_RUN/host/mpath-$1.toml
  local me=1 peer=2 peer_name=b preferred=true peer_preferred=false
  [[ $gw == b ]] && me=2 peer=1 peer_name=a preferred=false peer_preferred=true
  cat >"$conf" <<EOF
portals = ["127.0.0.1:$port"]

[gateway]
group = "kernel-peer"
name = "gw-$gw"
port_group = $me
relative_port = $me
preferred = $preferred
failback_delay_ms = 5000

[[gateway.peer]]
name = "gw-$peer_name"
port_group = $peer
relative_port = $peer
preferred = $peer_preferred

[[target]]
name = "$KP_IQN_PREFIX:$MPATH_IQN_SUFFIX"

[target.lun.0]
size = "256MiB"
backend = { type = "file", path = "$KP_RUN/host/mpath-lun0.img", create = true }
serial = "mpath-lun0"
wwn = "0x500140512345678a"
owner_lock = "$KP_RUN/host/mpath-lun0.owner"
EOF
  echo "$conf"
}

mpath_gateway_start() {
  local gw=$1 port=$2 conf
  conf=$(mpath_conf "$gw" "$port")
  export IRONSAN_LOG=${IRONSAN_LOG:-info}
  spawn "gw-$gw" "$IRONSAN" target --config "$conf"
  wait_for 15 listening "$port" || {
    echo "gateway $gw is not listening on 127.0.0.1:$port:"
    tail -20 "$KP_RUN/host/gw-$gw.log"
    return 1
  }
  echo "gateway $gw serving on 127.0.0.1:$port"
}

host_mpath_start() {
  local port_b
  rm -f "$KP_RUN/host/mpath-lun0.img" "$KP_RUN/host/mpath-lun0.owner"
  port_b=$(free_port) || return 1
  echo "$port_b" >"$KP_RUN/host/mpath-port-b"
  mpath_gateway_start a "$KP_HOST_PORT" && mpath_gateway_start b "$port_b" || return 1
  echo "port_b=$port_b"
}

# mpath_kill GW: kill -9, as a crashed gateway.
host_mpath_kill() {
  local f=$KP_RUN/pids/gw-$1.pid
  [[ -f $f ]] || return 1
  kill -9 "$(cat "$f")" && rm -f "$f"
  echo "gateway $1 killed"
}

host_mpath_restart() {
  local port=$KP_HOST_PORT
  [[ $1 == b ]] && port=$(cat "$KP_RUN/host/mpath-port-b")
  mpath_gateway_start "$1" "$port"
}

# mpath_log_moves: what each gateway logged about ownership moves.
host_mpath_log_moves() {
  grep -hE 'failback|taken over|ownership lost' "$KP_RUN/host/gw-a.log" "$KP_RUN/host/gw-b.log" | tail -12
  return 0
}

host_mpath_stop() {
  stop gw-a
  stop gw-b
}
