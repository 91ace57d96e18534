# (by name only) ironsan's NVMe/TCP host (`nvme+tcp://` URLs) against the guest kernel's
# nvmet-tcp, which serves a 64 MiB file of random data as namespace 1 on 10.0.2.15:3260,
# reached through 127.0.0.1:$KP_FWD_PORT. The host reads the whole namespace (the guest's hash
# must match), writes 32 MiB of fresh random data and reads it back, each write found by the
# guest in nvmet's backing file; then `ironsan bench --verify` for a few seconds; all of it
# without digests and with header and data digests (CRC32C). A wrong URL and a wrong NQN must
# fail with one clear line; the guest's dmesg must show no nvme error.
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=300
host_available() { initiator_available "$1"; }
NQN=nqn.2026-01.org.ironsan.test:host-nvmet

# nvmet_serve FILE: nvmet-tcp serving FILE as namespace 1 of $NQN on 10.0.2.15:3260, any
# host allowed (as nvme-kernel-loop.sh sets it up).
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

# check_regions LABEL: every "WROTE_REGION OFFSET_MIB LENGTH_MIB SHA256" line of the last
# host call must match the same bytes of nvmet's backing file.
check_regions() {
  grep -a '^WROTE_REGION ' "$HOST_OUT" >/tmp/regions || true
  n=0
  while read -r _ off len want; do
    n=$((n + 1))
    got=$(dd if=/tmp/nvmet.img bs=1M skip="$off" count="$len" 2>/dev/null | sha256sum | cut -d' ' -f1)
    check "$1: backing file [$off MiB, +$len MiB) holds the host's bytes" test "$got" = "$want"
  done </tmp/regions
  check "$1: the host reported what it wrote" test "$n" -gt 0
}

guest_main() {
  step "backing file with random data"
  dd if=/dev/urandom of=/tmp/nvmet.img bs=1M count=64 2>/dev/null
  sha=$(sha256sum /tmp/nvmet.img | cut -d' ' -f1)
  echo "  sha256 $sha"
  step "nvmet-tcp serving $NQN on 10.0.2.15:3260"
  check "nvmet configured" nvmet_serve /tmp/nvmet.img
  dmesg -C
  for variant in plain digests; do
    step "$variant: ironsan NVMe/TCP host via 127.0.0.1:$KP_FWD_PORT"
    host_call nvme_check "$variant" "$sha"
    check "$variant: host checks" test $? -eq 0
    check_regions "$variant"
    # The next variant reads the whole namespace again: the guest's hash follows the writes.
    sha=$(sha256sum /tmp/nvmet.img | cut -d' ' -f1)
  done
  step "bench --verify"
  host_call nvme_bench
  check "ironsan bench nvme+tcp:// --verify, with and without digests" test $? -eq 0
  nvmet_unserve
  dmesg | grep -i nvme | tail -12 | sed 's/^/  dmesg| /'
  check "no nvme error in dmesg" sh -c "! dmesg | grep -i nvme | grep -i -E 'error|fail'"
  finish
}

# ----------------------------------------------------------------------------- host side
sha_of() { sha256sum <"$1" | cut -d' ' -f1; }
ir() { timeout 120 "$IRONSAN" "$@"; }
nvme_url() { echo "nvme+tcp://127.0.0.1:$KP_FWD_PORT/$NQN/1"; }

# fails_with WANT ARGS...: `ironsan ARGS` fails with one line of output containing WANT.
fails_with() {
  local want=$1 out
  shift
  if out=$(ir "$@" 2>&1 >/dev/null); then
    echo "  | (succeeded)"
    return 1
  fi
  echo "  | $out"
  test "$(printf '%s\n' "$out" | grep -c .)" -eq 1 && printf '%s\n' "$out" | grep -q -- "$want"
}

# host_nvme_check VARIANT SHA: the whole namespace read (must hash to SHA), 32 MiB written
# and read back; prints WROTE_REGION for the guest. VARIANT digests turns both digests on.
host_nvme_check() {
  local variant=$1 sha=$2 fails=0 d=$KP_RUN/host url off=16 dg=""
  url=$(nvme_url)
  if [ "$variant" = digests ]; then
    dg="--header-digest crc32c --data-digest crc32c"
    off=32
  fi
  # shellcheck disable=SC2086 # $dg is empty or four words
  ir read "$url" --output "$d/nvme-read.img" $dg
  c "$variant: read the whole namespace (64 MiB): the guest's data" test "$(sha_of "$d/nvme-read.img")" = "$sha"
  head -c 32M /dev/urandom >"$d/nvme-write.img"
  # shellcheck disable=SC2086
  c "$variant: write 32 MiB at $off MiB" ir write "$url" --offset "${off}MiB" --input "$d/nvme-write.img" $dg
  # shellcheck disable=SC2086
  ir read "$url" --offset "${off}MiB" --length 32MiB --output "$d/nvme-back.img" --connections 2 $dg
  c "$variant: read back identical (two I/O queues)" cmp "$d/nvme-write.img" "$d/nvme-back.img"
  echo "WROTE_REGION $off 32 $(sha_of "$d/nvme-write.img")"
  if [ "$variant" = plain ]; then
    c "a URL without a namespace ID says so" fails_with "namespace ID" read "$(dirname "$url")"
    c "a wrong subsystem NQN is refused by Connect" fails_with "Connect" read \
      "$(echo "$url" | sed 's/host-nvmet/nothing/')" --length 4k
  fi
  rm -f "$d"/nvme-*.img
  return $((fails > 0))
}

# host_nvme_bench: `ironsan bench --verify` (random 64 KiB writes then reads, checked) for a
# few seconds, without and with digests, two I/O queues.
host_nvme_bench() {
  local fails=0 url
  url=$(nvme_url)
  c "bench --verify, no digests" ir bench "$url" --rw write,read --pattern rand --size 64k \
    --qd 16 --duration 3 --span 32m --verify --connections 2
  c "bench --verify, header and data digests" ir bench "$url" --rw mixed --pattern rand \
    --size 4k..128k --qd 8 --duration 1 --span 16m --verify --header-digest crc32c --data-digest crc32c
  return $((fails > 0))
}
