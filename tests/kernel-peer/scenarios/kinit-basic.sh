# Scenario 1: the kernel open-iscsi initiator against a target on the host (kind: ironsan or
# tgtd): SendTargets discovery, login, 32 MiB O_DIRECT pattern, ext4 round trip, logout.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=240
host_available() { kind_available "$1"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  kinit_begin basic
  kinit_login basic
  kinit_disk_io basic
  kinit_logout
  kinit_end
}
