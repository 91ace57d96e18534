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
