# Scenario 1, recovery: the kernel initiator writes a 32 MiB pattern, then the host resets the
# target's end of the TCP connection (ss -K). open-iscsi must log in again by itself (within its
# 60 s replacement timeout) and the pattern must read back intact through the new connection;
# a second pattern written after recovery must read back too.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=240
host_available() { kind_available "$1"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  kinit_begin basic
  kinit_login reconnect
  if ! session_disks "$IQN" >/tmp/lun-disks; then
    bad "no disk attached"
    kinit_end
    return
  fi
  read -r lun dev </tmp/lun-disks
  step "pattern before the connection reset"
  slow_guest_timeouts "$dev"
  raw_pattern_io "$dev" 32 "before reset"
  step "host resets the target's TCP connection"
  host_call drop_connection
  check "the host found a connection to reset" test $? -eq 0
  step "read back through the recovered session"
  dd if=/dev/$dev of=/tmp/after bs=1M count=32 iflag=direct 2>&1 | tail -1
  check "pattern intact after the reset" cmp /tmp/after /tmp/pat.$dev
  iscsiadm -m session -P1 | grep -E 'State|Portal' | sed 's/^[ \t]*/  /'
  check "session logged in again" sh -c "iscsiadm -m session -P1 | grep -q 'iSCSI Session State: LOGGED_IN'"
  dmesg | grep -i -E 'connection[0-9]|session recovery|offline' | tail -5 | sed 's/^/  /'
  step "new data after recovery"
  raw_pattern_io "$dev" 16 "after reset"
  kinit_logout
  kinit_end
}

# drop_connection: resets every established TCP connection of the host target (its side).
host_drop_connection() {
  local n
  n=$(ss -tnH state established "sport = :$KP_HOST_PORT" | wc -l)
  echo "established connections on :$KP_HOST_PORT: $n"
  ((n > 0)) || return 1
  ss -K -tn state established "sport = :$KP_HOST_PORT" >/dev/null
  echo "reset; now: $(ss -tnH state established "sport = :$KP_HOST_PORT" | wc -l)"
}
