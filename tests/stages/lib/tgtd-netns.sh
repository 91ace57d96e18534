# shellcheck shell=bash
# Sourced by stages that capture traffic to Debian's tgtd: starts tgtd in a private network
# namespace (so tcpdump and iptables rules see only this stage's traffic) with one 64 MiB
# file-backed LUN 1, and removes it all on exit.
#
# tgtd_in_netns NAME IQN: sets ns (the namespace), work (a scratch directory), tgtd_pid, and
# installs the EXIT trap. tgtd listens on 127.0.0.1:3260 inside the namespace.
tgtd_in_netns() {
  local name=$1 iqn=$2
  ns=ironsan-$name-$$
  # tgtd's control "port" names its management socket: small, and distinct per stage run.
  local ctl=$((2000 + ($$ + ${#name}) % 5000))
  # tmpfs when there is one: captures written there keep up with loopback rates.
  work=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
  tgtd_pid=""
  trap _tgtd_netns_cleanup EXIT
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  truncate -s 64M "$work/lun.img"
  ip netns exec "$ns" tgtd -f -C "$ctl" --iscsi portal=127.0.0.1:3260 >"$work/tgtd.log" 2>&1 &
  tgtd_pid=$!
  for _ in $(seq 50); do
    tgtadm -C "$ctl" --lld iscsi --op new --mode target --tid 1 -T "$iqn" 2>/dev/null && break
    sleep 0.1
  done
  tgtadm -C "$ctl" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$work/lun.img"
  tgtadm -C "$ctl" --lld iscsi --op bind --mode target --tid 1 -I ALL
}

_tgtd_netns_cleanup() {
  # tgtd ignores SIGTERM: a plain kill + wait would hang here forever.
  [[ -n "$tgtd_pid" ]] && kill -9 "$tgtd_pid" 2>/dev/null && { wait "$tgtd_pid" 2>/dev/null || true; }
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
