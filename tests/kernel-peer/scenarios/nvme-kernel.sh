# The guest kernel's NVMe/TCP host (nvme-tcp, nvme-cli) against ironsan's NVMe/TCP target on the
# host (10.0.2.2): one RAM LUN exported over iSCSI and as namespace 1 of a subsystem; nvme
# discover lists it, connect, a 16 MiB O_DIRECT pattern read back, disconnect; then the same
# with header and data digests (-g -G); no nvme error in dmesg.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=300
NQN=nqn.2026-01.org.ironsan.test:nvme-kernel
host_available() { ironsan_target_available; }

# nvme_dev: the block device of $NQN's namespace, once it appears (bounded wait).
nvme_dev() {
  i=0
  dev=
  while [ $i -lt 50 ] && [ -z "$dev" ]; do
    for b in /sys/block/nvme*n*; do
      [ -e "$b" ] && grep -q "$NQN" "$b/device/subsysnqn" 2>/dev/null && dev=$(basename "$b")
    done
    [ -z "$dev" ] && sleep 0.2
    i=$((i + 1))
  done
  echo "$dev"
}

# nvme_pass LABEL CONNECT-OPTIONS...: connect, pattern, disconnect.
nvme_pass() {
  nvme_label=$1
  shift
  step "nvme connect $*"
  check "$nvme_label: connect" nvme connect -t tcp -a 10.0.2.2 -s "$NVME_PORT" -n "$NQN" "$@"
  dev=$(nvme_dev)
  if [ -z "$dev" ]; then
    bad "$nvme_label: a namespace appeared"
    return
  fi
  ok "$nvme_label: namespace /dev/$dev ($(cat /sys/block/$dev/size) sectors)"
  raw_pattern_io "$dev" 16 "$nvme_label"
  nvme list 2>&1 | sed 's/^/  /'
  check "$nvme_label: disconnect" nvme disconnect -n "$NQN"
}

guest_main() {
  if ! host_call nvme_start; then
    bad "the host target started"
    return
  fi
  NVME_PORT=$(sed -n 's/^nvme_port=//p' "$HOST_OUT")
  DISC_PORT=$(sed -n 's/^discovery_port=//p' "$HOST_OUT")
  check "modprobe nvme_tcp" modprobe nvme_tcp
  step "nvme discover"
  nvme discover -t tcp -a 10.0.2.2 -s "$DISC_PORT" >/tmp/disc.out 2>&1
  sed 's/^/  /' /tmp/disc.out
  check "the discovery log lists $NQN" grep -q "subnqn: *$NQN" /tmp/disc.out
  nvme_pass plain
  nvme_pass digests -g -G
  host_call nvme_stop
  check "no nvme error in dmesg" sh -c "! dmesg | grep -i nvme | grep -i -E 'error|fail'"
  dmesg | grep -i nvme | tail -8 | sed 's/^/  dmesg| /'
}

# nvme_start: ironsan target with one 256 MiB RAM LUN, iSCSI on $KP_HOST_PORT, NVMe/TCP and its
# discovery controller on free ports of 127.0.0.1 (the guest's 10.0.2.2).
host_nvme_start() {
  local conf=$KP_RUN/host/ironsan-nvme.toml nvme disc
  nvme=$(free_port) || return 1
  disc=$(free_port) || return 1
  cat >"$conf" <<CONF
portals = ["127.0.0.1:$KP_HOST_PORT"]

[[target]]
name = "$KP_IQN_PREFIX:nvme"

[target.lun.0]
size = "256MiB"
backend = "memory"

[[subsystem]]
nqn = "$NQN"
allow_any_host = true
listen = ["127.0.0.1:$nvme"]
discovery_listen = ["127.0.0.1:$disc"]

[[subsystem.namespace]]
nsid = 1
target = "$KP_IQN_PREFIX:nvme"
lun = 0
CONF
  sed 's/^/  | /' "$conf"
  export IRONSAN_LOG=${IRONSAN_LOG:-info}
  spawn nvme-target "$IRONSAN" target --config "$conf"
  wait_for 15 listening "$nvme" || {
    echo "ironsan is not serving NVMe/TCP on 127.0.0.1:$nvme:"
    tail -20 "$KP_RUN/host/nvme-target.log"
    return 1
  }
  echo "nvme_port=$nvme"
  echo "discovery_port=$disc"
}

host_nvme_stop() {
  stop nvme-target
  grep -i -E 'warn|error' "$KP_RUN/host/nvme-target.log" | tail -10
  return 0
}
