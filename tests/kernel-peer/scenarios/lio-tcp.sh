# Scenario 3: a host initiator against the kernel LIO target in the guest, over TCP through the
# slirp port forward 127.0.0.1:$KP_FWD_PORT -> 10.0.2.15:3260. LIO serves a 64 MiB fileio LUN
# whose backing file the guest fills with random data first, so both directions are checked on
# real bytes: the host must read the guest's data, and after each host write the guest hashes
# the written region of the backing file and compares it with the hash the host reports.
# Kind = the host initiator:
#   ironsan  - discover, ls, inq, whole-LUN read, 32 MiB write + read back; then the same write
#              check with CHAP, with mutual CHAP (wrong secrets must be refused) and with
#              HeaderDigest/DataDigest CRC32C (the login keys decoded by tshark); then a verifying
#              `ironsan bench` and a table of ironsan bench vs libiscsi's iscsi-perf, same LUN.
#   libiscsi - the reference: iscsi-ls, iscsi-inq, iscsi-readcapacity16, qemu-img's libiscsi
#              driver for the bytes (no auth, no digests).
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=420
host_available() { initiator_available "$1"; }

# check_regions: every "WROTE_REGION OFFSET_MIB LENGTH_MIB SHA256" line of the last host call
# must match the same bytes of LIO's backing file.
check_regions() {
  grep -a '^WROTE_REGION ' "$HOST_OUT" >/tmp/regions || true
  n=0
  while read -r _ off len want; do
    n=$((n + 1))
    got=$(dd if=/tmp/lio.img bs=1M skip="$off" count="$len" 2>/dev/null | sha256sum | cut -d' ' -f1)
    check "$1: backing file [$off MiB, +$len MiB) holds the host's bytes" test "$got" = "$want"
  done </tmp/regions
  check "$1: the host reported what it wrote" test "$n" -gt 0
}

# lio_variant LABEL HOST-STEP ARGS...: one host call, its data checked on both sides.
lio_variant() {
  label=$1
  shift
  step "$label: host initiator ($KP_KIND) via 127.0.0.1:$KP_FWD_PORT"
  host_call "$@"
  check "$label: host initiator checks" test $? -eq 0
  check_regions "$label"
}

guest_main() {
  export HOME=/root
  . /mnt/host/guest/lio.sh # lio_auth
  IQN=$KP_IQN_PREFIX:lio
  for m in configfs target_core_mod target_core_file iscsi_target_mod; do modprobe $m; done
  mkdir -p /run/dbus && dbus-daemon --system --fork # targetcli-fb asks D-Bus for tcmu-runner
  step "backing file with random data"
  dd if=/dev/urandom of=/tmp/lio.img bs=1M count=64 2>/dev/null
  sha=$(sha256sum /tmp/lio.img | cut -d' ' -f1)
  echo "  sha256 $sha"
  step "LIO: fileio LUN, demo-mode ACLs, portal 10.0.2.15:3260"
  targetcli set global auto_save_on_exit=false auto_add_default_portal=false >/dev/null
  targetcli /backstores/fileio create name=kp0 file_or_dev=/tmp/lio.img size=64M write_back=false &&
    targetcli /iscsi create "$IQN" &&
    targetcli "/iscsi/$IQN/tpg1/luns" create /backstores/fileio/kp0 &&
    targetcli "/iscsi/$IQN/tpg1" set attribute authentication=0 demo_mode_write_protect=0 \
      generate_node_acls=1 cache_dynamic_acls=1 >/dev/null &&
    targetcli "/iscsi/$IQN/tpg1/portals" create 10.0.2.15 3260
  check "LIO configured" test $? -eq 0
  targetcli ls /iscsi
  tpg=/sys/kernel/config/target/iscsi/$IQN/tpgt_1
  echo "  LIO's offered digests: HeaderDigest=$(cat "$tpg/param/HeaderDigest")" \
    "DataDigest=$(cat "$tpg/param/DataDigest")"

  lio_variant "no auth" initiator_check "$IQN" "$sha"
  if [ "$KP_KIND" = ironsan ]; then
    lio_auth chap
    lio_variant CHAP initiator_auth chap "$IQN"
    lio_auth mutual-chap
    lio_variant "mutual CHAP" initiator_auth mutual-chap "$IQN"
    lio_auth none
    lio_variant "CRC32C digests" initiator_digests "$IQN"
    step "benchmarks (the LUN is overwritten)"
    host_call initiator_bench "$IQN"
    check "ironsan bench --verify and the comparison with iscsi-perf" test $? -eq 0
  fi
  dmesg | grep -i -E 'iscsi|target' | tail -5
  targetcli clearconfig confirm=True >/dev/null
  finish
}

# ----------------------------------------------------------------------------- host side
sha_of() { sha256sum <"$1" | cut -d' ' -f1; }

# host_initiator_check IQN SHA: reads the whole LUN (must hash to SHA), writes random data,
# reads it back, and prints WROTE_REGION lines for the guest.
host_initiator_check() {
  case $KP_KIND in
    libiscsi) libiscsi_check "$@" ;;
    ironsan) ironsan_initiator_check "$@" ;;
  esac
}

libiscsi_check() {
  local iqn=$1 sha=$2 url=iscsi://127.0.0.1:$KP_FWD_PORT fails=0 d=$KP_RUN/host
  timeout 30 iscsi-ls "$url" | tee "$d/lio-ls.out"
  c "iscsi-ls (SendTargets) lists $iqn" grep -q "Target:$iqn " "$d/lio-ls.out"
  timeout 30 iscsi-inq "$url/$iqn/0" | tee "$d/lio-inq.out"
  c "INQUIRY: vendor LIO-ORG" grep -q 'Vendor:LIO-ORG' "$d/lio-inq.out"
  timeout 30 iscsi-readcapacity16 "$url/$iqn/0" | tee "$d/lio-cap.out"
  c "READ CAPACITY(16): 64 MiB" grep -q 'Total size:67108864' "$d/lio-cap.out"
  timeout 120 qemu-img convert -f raw -O raw "$url/$iqn/0" "$d/lio-read.img"
  c "read 64 MiB: the guest's random data" test "$(sha_of "$d/lio-read.img")" = "$sha"
  head -c 64M /dev/urandom >"$d/lio-write.img"
  timeout 120 qemu-img convert -n -f raw -O raw "$d/lio-write.img" "$url/$iqn/0"
  timeout 120 qemu-img convert -f raw -O raw "$url/$iqn/0" "$d/lio-back.img"
  c "write 64 MiB random + read back identical" cmp "$d/lio-write.img" "$d/lio-back.img"
  echo "WROTE_REGION 0 64 $(sha_of "$d/lio-write.img")"
  rm -f "$d"/lio-*.img
  return $((fails > 0))
}

ir() { timeout 120 "$IRONSAN" "$@"; }

# ironsan_rw URL OFFSET_MIB LABEL ARGS...: 32 MiB of fresh random data written at OFFSET_MIB,
# read back and compared; prints the WROTE_REGION line the guest checks.
ironsan_rw() {
  local url=$1 off=$2 label=$3 d=$KP_RUN/host
  shift 3
  head -c 32M /dev/urandom >"$d/lio-write.img"
  rm -f "$d/lio-back.img"
  c "$label: write 32 MiB at $off MiB" ir write "$url" --offset "${off}MiB" --input "$d/lio-write.img" "$@"
  ir read "$url" --offset "${off}MiB" --length 32MiB --output "$d/lio-back.img" "$@"
  c "$label: read back identical" cmp "$d/lio-write.img" "$d/lio-back.img"
  echo "WROTE_REGION $off 32 $(sha_of "$d/lio-write.img")"
  rm -f "$d"/lio-*.img
}

# ironsan_initiator_check IQN SHA: discovery, ls, inq, the whole LUN read, a verified write.
ironsan_initiator_check() {
  local iqn=$1 sha=$2 portal=127.0.0.1:$KP_FWD_PORT fails=0 d=$KP_RUN/host
  local url="iscsi://$portal/$iqn/0"
  ir discover "$portal" | tee "$d/lio-discover.out"
  # LIO advertises the address it listens on, which is the guest's.
  c "discover lists $iqn at 10.0.2.15:3260,1" grep -qxF "$iqn 10.0.2.15:3260,1" "$d/lio-discover.out"
  ir ls "iscsi://$portal" | tee "$d/lio-ls.out"
  c "ls lists $iqn" grep -q "Target: $iqn " "$d/lio-ls.out"
  c "ls: LUN 0 of 64 MiB" grep -q 'Lun: 0  Size: 64 MiB' "$d/lio-ls.out"
  ir inq "$url" | tee "$d/lio-inq.out"
  c "inq: vendor LIO-ORG" grep -qx 'Vendor: LIO-ORG' "$d/lio-inq.out"
  # targetcli sets emulate_model_alias: the product is the backstore's name.
  c "inq: product kp0" grep -qx 'Product: kp0' "$d/lio-inq.out"
  c "inq: unit serial number without padding" grep -qE '^Unit serial number: [0-9a-f-]{36}$' "$d/lio-inq.out"
  c "inq: 131072 blocks of 512 bytes" grep -q '(131072 blocks of 512 bytes)' "$d/lio-inq.out"
  ir read "$url" --output "$d/lio-read.img"
  c "read the whole LUN (64 MiB): the guest's random data" test "$(sha_of "$d/lio-read.img")" = "$sha"
  ironsan_rw "$url" 16 "no auth"
  rm -f "$d"/lio-*.out
  return $((fails > 0))
}

# host_initiator_auth VARIANT IQN: chap | mutual-chap, the TPG set up by the guest. Wrong or
# missing credentials must be refused with one clear line; the right ones must move data.
host_initiator_auth() {
  local variant=$1 iqn=$2 fails=0 d=$KP_RUN/host
  local hp=127.0.0.1:$KP_FWD_PORT u=$KP_CHAP_USER s=$KP_CHAP_SECRET
  local url="iscsi://$u%$s@$hp/$iqn/0"
  # shellcheck disable=SC2317 # called through c
  refused() { # URL: the login must fail, with the target's or our own reason
    if ir inq "$1" >"$d/lio-inq.out" 2>"$d/lio-err.out"; then
      echo "  login succeeded"
      return 1
    fi
    sed 's/^/  | /' "$d/lio-err.out"
    grep -q -i -E 'auth|chap' "$d/lio-err.out"
  }
  c "$variant: no credentials refused" refused "iscsi://$hp/$iqn/0"
  c "$variant: wrong secret refused" refused "iscsi://$u%wrong-$s@$hp/$iqn/0"
  if [[ $variant == mutual-chap ]]; then
    c "$variant: target proving the wrong secret refused" refused \
      "$url?target_user=$KP_CHAP_TUSER&target_password=wrong-$KP_CHAP_TSECRET"
    url="$url?target_user=$KP_CHAP_TUSER&target_password=$KP_CHAP_TSECRET"
  fi
  ir inq "$url" | tee "$d/lio-inq.out"
  c "$variant: inq vendor LIO-ORG" grep -qx 'Vendor: LIO-ORG' "$d/lio-inq.out"
  local off=32
  [[ $variant == mutual-chap ]] && off=0
  ironsan_rw "$url" "$off" "$variant"
  rm -f "$d"/lio-*.out
  return $((fails > 0))
}

# host_initiator_digests IQN: the login of `inq --header-digest crc32c --data-digest crc32c` is
# captured and tshark must decode HeaderDigest=CRC32C and DataDigest=CRC32C in LIO's answer;
# then a verified write + read with both digests on.
host_initiator_digests() {
  local iqn=$1 fails=0 d=$KP_RUN/host
  local url="iscsi://127.0.0.1:$KP_FWD_PORT/$iqn/0" pcap=$d/lio-digests.pcap
  rm -f "$pcap" "$d/capture.log"
  spawn capture tcpdump -i lo -s 4096 --immediate-mode -U -w "$pcap" "tcp port $KP_FWD_PORT"
  wait_for 10 grep -q 'listening on' "$d/capture.log" || echo "  (tcpdump not listening yet)"
  ir inq "$url" --header-digest crc32c --data-digest crc32c | tee "$d/lio-inq.out"
  c "digests: inq vendor LIO-ORG" grep -qx 'Vendor: LIO-ORG' "$d/lio-inq.out"
  # Login Response keys as tshark decodes them (bounded wait: tcpdump writes as it reads).
  # shellcheck disable=SC2317 # called through wait_for
  login_keys() {
    tshark -r "$pcap" -d "tcp.port==$KP_FWD_PORT,iscsi" -Y 'iscsi.opcode == 0x23' \
      -T fields -e iscsi.keyvalue 2>/dev/null | tr ',' '\n' >"$d/lio-keys.out"
    grep -q '^DataDigest=' "$d/lio-keys.out"
  }
  wait_for 10 login_keys || echo "  (no Login Response with DataDigest in the capture)"
  stop capture
  echo "  LIO's login response keys (tshark): $(paste -sd' ' "$d/lio-keys.out")"
  c "digests: LIO answered HeaderDigest=CRC32C" grep -qx 'HeaderDigest=CRC32C' "$d/lio-keys.out"
  c "digests: LIO answered DataDigest=CRC32C" grep -qx 'DataDigest=CRC32C' "$d/lio-keys.out"
  ironsan_rw "$url" 24 digests --header-digest crc32c --data-digest crc32c
  rm -f "$d"/lio-*.out
  return $((fails > 0))
}

# host_initiator_bench IQN: `ironsan bench --verify` (writes then reads back a pattern over
# the first 32 MiB), then ironsan bench and libiscsi's iscsi-perf against the same LUN in one
# table (reads only: iscsi-perf does no writes). The guest runs under TCG behind slirp, so the
# figures say nothing about either initiator's speed; only that both run and move data.
host_initiator_bench() {
  local iqn=$1 fails=0 d=$KP_RUN/host
  local url="iscsi://127.0.0.1:$KP_FWD_PORT/$iqn/0"
  c "bench --verify: 64 KiB random writes then reads, QD 16, checked" ir bench "$url" \
    --rw write,read --pattern rand --size 64k --qd 16 --count 512 --span 32m --verify
  if ! command -v iscsi-perf >/dev/null; then
    echo "iscsi-perf not installed: no comparison"
    return $((fails > 0))
  fi
  local table=$d/lio-bench.table w pattern size blocks rflag perf b piops biops pmbs bmbs
  : >"$table"
  for w in "seq 128k 256" "rand 4k 8 -r"; do
    # shellcheck disable=SC2086 # three or four words
    set -- $w
    pattern=$1 size=$2 blocks=$3 rflag=${4:-}
    # shellcheck disable=SC2086 # $rflag is empty or one word
    perf=$(timeout 20 iscsi-perf -m 32 -b "$blocks" -t 3 $rflag "$url" 2>&1 | tr '\r' '\n' |
      grep -o 'iops average [0-9]*' | tail -1 | awk '{print $3}')
    b=$(timeout 30 "$IRONSAN" bench "$url" --rw read --pattern "$pattern" --size "$size" --qd 32 \
      --duration 3 --json "$d/lio-bench.json" >/dev/null && python3 -c \
      'import json,sys; j=json.load(open(sys.argv[1])); print(round(j["iops"]), round(j["mb_per_s"], 1))' "$d/lio-bench.json")
    piops=${perf:-0}
    biops=${b%% *}
    bmbs=${b#* }
    [ -n "$b" ] || biops=0 bmbs=0
    pmbs=$(python3 -c "print(f'{$piops * $blocks * 512 / 1e6:.1f}')")
    printf '%-24s %12s %10s %12s %10s\n' "$pattern $size read QD32" "$piops" "$pmbs" "$biops" "$bmbs" >>"$table"
    c "$pattern $size: iscsi-perf moved data" test "$piops" -gt 0
    c "$pattern $size: ironsan bench moved data" test "$biops" -gt 0
  done
  echo "LIO fileio LUN in the TCG guest via slirp, 3 s per cell, same run:"
  printf '%-24s %12s %10s %12s %10s\n' workload "iscsi-perf" "MB/s" "ironsan" "MB/s"
  printf '%-24s %12s %10s %12s %10s\n' "" IOPS "" IOPS ""
  cat "$table"
  rm -f "$table"
  rm -f "$d"/lio-bench.json
  return $((fails > 0))
}
