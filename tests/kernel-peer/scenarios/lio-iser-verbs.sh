# The ironsan initiator built with the rdma-core provider (target/verbs/release/ironsan, built by
# stage 40-iwarp-verbs-build) in the guest, over siw0 through libibverbs/librdmacm
# (--rdma-provider rdma-core), against two iSER targets:
# - LIO's ib_isert in the same guest (iSER-only portal 10.0.2.15:3260, guest/lio.sh): inq, the
#   whole 64 MiB LUN read and hashed against the guest's random data, 32 MiB written, read back
#   and found in LIO's backing file, a verifying bench; no isert error in the kernel log;
# - the ironsan target on the host (software RNIC, TCP and iSER on one port) through slirp at
#   10.0.2.2: discovery over TCP, inq, 32 MiB written and read back, a verifying bench.
# No iser/siw error in the kernel log and no error line from the initiator.
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=600
host_available() { verbs_ironsan_available && kind_available "$1"; }

guest_main() {
  export HOME=/root
  . /mnt/host/guest/lio.sh
  IQN=$KP_IQN_PREFIX:lio-iser-verbs
  lio_iser_target "$IQN" 10.0.2.15
  host_call verbs_ironsan_stage
  check "host: the rdma-core build of ironsan staged" test $? -eq 0
  # Registration on an RDMA device pins memory: the default 8 MiB memlock limit is too small.
  ulimit -l unlimited
  dmesg -C

  step "ironsan (rdma-core) -> LIO isert in the guest"
  url="iser://10.0.2.15:3260/$IQN/0"
  ir inq "$url" >/tmp/inq.out
  cat /tmp/inq.out | sed 's/^/  /'
  check "inq over iSER (rdma-core): vendor LIO-ORG" grep -qx 'Vendor: LIO-ORG' /tmp/inq.out
  ir read "$url" --output /tmp/read.img
  check "the whole LUN (64 MiB) read over iSER (rdma-core): the guest's random data" \
    test "$(sha256sum </tmp/read.img | cut -d' ' -f1)" = "$SHA"
  rm -f /tmp/read.img
  ir_write_read_back "LIO" "$url" 32
  lio_backing_has "LIO" 32 32 "$(sha256sum </tmp/write.img | cut -d' ' -f1)"
  ir_bench_verify "LIO" "$url"
  lio_isert_clean
  lio_clear

  step "ironsan (rdma-core) -> the ironsan target on the host (software RNIC)"
  host_call target_start iser-verbs-initiator
  check "host: ironsan target started" test $? -eq 0
  hiqn=$KP_IQN_PREFIX:iser-verbs-initiator
  ir discover "10.0.2.2:$KP_HOST_PORT" >/tmp/disc.out 2>&1
  sed 's/^/  /' /tmp/disc.out
  check "discovery over TCP lists $hiqn" grep -q "$hiqn" /tmp/disc.out
  url="iser://10.0.2.2:$KP_HOST_PORT/$hiqn/0"
  ir inq "$url" >/tmp/inq.out
  check "inq over iSER (rdma-core): vendor ironsan" grep -qix 'Vendor: ironsan' /tmp/inq.out
  ir_write_read_back "host" "$url" 0
  ir_bench_verify "host" "$url"
  host_call target_stop

  iser_dmesg_clean
  check "no error line from the initiator" sh -c "! grep -E 'panicked|ERROR' /tmp/ir.log"
  finish
}

# ir ARGS...: the rdma-core build of ironsan as an initiator on siw0 (bounded; stderr kept).
ir() {
  IRONSAN_LOG=warn timeout 180 /mnt/host/bin/ironsan-verbs "$@" --rdma-provider rdma-core 2>>/tmp/ir.log
}

# ir_write_read_back LABEL URL OFFSET_MIB: 32 MiB of random data written at OFFSET_MIB and read
# back identical (left in /tmp/write.img).
ir_write_read_back() {
  head -c 32M /dev/urandom >/tmp/write.img
  check "$1: 32 MiB written at $3 MiB over iSER (rdma-core)" ir write "$2" --offset "$3MiB" --input /tmp/write.img
  ir read "$2" --offset "$3MiB" --length 32MiB --output /tmp/back.img
  check "$1: read back identical" cmp /tmp/write.img /tmp/back.img
  rm -f /tmp/back.img
}

# ir_bench_verify LABEL URL: 64 KiB random writes then reads at QD 16 over the first 32 MiB,
# every block checked.
ir_bench_verify() {
  check "$1: bench --verify over iSER (rdma-core): 64 KiB random, QD 16" ir bench "$2" \
    --rw write,read --pattern rand --size 64k --qd 16 --count 512 --span 32m --verify
}
