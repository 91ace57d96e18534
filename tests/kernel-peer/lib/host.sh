# shellcheck shell=bash
# Host-side helpers, sourced by run.sh and by every host_STEP call a scenario makes (each call
# runs in its own subshell, so daemons are tracked through pid files, not shell variables).
# Expects KP_RUN (the run directory) and the values of $KP_RUN/share/env.

log() { echo "[$(date +%T)] $*" >&2; }

# spawn NAME CMD...: starts CMD in the background, output in $KP_RUN/host/NAME.log.
spawn() {
  local name=$1
  shift
  mkdir -p "$KP_RUN/host" "$KP_RUN/pids"
  "$@" >>"$KP_RUN/host/$name.log" 2>&1 &
  echo $! >"$KP_RUN/pids/$name.pid"
}
# stop NAME: ends a spawned process (TERM, then KILL after 3 s: tgtd ignores TERM).
stop() {
  local f=$KP_RUN/pids/$1.pid pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  rm -f "$f"
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 30); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}
stop_all() {
  local f
  for f in "$KP_RUN"/pids/*.pid; do
    [[ -e $f ]] && stop "$(basename "$f" .pid)"
  done
  return 0
}
# wait_for SECONDS CMD...: polls CMD every 0.1 s until it succeeds (bounded).
wait_for() {
  local n=$(($1 * 10)) i
  shift
  for ((i = 0; i < n; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
# c LABEL CMD...: one check of a host step, printed ok/FAILED; failures counted in $fails.
c() {
  local label=$1
  shift
  if "$@"; then echo "ok: $label"; else
    echo "FAILED: $label"
    fails=$((fails + 1))
  fi
}
listening() { ss -ltnH "sport = :$1" | grep -c . >/dev/null; }
# free_port: an unused TCP port on the host loopback (random, 20000-29999).
free_port() {
  local p i
  for i in $(seq 50); do
    p=$((20000 + RANDOM % 10000))
    listening "$p" || {
      echo "$p"
      return 0
    }
  done
  return 1
}

# ------------------------------------------------------------------ host targets
# target_start KIND VARIANT: serves iqn $KP_IQN_PREFIX:VARIANT on 127.0.0.1:$KP_HOST_PORT with
# KIND = tgtd | ironsan. VARIANT: basic | chap | mutual-chap | digests (CRC32C accepted) |
# two-luns. Disk images live in $KP_RUN/host/; LUN sizes: 256 MiB (second LUN: 192 MiB).
target_start() {
  local kind=$1 variant=$2
  target_stop
  if [[ ${KP_CAPTURE:-0} == 1 ]]; then
    local pcap=$KP_RUN/host/$variant-$kind.pcap n=1
    while [[ -e $pcap ]]; do
      n=$((n + 1))
      pcap=$KP_RUN/host/$variant-$kind-$n.pcap
    done
    rm -f "$KP_RUN/host/capture.log"
    # Whole packets for the variants a scenario lists in KP_FULL_CAPTURE (byte counts need
    # every payload byte); the first 2048 bytes of each otherwise.
    local snaplen=${KP_SNAPLEN:-2048}
    [[ " ${KP_FULL_CAPTURE:-} " == *" $variant "* ]] && snaplen=0
    spawn capture tcpdump -i lo -B 131072 -s "$snaplen" --immediate-mode -U -w "$pcap" "tcp port $KP_HOST_PORT"
    wait_for 10 grep -q 'listening on' "$KP_RUN/host/capture.log" || echo "tcpdump is not listening yet"
  fi
  case $kind in
    tgtd) tgtd_start "$variant" ;;
    ironsan) ironsan_target_start "$variant" ;;
    *)
      echo "unknown target kind $kind"
      return 1
      ;;
  esac
}
# check_iser_capture VARIANT [ARGS...]: the newest capture of VARIANT checked by
# iser-capture-check.py (tshark's iWARP decoding; ARGS passed on, e.g. the analyzer's bytes).
check_iser_capture() {
  local variant=$1 pcap
  shift
  pcap=$(ls -t "$KP_RUN"/host/"$variant"-ironsan*.pcap 2>/dev/null | head -1)
  [[ -n $pcap ]] || {
    echo "no capture of $variant in $KP_RUN/host"
    return 1
  }
  timeout 150 python3 "$KP_DIR/iser-capture-check.py" "$pcap" "$KP_HOST_PORT" --ironsan "$IRONSAN" "$@"
}

# The rdma-core build of ironsan (built by stage 40-iwarp-verbs-build), run in the guest over siw.
verbs_ironsan_path() { echo "${KP_VERBS_IRONSAN:-$(dirname "$(dirname "${IRONSAN:-.}")")/verbs/release/ironsan}"; }
verbs_ironsan_available() {
  [[ -x $(verbs_ironsan_path) ]] || {
    echo "no rdma-core build of ironsan at $(verbs_ironsan_path) (CARGO_TARGET_DIR=target/verbs cargo build --release -p ironsan --features rdma-core)"
    return 1
  }
}
# host_verbs_ironsan_stage: copies that build into the share (/mnt/host/bin/ironsan-verbs in
# the guest).
host_verbs_ironsan_stage() {
  mkdir -p "$KP_RUN/share/bin" && cp "$(verbs_ironsan_path)" "$KP_RUN/share/bin/ironsan-verbs" &&
    echo "staged $(verbs_ironsan_path)"
}

target_stop() {
  stop target
  stop capture
}

tgtadm_() { tgtadm -C "$KP_TGT_CTL" --lld iscsi "$@"; }
tgtd_start() {
  local variant=$1 iqn=$KP_IQN_PREFIX:$1
  spawn target tgtd -f -C "$KP_TGT_CTL" --iscsi "portal=127.0.0.1:$KP_HOST_PORT"
  wait_for 10 tgtadm_ --op show --mode target || {
    echo "tgtd did not come up"
    return 1
  }
  tgtadm_ --op new --mode target --tid 1 -T "$iqn"
  rm -f "$KP_RUN"/host/lun*.img
  truncate -s 256M "$KP_RUN/host/lun1.img"
  tgtadm_ --op new --mode logicalunit --tid 1 --lun 1 -b "$KP_RUN/host/lun1.img"
  if [[ $variant == two-luns ]]; then
    truncate -s 192M "$KP_RUN/host/lun2.img"
    tgtadm_ --op new --mode logicalunit --tid 1 --lun 2 -b "$KP_RUN/host/lun2.img"
  fi
  tgtadm_ --op bind --mode target --tid 1 -I ALL
  if [[ $variant == chap || $variant == mutual-chap ]]; then
    tgtadm_ --op new --mode account --user "$KP_CHAP_USER" --password "$KP_CHAP_SECRET"
    tgtadm_ --op bind --mode account --tid 1 --user "$KP_CHAP_USER"
  fi
  if [[ $variant == digests ]]; then
    # tgtd offers only None unless told otherwise.
    tgtadm_ --op update --mode target --tid 1 -n HeaderDigest -v CRC32C,None
    tgtadm_ --op update --mode target --tid 1 -n DataDigest -v CRC32C,None
  fi
  if [[ $variant == mutual-chap ]]; then
    tgtadm_ --op new --mode account --user "$KP_CHAP_TUSER" --password "$KP_CHAP_TSECRET"
    tgtadm_ --op bind --mode account --tid 1 --user "$KP_CHAP_TUSER" --outgoing
  fi
  wait_for 5 listening "$KP_HOST_PORT" || {
    echo "tgtd is not listening on 127.0.0.1:$KP_HOST_PORT"
    return 1
  }
  echo "tgtd serving $iqn on 127.0.0.1:$KP_HOST_PORT"
}

# ironsan_target_available: prints why not and fails when $IRONSAN has no usable target.
ironsan_target_available() {
  if [[ -z ${IRONSAN:-} || ! -x ${IRONSAN:-} ]]; then
    echo "no ironsan binary (\$IRONSAN unset or not executable)"
    return 1
  fi
  if ! "$IRONSAN" target --help >/dev/null 2>&1; then
    echo "ironsan target not available yet ('$IRONSAN target --help' fails)"
    return 1
  fi
}
# ironsan_target_start VARIANT: a TOML config for the variant (RAM LUNs 0 and, for two-luns, 1;
# iser*: iSCSI/TCP and iSER on the port, iser-crc insisting on MPA CRC, iser-chap with CHAP;
# CHAP secrets from the env file; digests "allowed", the default, so CRC32C is accepted when
# offered), then `ironsan target --config`.
ironsan_target_start() {
  local variant=$1 iqn=$KP_IQN_PREFIX:$1 conf=$KP_RUN/host/ironsan-$1.toml
  {
    if [[ $variant == iser* ]]; then
      # iSCSI/TCP (for SendTargets) and iSER on one port, told apart by the first bytes.
      echo "portals = [\"tcp://127.0.0.1:$KP_HOST_PORT\", \"iser://127.0.0.1:$KP_HOST_PORT\"]"
      [[ $variant == iser-crc ]] && echo "iser_mpa_crc = true"
      # The guest sits behind qemu's user-mode network: the hop captured here is loopback.
      echo "iser_align_loopback = true"
    else
      echo "portals = [\"127.0.0.1:$KP_HOST_PORT\"]"
    fi
    echo
    echo "[[target]]"
    echo "name = \"$iqn\""
    if [[ $variant == chap || $variant == mutual-chap || $variant == iser-chap ]]; then
      echo "chap = { user = \"$KP_CHAP_USER\", secret = \"$KP_CHAP_SECRET\" }"
    fi
    if [[ $variant == mutual-chap ]]; then
      echo "mutual_chap = { user = \"$KP_CHAP_TUSER\", secret = \"$KP_CHAP_TSECRET\" }"
    fi
    if [[ $variant == digests ]]; then
      echo 'header_digest = "allowed"'
      echo 'data_digest = "allowed"'
    fi
    printf '\n[target.lun.0]\nsize = "256MiB"\nbackend = "memory"\n'
    if [[ $variant == two-luns ]]; then
      printf '\n[target.lun.1]\nsize = "192MiB"\nbackend = "memory"\n'
    fi
  } >"$conf"
  sed 's/^/  | /' "$conf"
  export IRONSAN_LOG=${IRONSAN_LOG:-info}
  spawn target "$IRONSAN" target --config "$conf"
  wait_for 15 listening "$KP_HOST_PORT" || {
    echo "ironsan target is not listening on 127.0.0.1:$KP_HOST_PORT:"
    tail -20 "$KP_RUN/host/target.log"
    return 1
  }
  echo "ironsan serving $iqn on 127.0.0.1:$KP_HOST_PORT"
}

# kind_available KIND: can a host target of KIND run here? (prints why not)
kind_available() {
  case $1 in
    tgtd) command -v tgtd >/dev/null || {
      echo "tgtd is not installed"
      return 1
    } ;;
    ironsan) ironsan_target_available ;;
    *)
      echo "unknown target kind $1"
      return 1
      ;;
  esac
}

# The steps every kinit-* scenario asks for (KP_KIND comes with the request).
host_target_start() { target_start "$KP_KIND" "$1"; }
host_target_stop() { target_stop; }

# initiator_available KIND: can a host initiator of KIND run here? (prints why not)
initiator_available() {
  case $1 in
    libiscsi)
      if ! command -v iscsi-ls >/dev/null || ! command -v qemu-img >/dev/null ||
        [[ -z $(find /usr/lib -name 'block-iscsi.so' -print -quit 2>/dev/null) ]]; then
        echo "libiscsi-bin or qemu-block-extra is not installed"
        return 1
      fi
      ;;
    ironsan)
      if [[ -z ${IRONSAN:-} || ! -x ${IRONSAN:-} ]]; then
        echo "no ironsan binary (\$IRONSAN unset or not executable)"
        return 1
      fi
      if ! "$IRONSAN" ls --help >/dev/null 2>&1; then
        echo "ironsan initiator not available yet ('$IRONSAN ls --help' fails)"
        return 1
      fi
      ;;
    *)
      echo "unknown initiator kind $1"
      return 1
      ;;
  esac
}
