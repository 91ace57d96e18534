# Scenario 1 over iSER on ironsan's rdma-core provider: the ironsan target built with the
# rdma-core feature (target/verbs/release/ironsan, built by stage 40-iwarp-verbs-build) runs in
# the guest on siw0 through libibverbs/librdmacm (iser_provider = "rdma-core"), and the kernel's
# ib_iser logs in to it over siw0: SendTargets over TCP on port 3260, the node on the iser
# transport on port 3261 (rdma_cm owns that port), iSER login, 32 MiB O_DIRECT pattern, ext4
# round trip, fio random writes with crc32c verify, logout; then (issue 14: a listener no client
# can stall) login again while 1,000 idle TCP connections, port probes, bad and silent MPA
# clients and one trickling a byte every half second hold the rdma_cm port, and once more after
# they leave; no iser/siw error in the kernel log and no error in the target's log.
# Measured (1 vCPU guest): 32 MiB O_DIRECT written at 28 MB/s, read at 50 MB/s; fio 64 MiB
# randwrite verified at 24 MiB/s. Before the completion task polled its queue empty, writes ran
# at 225 kB/s and fio's QP died: the verbs provider handed over at most 16 completions per poll,
# the task asked for 32 and took 16 for "empty", and the rest waited for the next event (the
# 1 s NOP-Out, the 10 s NOP-In).
KP_TIMEOUT=600
host_available() { verbs_ironsan_available; }

# hostile_clients_beside_login: the kernel's iSER initiator logs in and writes a pattern while
# hostile.py holds the rdma_cm port, within the time the clients are held; the target is alive
# afterwards and serves one more login.
hostile_clients_beside_login() {
  step "hostile clients on $PORTAL (siw's MPA listener, then the target's rdma_cm listener)"
  python3 /mnt/host/guest/hostile.py 10.0.2.15 3261 1000 40 >/tmp/hostile.out 2>&1 &
  hostile=$!
  wait_line /tmp/hostile.out '^ready' $hostile 300
  sed 's/^/  hostile| /' /tmp/hostile.out
  check "1,000 idle connections and the bad clients are in place" grep -q '^ready: 1000 idle' /tmp/hostile.out
  t0=$(date +%s)
  kinit_login "iser-verbs, beside the hostile clients"
  kinit_pattern "iser-verbs, beside the hostile clients" 8
  t1=$(date +%s)
  echo "  login and 8 MiB pattern took $((t1 - t0)) s while the hostile clients were held"
  check "the login and the pattern finished while the hostile clients were still held" kill -0 $hostile
  wait $hostile
  check "the hostile clients ran to their end" test $? -eq 0
  sed -n 's/^done/  hostile| done/p' /tmp/hostile.out
  check "the target survived the hostile clients" kill -0 $target
  # What the target made of the MPA clients rdma_cm passed on (one line per connection).
  grep -v -E 'login complete|connection ended' /tmp/target.log | grep -i -E 'refused|timed out|dropped|login' |
    head -5 | sed 's/^/  target| /'
  kinit_logout
  kinit_login "iser-verbs, after the hostile clients"
  kinit_pattern "iser-verbs, after the hostile clients" 4
}

guest_main() {
  . /mnt/host/guest/kinit.sh
  iser_setup
  start_iscsid
  host_call verbs_ironsan_stage
  check "host: the rdma-core build of ironsan staged" test $? -eq 0
  IQN=$KP_IQN_PREFIX:iser-verbs
  PORTAL=10.0.2.15:3261
  cat >/tmp/iser-verbs.toml <<EOT
portals = ["tcp://10.0.2.15:3260", "iser://10.0.2.15:3261"]
iser_provider = "rdma-core"

[[target]]
name = "$IQN"

[target.lun.0]
size = "256MiB"
backend = "memory"
EOT
  step "ironsan target (rdma-core provider on siw0) in the guest"
  # Registration on an RDMA device pins memory: the default 8 MiB memlock limit is too small.
  ulimit -l unlimited
  IRONSAN_LOG=info,datamover_iser=debug /mnt/host/bin/ironsan-verbs target --config /tmp/iser-verbs.toml >/tmp/target.log 2>&1 &
  target=$!
  wait_line /tmp/target.log "serving iSCSI on 10.0.2.15:3261" $target 100
  sed 's/^/  target| /' /tmp/target.log
  check "the target serves iSER on 10.0.2.15:3261 through rdma-core" grep -q "serving iSCSI on 10.0.2.15:3261 (iSER on verbs (rdma-core device siw0))" /tmp/target.log

  step "SendTargets discovery on 10.0.2.15:3260 (TCP)"
  check "discovery lists $IQN" discover 10.0.2.15:3260 "$IQN"
  node_new "$PORTAL" "$IQN"
  check "iser-verbs: node uses the iser transport" node_set "$PORTAL" "$IQN" iface.transport_name iser
  # siw's own debug lines for the first login and attach (why a QP terminates, if one does).
  mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug 2>/dev/null
  echo 'module siw +p' >/sys/kernel/debug/dynamic_debug/control 2>/dev/null
  kinit_login iser-verbs
  iser_session_check iser-verbs
  if [ "$FAILS" -eq 0 ]; then
    kinit_disk_io iser-verbs
  fi
  echo 'module siw -p' >/sys/kernel/debug/dynamic_debug/control 2>/dev/null
  if [ "$FAILS" -gt 0 ]; then
    echo "siw's debug lines (a check failed):"
    dmesg | grep -i -E 'siw|iser' | grep -v -i -E 'tx_flush|rx_flush' | head -80 | sed 's/^/  dmesg| /'
  fi
  # A failure so far leaves the rest to time out: go straight to the logs.
  if [ "$FAILS" -eq 0 ]; then
    command -v fio >/dev/null && kinit_fio iser-verbs 64
    kinit_logout
    hostile_clients_beside_login
  fi
  kinit_logout

  iser_dmesg_clean
  kill $target 2>/dev/null
  i=0
  while kill -0 $target 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  if [ "$FAILS" -gt 0 ]; then
    echo "the target's log (a check failed):"
    tail -60 /tmp/target.log | sed 's/^/  target| /'
  else
    tail -5 /tmp/target.log | sed 's/^/  target| /'
  fi
  check "the target's log has no ERROR line and no panic" sh -c "! grep -E 'panicked|ERROR' /tmp/target.log"
  finish
}
