# The ironsan initiator over iSER (iser:// on the host's software iWARP RNIC) against the kernel
# LIO target's ib_isert over siw in the guest, through the slirp port forward 127.0.0.1:$KP_FWD_PORT
# -> 10.0.2.15:3260. LIO cannot listen for TCP and iSER on one address:port over iWARP (siw
# listens with a real kernel TCP socket), so its TCP network portal is parked in a throw-away
# network namespace and the portal serves iSER only (the kvm-interop recipe). A 64 MiB fileio
# LUN holds random data written by the guest: the host reads it whole over iSER and must hash it
# to the guest's value, writes 32 MiB of its own and reads it back, and the guest hashes that
# region of the backing file; then a verifying `ironsan bench`. LIO's kernel log must show no
# isert error ("non-page aligned", "unexpected solicited", failed completions).
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=420
host_available() { [ -x "${IRONSAN:-}" ] || { echo "no ironsan binary"; return 1; }; }

guest_main() {
  export HOME=/root
  IQN=$KP_IQN_PREFIX:lio-iser
  IP=10.0.2.15
  for m in siw rdma_ucm ib_uverbs ib_isert configfs target_core_mod target_core_file iscsi_target_mod; do
    check "modprobe $m" modprobe $m
  done
  rdma link show siw0/1 >/dev/null 2>&1 || check "siw0 on eth0" rdma link add siw0 type siw netdev eth0
  mkdir -p /run/dbus && dbus-daemon --system --fork # targetcli-fb asks D-Bus for tcmu-runner
  step "backing file with random data"
  dd if=/dev/urandom of=/tmp/lio.img bs=1M count=64 2>/dev/null
  sha=$(sha256sum /tmp/lio.img | cut -d' ' -f1)
  echo "  sha256 $sha"
  step "LIO: fileio LUN, demo-mode ACLs, iSER-only portal $IP:3260"
  targetcli set global auto_save_on_exit=false auto_add_default_portal=false >/dev/null
  targetcli /backstores/fileio create name=kp0 file_or_dev=/tmp/lio.img size=64M write_back=false &&
    targetcli /iscsi create "$IQN" &&
    targetcli "/iscsi/$IQN/tpg1/luns" create /backstores/fileio/kp0 &&
    targetcli "/iscsi/$IQN/tpg1" set attribute authentication=0 demo_mode_write_protect=0 \
      generate_node_acls=1 cache_dynamic_acls=1 >/dev/null
  check "LIO configured" test $? -eq 0
  tpg=/sys/kernel/config/target/iscsi/$IQN/tpgt_1
  ip netns add jail
  ip netns exec jail sysctl -q -w net.ipv4.ip_nonlocal_bind=1
  check "TCP network portal parked in a network namespace" nsenter --net=/run/netns/jail mkdir "$tpg/np/$IP:3260"
  check "iSER enabled on $IP:3260" sh -c "echo 1 >$tpg/np/$IP:3260/iser"
  dmesg -C
  step "host: ironsan over iser://127.0.0.1:$KP_FWD_PORT"
  host_call lio_iser_check "$IQN" "$sha"
  check "host initiator checks" test $? -eq 0
  grep -a '^WROTE_REGION ' "$HOST_OUT" >/tmp/regions || true
  n=0
  while read -r _ off len want; do
    n=$((n + 1))
    got=$(dd if=/tmp/lio.img bs=1M skip="$off" count="$len" 2>/dev/null | sha256sum | cut -d' ' -f1)
    check "backing file [$off MiB, +$len MiB) holds the host's bytes" test "$got" = "$want"
  done </tmp/regions
  check "the host reported what it wrote" test "$n" -gt 0
  dmesg | grep -i -E 'isert|iser|siw' | tail -8 | sed 's/^/  dmesg| /'
  check "no isert error in the kernel log" sh -c \
    "! dmesg | grep -i -E 'isert.*(err|fail|non-page|unexpected|bogus)|non-page aligned|unexpected solicited'"
  targetcli clearconfig confirm=True >/dev/null 2>&1
  finish
}

# ----------------------------------------------------------------------------- host side
# host_lio_iser_check IQN SHA: inq, the whole LUN read (must hash to SHA), 32 MiB written and
# read back at 32 MiB (a WROTE_REGION line for the guest), a verifying bench; every step over iser://.
host_lio_iser_check() {
  local iqn=$1 sha=$2 fails=0 d=$KP_RUN/host
  local url="iser://127.0.0.1:$KP_FWD_PORT/$iqn/0"
  ck() {
    local label=$1
    shift
    if "$@"; then echo "ok: $label"; else
      echo "FAILED: $label"
      fails=$((fails + 1))
    fi
  }
  ir() { timeout 120 "$IRONSAN" "$@"; }
  # The first login is captured and decoded by ironsan analyze (the iSER login keys both ways).
  rm -f "$d/lio-iser.pcap" "$d/capture.log"
  spawn capture tcpdump -i lo -s 0 --immediate-mode -U -w "$d/lio-iser.pcap" "tcp port $KP_FWD_PORT"
  wait_for 10 grep -q 'listening on' "$d/capture.log" || echo "  (tcpdump not listening yet)"
  ir inq "$url" | tee "$d/lio-inq.out"
  sleep 1
  stop capture
  "$IRONSAN" analyze --port "$KP_FWD_PORT" "$d/lio-iser.pcap" 2>&1 | grep -E 'Login|Logout|SCSI' | head -12 | cut -c1-400
  ck "inq over iSER: vendor LIO-ORG" grep -qx 'Vendor: LIO-ORG' "$d/lio-inq.out"
  ir read "$url" --output "$d/lio-read.img"
  ck "read the whole LUN (64 MiB) over iSER: the guest's random data" \
    test "$(sha256sum <"$d/lio-read.img" | cut -d' ' -f1)" = "$sha"
  head -c 32M /dev/urandom >"$d/lio-write.img"
  ck "write 32 MiB at 32 MiB over iSER" ir write "$url" --offset 32MiB --input "$d/lio-write.img"
  ir read "$url" --offset 32MiB --length 32MiB --output "$d/lio-back.img"
  ck "read back identical" cmp "$d/lio-write.img" "$d/lio-back.img"
  echo "WROTE_REGION 32 32 $(sha256sum <"$d/lio-write.img" | cut -d' ' -f1)"
  # The bench's verify pattern goes to the first 32 MiB, clear of the region above.
  ck "bench --verify over iSER: 64 KiB random writes then reads, QD 16, checked" ir bench "$url" \
    --rw write,read --pattern rand --size 64k --qd 16 --count 512 --span 32m --verify
  rm -f "$d"/lio-*.img "$d"/lio-*.out
  return $((fails > 0))
}
