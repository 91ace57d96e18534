# Scenario 3: a host initiator against the kernel LIO target in the guest, over TCP through the
# slirp port forward 127.0.0.1:$KP_FWD_PORT -> 10.0.2.15:3260. LIO serves a 64 MiB fileio LUN
# whose backing file the guest fills with random data first, so both directions are checked on
# real bytes: the host must read the guest's data, and the guest must find the host's random
# data in the backing file afterwards.
# Kind = the host initiator: ironsan (ironsan ls/write/read/bench) or libiscsi (iscsi-ls,
# iscsi-inq, iscsi-readcapacity16 and qemu-img's libiscsi driver for the bytes).
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=300
host_available() { initiator_available "$1"; }

guest_main() {
  export HOME=/root
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
  step "host initiator ($KP_KIND) via 127.0.0.1:$KP_FWD_PORT"
  host_call initiator_check "$IQN" "$sha"
  check "host initiator checks" test $? -eq 0
  wrote=$(sed -n 's/.*WROTE_SHA256=\([0-9a-f]*\).*/\1/p' "$HOST_OUT" | tail -1)
  now=$(sha256sum /tmp/lio.img | cut -d' ' -f1)
  echo "  backing file now sha256 $now; host wrote sha256 ${wrote:-?}"
  check "the host's random data is in LIO's backing file" test -n "$wrote" -a "$wrote" = "$now"
  if [ "$KP_KIND" = ironsan ]; then
    step "short verifying benchmark"
    host_call initiator_bench "$IQN"
    check "ironsan bench --verify" test $? -eq 0
  fi
  dmesg | grep -i -E 'iscsi|target' | tail -5
  targetcli clearconfig confirm=True >/dev/null
  finish
}

# ----------------------------------------------------------------------------- host side
# initiator_check IQN SHA: reads the whole LUN (must hash to SHA), writes 64 MiB of random
# data, reads it back, and prints WROTE_SHA256=<hash of what it wrote> for the guest.
host_initiator_check() {
  case $KP_KIND in
    libiscsi) libiscsi_check "$@" ;;
    ironsan) ironsan_initiator_check "$@" ;;
  esac
}

libiscsi_check() {
  local iqn=$1 sha=$2 url=iscsi://127.0.0.1:$KP_FWD_PORT fails=0 d=$KP_RUN/host
  c() {
    local label=$1
    shift
    if "$@"; then echo "ok: $label"; else
      echo "FAILED: $label"
      fails=$((fails + 1))
    fi
  }
  timeout 30 iscsi-ls "$url" | tee "$d/lio-ls.out"
  c "iscsi-ls (SendTargets) lists $iqn" grep -q "Target:$iqn " "$d/lio-ls.out"
  timeout 30 iscsi-inq "$url/$iqn/0" | tee "$d/lio-inq.out"
  c "INQUIRY: vendor LIO-ORG" grep -q 'Vendor:LIO-ORG' "$d/lio-inq.out"
  timeout 30 iscsi-readcapacity16 "$url/$iqn/0" | tee "$d/lio-cap.out"
  c "READ CAPACITY(16): 64 MiB" grep -q 'Total size:67108864' "$d/lio-cap.out"
  timeout 120 qemu-img convert -f raw -O raw "$url/$iqn/0" "$d/lio-read.img"
  c "read 64 MiB: the guest's random data" test "$(sha256sum <"$d/lio-read.img" | cut -d' ' -f1)" = "$sha"
  head -c 64M /dev/urandom >"$d/lio-write.img"
  timeout 120 qemu-img convert -n -f raw -O raw "$d/lio-write.img" "$url/$iqn/0"
  timeout 120 qemu-img convert -f raw -O raw "$url/$iqn/0" "$d/lio-back.img"
  c "write 64 MiB random + read back identical" cmp "$d/lio-write.img" "$d/lio-back.img"
  echo "WROTE_SHA256=$(sha256sum <"$d/lio-write.img" | cut -d' ' -f1)"
  rm -f "$d"/lio-*.img
  return $((fails > 0))
}

# The ironsan initiator CLI: ironsan ls, write + read back of random data (libiscsi-style URLs;
# `read` without --length reads the whole LUN), then a short bench --verify.
ironsan_initiator_check() {
  local iqn=$1 sha=$2 portal=127.0.0.1:$KP_FWD_PORT fails=0 d=$KP_RUN/host
  local url="iscsi://$portal/$iqn/0"
  c() {
    local label=$1
    shift
    if "$@"; then echo "ok: $label"; else
      echo "FAILED: $label"
      fails=$((fails + 1))
    fi
  }
  timeout 30 "$IRONSAN" ls "iscsi://$portal" | tee "$d/lio-ls.out"
  c "ironsan ls lists $iqn" grep -q "$iqn" "$d/lio-ls.out"
  timeout 120 "$IRONSAN" read "$url" --output "$d/lio-read.img"
  c "read 64 MiB: the guest's random data" test "$(sha256sum <"$d/lio-read.img" | cut -d' ' -f1)" = "$sha"
  head -c 64M /dev/urandom >"$d/lio-write.img"
  timeout 120 "$IRONSAN" write "$url" --input "$d/lio-write.img"
  timeout 120 "$IRONSAN" read "$url" --output "$d/lio-back.img"
  c "write 64 MiB random + read back identical" cmp "$d/lio-write.img" "$d/lio-back.img"
  echo "WROTE_SHA256=$(sha256sum <"$d/lio-write.img" | cut -d' ' -f1)"
  rm -f "$d"/lio-*.img
  return $((fails > 0))
}

# initiator_bench IQN: a short verifying benchmark (it overwrites the LUN, so it runs after the
# guest has checked the backing file). Only the ironsan initiator has one.
host_initiator_bench() {
  [[ $KP_KIND == ironsan ]] || {
    echo "no verifying benchmark for $KP_KIND"
    return 0
  }
  timeout 120 "$IRONSAN" bench "iscsi://127.0.0.1:$KP_FWD_PORT/$1/0" --rw write,read \
    --pattern rand --size 64k --qd 16 --duration 5 --span 32m --verify
}
