# Scenario 1 over iSER: the kernel's ib_iser initiator over siw against the ironsan target on
# the host (its software iWARP RNIC), iSCSI/TCP and iSER on one port: SendTargets over TCP,
# the node switched to the iser transport, iSER login, 32 MiB O_DIRECT pattern, ext4 round
# trip, logout; no iser/siw error in the kernel log.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=300
host_available() { kind_available "$1"; }

guest_main() {
  for m in siw rdma_ucm ib_uverbs ib_iser; do check "modprobe $m" modprobe $m; done
  check "siw0 on eth0" rdma link add siw0 type siw netdev eth0
  . /mnt/host/guest/kinit.sh
  kinit_begin iser
  check "node uses the iser transport" node_set "$PORTAL" "$IQN" iface.transport_name iser
  kinit_login iser
  iscsiadm -m session -P1 2>/dev/null | grep -E 'Iface Transport|Current Portal' | sed 's/^[ \t]*/  /'
  check "the session runs over iser" sh -c "iscsiadm -m session -P1 | grep -q 'Iface Transport: iser'"
  kinit_disk_io iser
  kinit_logout
  # (siw is built out of tree: its unsigned-module taint line is not an error.)
  dmesg | grep -i -E 'iser|siw' | grep -v 'module verification failed' |
    grep -i -E 'err|fail|timeout|drop' >/tmp/iser-errors
  sed 's/^/  dmesg| /' /tmp/iser-errors
  check "no iser or siw error in the kernel log" test ! -s /tmp/iser-errors
  kinit_end
}
