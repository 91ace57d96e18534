# Scenario 1 with two LUNs in one target (256 MiB and 192 MiB): both disks appear with their
# own sizes, each keeps its own 32 MiB pattern (no aliasing), and the second LUN gets the ext4
# round trip.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=300
host_available() { kind_available "$1"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  kinit_begin two-luns
  kinit_login two-luns
  if ! session_disks "$IQN" 2 >/tmp/lun-disks; then
    bad "two disks attached"
    cat /tmp/lun-disks
    kinit_logout
    kinit_end
    return
  fi
  sort -n /tmp/lun-disks >/tmp/lun-disks.sorted
  { read -r lun1 d1; read -r lun2 d2; } </tmp/lun-disks.sorted
  echo "LUN $lun1 -> /dev/$d1 ($(cat /sys/block/$d1/size) sectors), LUN $lun2 -> /dev/$d2 ($(cat /sys/block/$d2/size) sectors)"
  check "sd attach of LUN $lun1 clean" attach_clean "$d1"
  check "sd attach of LUN $lun2 clean" attach_clean "$d2"
  check "first LUN is 256 MiB" test "$(cat /sys/block/$d1/size)" -eq $((256 * 2048))
  check "second LUN is 192 MiB" test "$(cat /sys/block/$d2/size)" -eq $((192 * 2048))
  slow_guest_timeouts "$d1"
  slow_guest_timeouts "$d2"
  step "distinct patterns on both LUNs"
  raw_pattern_io "$d1" 32 "LUN $lun1"
  raw_pattern_io "$d2" 32 "LUN $lun2"
  dd if=/dev/$d1 of=/tmp/again1 bs=1M count=32 iflag=direct 2>/dev/null
  check "LUN $lun1 still holds its own pattern after LUN $lun2 was written" cmp /tmp/again1 /tmp/pat.$d1
  check "the two patterns differ" sh -c "! cmp -s /tmp/pat.$d1 /tmp/pat.$d2"
  step "ext4 on the second LUN"
  ext4_io "$d2" "LUN $lun2"
  kinit_logout
  kinit_end
}
