# Scenario 1 with HeaderDigest=CRC32C and DataDigest=CRC32C: the session must report both
# digests negotiated, then the full I/O round trip runs with them. The initiator offers CRC32C
# alone, so a target that cannot do it fails the login.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=240
host_available() { kind_available "$1"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  kinit_begin digests
  node_set "$PORTAL" "$IQN" 'node.conn[0].iscsi.HeaderDigest' CRC32C
  node_set "$PORTAL" "$IQN" 'node.conn[0].iscsi.DataDigest' CRC32C
  kinit_login digests
  iscsiadm -m session -P2 | grep -E 'Digest|MaxRecvDataSegmentLength|MaxBurstLength|FirstBurstLength|ImmediateData|InitialR2T' | sed 's/^[ \t]*/  /'
  check "HeaderDigest negotiated CRC32C" sh -c "iscsiadm -m session -P2 | grep -q 'HeaderDigest: CRC32C'"
  check "DataDigest negotiated CRC32C" sh -c "iscsiadm -m session -P2 | grep -q 'DataDigest: CRC32C'"
  kinit_disk_io digests
  kinit_logout
  kinit_end
}
