# Guest side shared by the kinit-* scenarios: the kernel's open-iscsi initiator (iscsi_tcp)
# against a target on the host, reached through slirp at 10.0.2.2:$KP_HOST_PORT.

# kinit_begin VARIANT: starts iscsid, has the host serve $KP_IQN_PREFIX:VARIANT with target
# kind $KP_KIND, runs SendTargets discovery and makes a fresh node record. Sets IQN, PORTAL.
kinit_begin() {
  IQN=$KP_IQN_PREFIX:$1
  PORTAL=10.0.2.2:$KP_HOST_PORT
  start_iscsid
  step "host: $KP_KIND target for $IQN"
  host_call target_start "$1" || {
    bad "host target did not start"
    finish
    exit 1
  }
  step "SendTargets discovery on $PORTAL"
  check "discovery lists $IQN" discover "$PORTAL" "$IQN"
  node_new "$PORTAL" "$IQN"
}

# kinit_login LABEL: login must succeed and a session for IQN must exist.
kinit_login() {
  step "login ($1)"
  if login "$PORTAL" "$IQN"; then ok "$1: login"; else bad "$1: login"; fi
}

# kinit_login_refused LABEL: login must fail and leave no session.
kinit_login_refused() {
  step "login that must be refused ($1)"
  if login "$PORTAL" "$IQN" >/tmp/refused.out 2>&1; then
    bad "$1: login succeeded but must be refused"
    logout "$PORTAL" "$IQN" >/dev/null 2>&1
  else
    ok "$1: login refused"
  fi
  sed 's/^/  /' /tmp/refused.out
  check "$1: no session left" no_session "$IQN"
}

# kinit_disk_io LABEL: the session's first disk gets the 32 MiB O_DIRECT pattern and the ext4
# round trip.
kinit_disk_io() {
  if ! session_disks "$IQN" >/tmp/lun-disks; then
    bad "$1: no disk attached"
    return
  fi
  read -r lun dev </tmp/lun-disks
  echo "LUN $lun -> /dev/$dev: $(cat /sys/block/$dev/size) sectors," \
    "$(cat /sys/block/$dev/device/vendor) $(cat /sys/block/$dev/device/model)"
  check "$1: sd attach read the mode pages, no failed command" attach_clean "$dev"
  slow_guest_timeouts "$dev"
  step "raw I/O on /dev/$dev"
  raw_pattern_io "$dev" 32 "$1"
  step "ext4 on /dev/$dev"
  ext4_io "$dev" "$1"
}

# kinit_fio LABEL MIB: fio random writes of mixed 4 KiB-1 MiB blocks over MIB MiB of the
# session's first disk at queue depth 16, crc32c verify of every block; fio's JSON must show
# MIB MiB written, no errors, and the verify pass reading the same amount back.
kinit_fio() {
  if ! session_disks "$IQN" >/tmp/lun-disks; then
    bad "$1: no disk attached"
    return
  fi
  read -r lun dev </tmp/lun-disks
  slow_guest_timeouts "$dev"
  step "fio on /dev/$dev (LUN $lun)"
  fio --name=kp-verify --filename=/dev/$dev --direct=1 --ioengine=libaio --iodepth=16 \
    --rw=randwrite --bssplit=4k/30:16k/20:64k/20:256k/15:1m/15 --blockalign=4k \
    --size="$2"m --offset=0 --norandommap=0 --verify=crc32c --verify_fatal=1 --do_verify=1 \
    --verify_backlog=0 --output-format=json --output=/tmp/fio.json
  rc=$?
  check "$1: fio exit status 0" test $rc -eq 0
  python3 - /tmp/fio.json "$2" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
w, r = job["write"], job["read"]
print(f"  fio: wrote {w['io_bytes']} B in {w['total_ios']} I/Os, verify read {r['io_bytes']} B, "
      f"errors {job['error']}, write {w['bw'] / 1024:.1f} MiB/s")
ok = job["error"] == 0 and w["io_bytes"] == int(sys.argv[2]) << 20 and r["io_bytes"] == w["io_bytes"]
sys.exit(0 if ok else 1)
PY
  if [ $? -eq 0 ]; then ok "$1: fio wrote $2 MiB, verified all of it, no errors"; else bad "$1: fio JSON check"; fi
}

# iser_setup: siw on eth0 and the kernel's iSER initiator loaded.
iser_setup() {
  for m in siw rdma_ucm ib_uverbs ib_iser; do check "modprobe $m" modprobe $m; done
  if rdma link show siw0/1 >/dev/null 2>&1; then
    ok "siw0 on eth0 (from an earlier scenario)"
  else
    check "siw0 on eth0" rdma link add siw0 type siw netdev eth0
  fi
}

# iser_node VARIANT: the host target for VARIANT, discovery over TCP, the node on iser.
iser_node() {
  kinit_begin "$1"
  check "$1: node uses the iser transport" node_set "$PORTAL" "$IQN" iface.transport_name iser
}

iser_session_check() {
  iscsiadm -m session -P1 2>/dev/null | grep -E 'Iface Transport|Current Portal' | sed 's/^[ \t]*/  /'
  check "$1: the session runs over iser" sh -c "iscsiadm -m session -P1 | grep -q 'Iface Transport: iser'"
}

# kinit_pattern LABEL MIB: an O_DIRECT pattern of MIB MiB on the session's first disk.
kinit_pattern() {
  if session_disks "$IQN" >/tmp/lun-disks; then
    read -r lun dev </tmp/lun-disks
    raw_pattern_io "$dev" "$2" "$1"
  else
    bad "$1: no disk attached"
  fi
}

kinit_logout() {
  step "logout"
  check "logout" logout "$PORTAL" "$IQN"
  check "no session after logout" no_session "$IQN"
}

kinit_end() {
  # Shown, not judged: under a loaded host a recovery can happen without a fault, and the data
  # checks above decide. When something did fail, these lines say what the kernel went through.
  if recovery_events >/tmp/recovery; then
    echo "note: kernel recovery / error handling during this scenario:"
    sed 's/^/  /' /tmp/recovery
    [ -s /tmp/iscsid.log ] && tail -5 /tmp/iscsid.log | sed 's/^/  iscsid| /'
  fi
  host_call target_stop
  finish
}
