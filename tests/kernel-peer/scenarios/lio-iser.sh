# The ironsan initiator over iSER (iser:// on the host's software iWARP RNIC) against the kernel
# LIO target's ib_isert over siw in the guest, through the slirp port forward 127.0.0.1:$KP_FWD_PORT
# -> 10.0.2.15:3260, an iSER-only portal (guest/lio.sh says why). A 64 MiB fileio
# LUN holds random data written by the guest: the host reads it whole over iSER and must hash it
# to the guest's value, writes 32 MiB of its own and reads it back, and the guest hashes that
# region of the backing file; then a verifying `ironsan bench`. LIO's kernel log must show no
# isert error ("non-page aligned", "unexpected solicited", failed completions).
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=420
host_available() { [ -x "${IRONSAN:-}" ] || { echo "no ironsan binary"; return 1; }; }

guest_main() {
  export HOME=/root
  . /mnt/host/guest/lio.sh
  IQN=$KP_IQN_PREFIX:lio-iser
  lio_iser_target "$IQN" 10.0.2.15
  sha=$SHA
  dmesg -C
  step "host: ironsan over iser://127.0.0.1:$KP_FWD_PORT"
  host_call lio_iser_check "$IQN" "$sha"
  check "host initiator checks" test $? -eq 0
  grep -a '^WROTE_REGION ' "$HOST_OUT" >/tmp/regions || true
  n=0
  while read -r _ off len want; do
    n=$((n + 1))
    lio_backing_has "host" "$off" "$len" "$want"
  done </tmp/regions
  check "the host reported what it wrote" test "$n" -gt 0
  lio_isert_clean
  lio_clear
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
