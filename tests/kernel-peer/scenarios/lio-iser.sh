# The ironsan initiator over iSER (iser:// on the host's software iWARP RNIC) against the kernel
# LIO target's ib_isert over siw in the guest, through the slirp port forward 127.0.0.1:$KP_FWD_PORT
# -> 10.0.2.15:3260, an iSER-only portal (guest/lio.sh says why). A 64 MiB fileio
# LUN holds random data written by the guest: the host reads it whole over iSER and must hash it
# to the guest's value, writes 32 MiB of its own and reads it back, and the guest hashes that
# region of the backing file; then a verifying `ironsan bench`. LIO's kernel log must show no
# isert error ("non-page aligned", "unexpected solicited", failed completions).
# `lio-iser@variants` (the default set's kind) goes on: LIO allows unsolicited data
# (InitialR2T=No, FirstBurstLength 64 KiB) and the initiator logs in again with
# ImmediateData=Yes/InitialR2T=No/FirstBurstLength=64k, with InitialR2T=Yes and no immediate
# data, and refusing remote invalidation, then with CHAP once LIO requires it (a wrong secret
# refused): each verifies a bench and 4 MiB written, also found in the backing file. Its ~17
# sessions are what showed LIO's "QP fatal error" / "send failure: local QP operation error"
# when the initiator's FIN raced LIO's siw finishing the Logout Response's Send; the initiator
# now gives the target 100 ms to close first. The same race after the wrong CHAP secret's
# refusal ("login send failure", seen under load) is closed the same way.
# shellcheck disable=SC2034 # read by run.sh
KP_DEFAULT_KIND=ironsan KP_TIMEOUT=600
host_available() { [ -x "${IRONSAN:-}" ] || { echo "no ironsan binary"; return 1; }; }
# (KIND ironsan: the default checks; KIND variants: the login variants and CHAP too.)

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
  if [ "$KP_KIND" = variants ]; then
    # Unsolicited data allowed (LIO's default is InitialR2T=Yes), 64 KiB of it per write: the
    # initiator's offer then decides (InitialR2T is an OR).
    param=/sys/kernel/config/target/iscsi/$IQN/tpgt_1/param
    check "LIO: InitialR2T=No, FirstBurstLength=65536" sh -c \
      "echo No >$param/InitialR2T && echo 65536 >$param/FirstBurstLength && echo Yes >$param/ImmediateData"
    step "host: login variants (unsolicited data, InitialR2T=Yes, no remote invalidation)"
    host_call lio_iser_variants "$IQN"
    check "host initiator variants" test $? -eq 0
    grep -a '^WROTE_REGION ' "$HOST_OUT" >>/tmp/regions || true
    step "LIO: CHAP required (demo mode, TPG credentials)"
    lio_auth chap
    host_call lio_iser_chap "$IQN"
    check "host initiator with CHAP" test $? -eq 0
    grep -a '^WROTE_REGION ' "$HOST_OUT" >>/tmp/regions || true
  fi
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
fails=0
ck() {
  local label=$1
  shift
  if "$@"; then echo "ok: $label"; else
    echo "FAILED: $label"
    fails=$((fails + 1))
  fi
}
ir() { timeout 120 "$IRONSAN" "$@"; }

host_lio_iser_check() {
  local iqn=$1 sha=$2 d=$KP_RUN/host
  local url="iser://127.0.0.1:$KP_FWD_PORT/$iqn/0"
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

# lio_variant LABEL URL MIB [OPTIONS...]: with OPTIONS, inq, a verifying bench in the first
# 8 MiB, 4 MiB written at MIB MiB and read back (a WROTE_REGION line for the guest).
lio_variant() {
  local label=$1 url=$2 at=$3 d=$KP_RUN/host
  shift 3
  ck "$label: inq" ir inq "$url" "$@"
  ck "$label: bench --verify (64 KiB random, QD 8)" ir bench "$url" "$@" \
    --rw write,read --pattern rand --size 64k --qd 8 --count 256 --span 8m --verify
  head -c 4M /dev/urandom >"$d/lio-var.img"
  ck "$label: 4 MiB written at $at MiB" ir write "$url" "$@" --offset "${at}MiB" --input "$d/lio-var.img"
  ir read "$url" "$@" --offset "${at}MiB" --length 4MiB --output "$d/lio-var-back.img"
  ck "$label: read back identical" cmp "$d/lio-var.img" "$d/lio-var-back.img"
  echo "WROTE_REGION $at 4 $(sha256sum <"$d/lio-var.img" | cut -d' ' -f1)"
  rm -f "$d"/lio-var*.img
}

# host_lio_iser_variants IQN: unsolicited data (ImmediateData=Yes, InitialR2T=No,
# FirstBurstLength 64 KiB: LIO reads from the Write VA exactly), InitialR2T=Yes without
# immediate data (every byte by RDMA Read), and remote invalidation refused in the CM word
# (LIO answers with plain Sends).
host_lio_iser_variants() {
  local url="iser://127.0.0.1:$KP_FWD_PORT/$1/0"
  lio_variant "ImmediateData=Yes InitialR2T=No FirstBurstLength=64k" "$url" 8 \
    --immediate-data yes --initial-r2t no --first-burst-length 64k
  lio_variant "ImmediateData=No InitialR2T=Yes" "$url" 12 --immediate-data no --initial-r2t yes
  lio_variant "no remote invalidation" "$url" 16 --no-remote-invalidation
  return $((fails > 0))
}

# host_lio_iser_chap IQN: LIO requires CHAP: a wrong secret is refused, the right one works.
host_lio_iser_chap() {
  local iqn=$1
  ck "CHAP: a wrong secret is refused" sh -c \
    "! timeout 60 '$IRONSAN' inq 'iser://$KP_CHAP_USER%wrong-$KP_CHAP_SECRET@127.0.0.1:$KP_FWD_PORT/$iqn/0'"
  lio_variant "CHAP" "iser://$KP_CHAP_USER%$KP_CHAP_SECRET@127.0.0.1:$KP_FWD_PORT/$iqn/0" 20
  return $((fails > 0))
}
