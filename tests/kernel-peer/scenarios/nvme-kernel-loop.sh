# (by name only) NVMe/TCP between the guest kernel's own host (nvme-tcp, nvme-cli) and its own
# target (nvmet-tcp over configfs) on 10.0.2.15:3260, the port the host forwards to: a
# discovery log, connect, a 16 MiB O_DIRECT pattern read back, disconnect. It checks the guest
# has what the NVMe/TCP scenarios need, and sets up the reference target an initiator on the
# host can reach through 127.0.0.1:$KP_FWD_PORT.
KP_TIMEOUT=240
NQN=nqn.2026-01.org.ironsan.test:kernel-loop

# nvmet_serve FILE: the guest kernel's NVMe/TCP target serving FILE as namespace 1 of $NQN on
# 10.0.2.15:3260, any host allowed.
nvmet_serve() {
  modprobe nvmet_tcp || return 1
  cfg=/sys/kernel/config/nvmet
  mkdir -p "$cfg/subsystems/$NQN/namespaces/1" "$cfg/ports/1" || return 1
  echo 1 >"$cfg/subsystems/$NQN/attr_allow_any_host"
  echo "$1" >"$cfg/subsystems/$NQN/namespaces/1/device_path"
  # tmpfs has no O_DIRECT, nvmet's default for files.
  echo 1 >"$cfg/subsystems/$NQN/namespaces/1/buffered_io"
  echo 1 >"$cfg/subsystems/$NQN/namespaces/1/enable" || return 1
  echo tcp >"$cfg/ports/1/addr_trtype"
  echo ipv4 >"$cfg/ports/1/addr_adrfam"
  echo 10.0.2.15 >"$cfg/ports/1/addr_traddr"
  echo 3260 >"$cfg/ports/1/addr_trsvcid"
  ln -s "$cfg/subsystems/$NQN" "$cfg/ports/1/subsystems/$NQN"
}

nvmet_unserve() {
  cfg=/sys/kernel/config/nvmet
  rm -f "$cfg/ports/1/subsystems/$NQN"
  rmdir "$cfg/ports/1" 2>/dev/null
  echo 0 >"$cfg/subsystems/$NQN/namespaces/1/enable" 2>/dev/null
  rmdir "$cfg/subsystems/$NQN/namespaces/1" "$cfg/subsystems/$NQN" 2>/dev/null
}

guest_main() {
  truncate -s 64M /tmp/nvmet.img
  step "nvmet-tcp serving $NQN on 10.0.2.15:3260"
  check "nvmet configured" nvmet_serve /tmp/nvmet.img
  check "modprobe nvme_tcp" modprobe nvme_tcp
  step "nvme discover"
  nvme discover -t tcp -a 10.0.2.15 -s 3260 >/tmp/disc.out 2>&1
  sed 's/^/  /' /tmp/disc.out
  check "the discovery log lists $NQN" grep -q "subnqn: *$NQN" /tmp/disc.out
  step "nvme connect"
  check "connect" nvme connect -t tcp -a 10.0.2.15 -s 3260 -n "$NQN"
  i=0
  dev=
  while [ $i -lt 50 ] && [ -z "$dev" ]; do
    for b in /sys/block/nvme*n*; do
      [ -e "$b" ] && grep -q "$NQN" "$b/device/subsysnqn" 2>/dev/null && dev=$(basename "$b")
    done
    sleep 0.2
    i=$((i + 1))
  done
  if [ -z "$dev" ]; then
    bad "a namespace appeared"
  else
    ok "namespace /dev/$dev"
    raw_pattern_io "$dev" 16 "nvme-tcp loop"
  fi
  nvme list 2>&1 | sed 's/^/  /'
  check "disconnect" nvme disconnect -n "$NQN"
  nvmet_unserve
  check "no nvme error in dmesg" sh -c "! dmesg | grep -i nvme | grep -i -E 'error|fail'"
  dmesg | grep -i nvme | tail -8 | sed 's/^/  dmesg| /'
}
