#!/usr/bin/env bash
# A throwaway one-node Ceph cluster for tests, from Debian 12's packages, without systemd:
# one monitor and one memstore OSD on 127.0.0.1, pool size 1, no authentication, and a
# pool "rbd" ready for images. Everything lives under DIR (config, data, logs, pid files).
#
#   scripts/ceph-test-cluster.sh start DIR   # prints DIR/ceph.conf when the pool is usable
#   scripts/ceph-test-cluster.sh stop DIR    # kills the daemons named by DIR/run/*.pid
#
# Clients use it with `-c DIR/ceph.conf` (rbd, ceph, qemu-img's rbd:...:conf=, ironsan's
# `conf =`). Every wait is bounded; a start that fails stops what it started.
# The monitor listens on two free ports picked at start (written into DIR/ceph.conf) and
# the OSD on free ports of Ceph's 6800-7300 range, so several clusters can run at once.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
(($# == 2)) || usage
cmd=$1
dir=$(realpath -m "$2")

stop() {
  local pidfile pid
  for pidfile in "$dir"/run/*.pid; do
    [[ -e "$pidfile" ]] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ "$pid" =~ ^[0-9]+$ ]]; then
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$pidfile"
  done
}

# bounded RETRIES CMD...: runs CMD (5 s at most each) until it succeeds, at most RETRIES
# times, 1 s apart.
bounded() {
  local tries=$1; shift
  for ((i = 0; i < tries; i++)); do
    if timeout 5 "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "ceph-test-cluster: gave up after $tries tries: $*" >&2
  return 1
}

start() {
  for tool in ceph-mon ceph-osd ceph rbd; do
    command -v "$tool" >/dev/null || { echo "ceph-test-cluster: $tool not installed (scripts/install-deps.sh installs ceph-mon ceph-osd ceph-common)" >&2; exit 1; }
  done
  if [[ -e "$dir/run/mon.a.pid" ]] && kill -0 "$(cat "$dir/run/mon.a.pid")" 2>/dev/null; then
    echo "ceph-test-cluster: already running in $dir" >&2
    exit 1
  fi
  rm -rf "$dir"
  # Two free loopback ports for the monitor (msgr2, msgr1), asked of the kernel.
  local ports v2 v1
  ports=$(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))')
  read -r v2 v1 <<<"$ports"
  mkdir -p "$dir/mon" "$dir/osd" "$dir/run" "$dir/log"
  local fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]
mon initial members = a
public network = 127.0.0.1/32
run dir = $dir/run
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
ms bind ipv6 = false
osd pool default pg autoscale mode = off

[mon.a]
mon data = $dir/mon
public addrv = [v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]
mon data avail crit = 0

[osd.0]
osd data = $dir/osd
osd objectstore = memstore
memstore device bytes = 2147483648
EOF
  trap 'stop' ERR
  export CEPH_CONF="$dir/ceph.conf"
  # A monitor map naming monitor a at those ports (one built from `mon host` would name it
  # noname-a, and the monitor would wait for a peer that never comes).
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]" \
    "$dir/monmap" >"$dir/log/monmaptool.out" 2>&1
  ceph-mon --id a --mkfs --monmap "$dir/monmap" --keyring /dev/null >"$dir/log/mkfs-mon.out" 2>&1
  ceph-mon --id a 2>>"$dir/log/mon.a.stderr"
  bounded 30 ceph -s
  local id
  id=$(timeout 20 ceph osd create)
  [[ "$id" == 0 ]] || { echo "ceph-test-cluster: ceph osd create gave id $id, not 0" >&2; false; }
  timeout 20 ceph osd crush add osd.0 1 root=default >/dev/null 2>&1
  ceph-osd --id 0 --mkjournal --mkfs >"$dir/log/mkfs-osd.out" 2>&1
  ceph-osd --id 0 2>>"$dir/log/osd.0.stderr"
  bounded 30 sh -c 'ceph osd stat | grep -q "1 up"'
  timeout 20 ceph osd pool create rbd 8 >/dev/null 2>&1
  bounded 30 rbd pool init rbd
  trap - ERR
  echo "$dir/ceph.conf"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
