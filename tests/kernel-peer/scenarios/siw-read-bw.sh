# Experiment (by name only): how fast RDMA Reads go over siw on the guest's own address (both
# ends in the guest, as in kinit-iser-verbs): rping (libsiw) and verbs-ping (ironsan's verbs
# provider over libsiw) at sizes up to iSER's 256 KiB bursts.
KP_TIMEOUT=400
host_available() { [ -x "$(vp_path)" ] || { echo "no verbs-ping at $(vp_path)"; return 1; }; }
vp_path() { echo "${KP_VERBS_PING:-$(dirname "${IRONSAN:-.}")/examples/verbs-ping}"; }
host_vp_stage() { mkdir -p "$KP_RUN/share/bin" && cp "$(vp_path)" "$KP_RUN/share/bin/verbs-ping"; }

timed() { # LABEL COMMAND...: runs COMMAND, prints its status and wall time
  label=$1
  shift
  t0=$(date +%s%N)
  timeout 120 "$@" >/tmp/timed.log 2>&1
  rc=$?
  t1=$(date +%s%N)
  echo "$label: rc $rc, $(((t1 - t0) / 1000000)) ms  $(tail -1 /tmp/timed.log)"
}

guest_main() {
  for m in siw rdma_ucm ib_uverbs; do check "modprobe $m" modprobe $m; done
  rdma link show siw0/1 >/dev/null 2>&1 || check "siw0 on eth0" rdma link add siw0 type siw netdev eth0
  host_call vp_stage
  vp=/mnt/host/bin/verbs-ping
  port=7180
  for size in 4096 32768 65000; do
    port=$((port + 1))
    rping -s -a 10.0.2.15 -p $port -C 40 -S $size >/tmp/rping-s.log 2>&1 &
    sleep 1
    timed "rping -> rping, $size B x40" rping -c -a 10.0.2.15 -p $port -C 40 -S $size
    wait
  done
  for size in 4096 65000 262144 1048576; do
    port=$((port + 1))
    timeout 120 $vp --server 10.0.2.15:$port >/tmp/vps.log 2>&1 &
    sleep 1
    timed "verbs-ping -> verbs-ping, $size B x40" $vp 10.0.2.15:$port --count 40 --size $size
    wait
  done
  finish
}
