# Scenario 4 (readiness for iSER): the out-of-tree siw module loads, a siw device attaches to
# eth0 and shows as an iWARP verbs device, and rping (rdma_cm + RDMA READ/WRITE over siw, with
# its data validation on) completes its pings inside the guest.
KP_TIMEOUT=120

guest_main() {
  for m in siw rdma_ucm ib_uverbs; do check "modprobe $m" modprobe $m; done
  step "rdma link add siw0 type siw netdev eth0"
  check "siw0 on eth0" rdma link add siw0 type siw netdev eth0
  rdma link
  ibv_devinfo -d siw0 | grep -E 'hca_id|transport|fw_ver|state|active_mtu'
  check "siw0 is an iWARP verbs device" sh -c "ibv_devinfo -d siw0 | grep -q 'transport:.*iWARP'"
  step "rping over siw on 10.0.2.15 (server and client in the guest)"
  rping -s -a 10.0.2.15 -p 7174 -C 10 -S 100 -V >/tmp/rping-s.log 2>&1 &
  sleep 1
  timeout 60 rping -c -a 10.0.2.15 -p 7174 -C 10 -S 100 -V -v >/tmp/rping-c.log 2>&1
  rc=$?
  wait
  head -3 /tmp/rping-c.log
  echo "  ... $(grep -c 'ping data' /tmp/rping-c.log) lines of ping data"
  echo "  server: $(cat /tmp/rping-s.log)"
  check "rping client exit status 0" test $rc -eq 0
  check "10 validated pings" test "$(grep -c 'ping data: rdma-ping-' /tmp/rping-c.log)" -eq 10
  check "server saw no error" sh -c "! grep -qi -E 'error|fail' /tmp/rping-s.log"
  finish
}
