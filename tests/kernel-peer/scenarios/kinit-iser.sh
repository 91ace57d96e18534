# Scenario 1 over iSER: the kernel's ib_iser initiator over siw against the ironsan target on
# the host (its software iWARP RNIC), iSCSI/TCP and iSER on one port: SendTargets over TCP, the
# node switched to the iser transport, iSER login, 32 MiB O_DIRECT pattern, ext4 round trip,
# fio random writes with crc32c verify, logout and login again; then with CHAP (a wrong secret
# refused); no iser/siw error in the kernel log. (MPA CRC: scenario kinit-iser-crc.)
# Both phases are captured on the host's loopback hop and checked with tshark's iWARP
# dissectors (iser-capture-check.py: framing, no R2T/Data-In, RDMA Writes and Read Requests
# on STags the responses invalidate); the CHAP phase whole, so that `ironsan analyze` must count
# exactly the 8 MiB dd wrote and the 8 MiB (plus the attach reads) it read.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=600
KP_CAPTURE=1
KP_FULL_CAPTURE="iser-chap"
host_available() { kind_available "$1"; }
host_check_capture() { check_iser_capture "$@"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  iser_setup

  iser_node iser
  kinit_login iser
  iser_session_check iser
  kinit_disk_io iser
  command -v fio >/dev/null && kinit_fio iser 64
  kinit_logout
  kinit_login "iser, again"
  kinit_pattern "iser, again" 8
  kinit_logout
  check "iser: the capture decoded by tshark" host_call check_capture iser

  iser_node iser-chap
  node_set "$PORTAL" "$IQN" node.session.auth.authmethod CHAP
  node_set "$PORTAL" "$IQN" node.session.auth.username "$KP_CHAP_USER"
  node_set "$PORTAL" "$IQN" node.session.auth.password "wrong-$KP_CHAP_SECRET"
  kinit_login_refused "iser, CHAP, wrong secret"
  node_set "$PORTAL" "$IQN" node.session.auth.password "$KP_CHAP_SECRET"
  kinit_login "iser, CHAP"
  kinit_pattern "iser, CHAP" 8
  kinit_logout
  check "iser, CHAP: the capture decoded by tshark, the analyzer's bytes = dd's" \
    host_call check_capture iser-chap --write-bytes 8388608 --read-bytes 8388608

  iser_dmesg_clean
  kinit_end
}
