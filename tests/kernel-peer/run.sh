#!/usr/bin/env bash
# Kernel-peer interop tests: boots a stock Debian bookworm kernel under qemu and runs named
# scenarios in it against ironsan (and reference peers) on the host.
#
# Usage: tests/kernel-peer/run.sh [--list] [SCENARIO[@KIND] ...]
#   SCENARIO is a file name in scenarios/ without .sh; KIND picks the host-side peer (a target
#   kind for kinit-*: ironsan | tgtd; an initiator kind for lio-tcp: ironsan | libiscsi).
#   Without arguments, runs the default set below. All scenarios of one run share one boot.
# Env: IRONSAN (the ironsan binary, default target/release/ironsan), KP_CAPTURE=1 (tcpdump the host target's port on lo
#   into target/kernel-peer/host/*.pcap), KP_MEM (guest MiB, default 2048), KP_RETRY=1 (up to
#   four failed scenarios run once more in a fresh boot, logs in target/kernel-peer-retry).
# Prints one line per scenario: "kernel-peer: NAME PASS|FAIL|NOT RUN (N s)"; exits 1 on any FAIL.
set -euo pipefail
KP_DIR=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$KP_DIR/../.." && pwd)
export KP_DIR
export KP_CACHE=${KP_CACHE:-$REPO/target/kernel-peer-cache}
export KP_RUN=${KP_RUN:-$REPO/target/kernel-peer}
DEFAULT_SCENARIOS=(
  siw-rping siw-ironsan@server siw-ironsan@client siw-ironsan@verbs
  kinit-basic@tgtd
  kinit-basic kinit-chap kinit-mutual-chap kinit-digests kinit-two-luns kinit-reconnect kinit-fio
  kinit-multipath kinit-pr-gateways
  kinit-iser kinit-iser-verbs
  lio-tcp@libiscsi lio-tcp lio-iser@variants lio-iser-verbs
  nvme-kernel
)
# shellcheck source=lib/host.sh
source "$KP_DIR/lib/host.sh"
# shellcheck source=lib/build.sh
source "$KP_DIR/lib/build.sh"

if [[ ${1:-} == --list ]]; then
  for f in "$KP_DIR"/scenarios/*.sh; do
    printf '%-20s %s\n' "$(basename "$f" .sh)" "$(sed -n '1s/^# //p' "$f")"
  done
  exit 0
fi
requested=("$@")
((${#requested[@]})) || requested=("${DEFAULT_SCENARIOS[@]}")

# ------------------------------------------------------------------ build
t_start=$SECONDS
kv=$("$KP_DIR/install-host-deps.sh" | tail -1)
build_guest "$kv"
t_built=$SECONDS

# ------------------------------------------------------------------ run directory + plan
SHARE=$KP_RUN/share
stop_all 2>/dev/null || true
rm -rf "$KP_RUN"
mkdir -p "$SHARE"/{guest,scenarios,out,ctl} "$KP_RUN/host" "$KP_RUN/pids"
cp "$KP_DIR"/guest/runner.sh "$KP_DIR"/guest/lib.sh "$KP_DIR"/guest/kinit.sh "$KP_DIR"/guest/lio.sh "$KP_DIR"/guest/hostile.py \
  "$KP_DIR"/guest/net-probe.sh "$SHARE/guest/"
cp "$KP_DIR"/scenarios/*.sh "$SHARE/scenarios/"
KP_HOST_PORT=$(free_port)
KP_FWD_PORT=$(free_port)
while [[ $KP_FWD_PORT == "$KP_HOST_PORT" ]]; do KP_FWD_PORT=$(free_port); done
# A port nothing listens on: the guest's network probe (guest/net-probe.sh) must be refused.
KP_PROBE_PORT=$(free_port)
while [[ $KP_PROBE_PORT == "$KP_HOST_PORT" || $KP_PROBE_PORT == "$KP_FWD_PORT" ]]; do KP_PROBE_PORT=$(free_port); done
cat >"$SHARE/env" <<EOF
KP_HOST_PORT=$KP_HOST_PORT
KP_FWD_PORT=$KP_FWD_PORT
KP_PROBE_PORT=$KP_PROBE_PORT
KP_TGT_CTL=$((KP_HOST_PORT % 10000 + 100))
KP_IQN_PREFIX=iqn.2026-01.org.ironsan.test
KP_CHAP_USER=kp-initiator
KP_CHAP_SECRET=kp-initiator-secret-1
KP_CHAP_TUSER=kp-target
KP_CHAP_TSECRET=kp-target-secret-22
EOF
set -a
# shellcheck source=/dev/null
source "$SHARE/env"
set +a
export KP_CAPTURE=${KP_CAPTURE:-0} IRONSAN=${IRONSAN:-$REPO/target/release/ironsan}

declare -A not_run=()
plan=()
total_limit=0
for req in "${requested[@]}"; do
  file=${req%%@*}
  [[ -f $KP_DIR/scenarios/$file.sh ]] || {
    echo "kernel-peer: no scenario '$file' (see --list)" >&2
    exit 2
  }
  # shellcheck disable=SC2016
  read -r default_kind limit < <(bash -c 'source "$1"; echo "${KP_DEFAULT_KIND:--} ${KP_TIMEOUT:-300}"' _ "$KP_DIR/scenarios/$file.sh")
  kind=$default_kind
  [[ $req == *@* ]] && kind=${req#*@}
  name=$file
  [[ $kind != - ]] && name=$file@$kind
  # The same scenario asked for twice runs twice, as NAME#2, NAME#3...
  base=$name
  n=1
  while printf '%s\n' "${plan[@]}" | grep -cxF -- "$name" >/dev/null; do
    n=$((n + 1))
    name=$base#$n
  done
  # shellcheck disable=SC2016
  if ! why=$(bash -c 'source "$KP_DIR/lib/host.sh"; source "$1"; declare -F host_available >/dev/null || exit 0; host_available "$2"' _ "$KP_DIR/scenarios/$file.sh" "$kind"); then
    not_run[$name]=$why
    plan+=("$name")
    continue
  fi
  echo "$name $file $kind $limit" >>"$SHARE/plan"
  plan+=("$name")
  total_limit=$((total_limit + limit))
done

# ------------------------------------------------------------------ boot + host agent
# Hardware KVM only with a real kvm_intel/kvm_amd module: a paravirtual /dev/kvm (kvm_pvm) cannot
# boot a stock kernel. Otherwise TCG. One vCPU by default: with two, multi-threaded TCG loses
# network wake-ups here (host->guest reads stall for seconds until the initiator's 5 s NOP-Out,
# 1-5 MB/s instead of ~60 MB/s), and it leaves a host core to the peers under test.
# shellcheck disable=SC2054 # the commas belong to qemu's option syntax
accel=(-accel tcg,thread=multi,tb-size=256 -cpu max)
if [[ -e /dev/kvm ]] && [[ -d /sys/module/kvm_intel || -d /sys/module/kvm_amd ]]; then
  accel=(-enable-kvm -cpu host)
fi
# shellcheck disable=SC2206
[[ -n ${KP_ACCEL:-} ]] && accel=($KP_ACCEL)

# serve_host_calls QEMU_PID: runs each ctl/ID.req ("FILE KIND STEP ARGS...") as host_STEP from
# the scenario's file in a subshell, output in ctl/ID.out, exit status in ctl/ID.rc.
serve_host_calls() {
  local qpid=$1 req id file kind step args
  while kill -0 "$qpid" 2>/dev/null; do
    for req in "$SHARE"/ctl/*.req; do
      [[ -e $req ]] || continue
      id=${req%.req}
      read -r file kind step args <"$req"
      rm -f "$req"
      # shellcheck disable=SC2086
      (
        set +e
        source "$KP_DIR/lib/host.sh"
        # shellcheck source=/dev/null
        source "$KP_DIR/scenarios/$file.sh"
        KP_KIND=$kind
        "host_$step" $args
      ) >"$id.out" 2>&1 </dev/null && echo 0 >"$id.rc.tmp" || echo $? >"$id.rc.tmp"
      mv "$id.rc.tmp" "$id.rc"
    done
    sleep 0.2
  done
}

cleanup() {
  stop_all
  [[ -n ${qemu_pid:-} ]] && kill "$qemu_pid" 2>/dev/null
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t_boot=$SECONDS
if [[ -s $SHARE/plan ]]; then
  append="console=ttyS0 rdinit=/init panic=-1 loglevel=4"
  log "booting the guest for: $(cut -d' ' -f1 "$SHARE/plan" | paste -sd' ' -)"
  timeout $((total_limit + 180)) qemu-system-x86_64 "${accel[@]}" -m "${KP_MEM:-2048}" -smp "${KP_SMP:-1}" \
    -nographic -no-reboot -nodefaults -serial stdio -display none \
    -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.cpio" -append "$append" \
    -virtfs "local,path=$SHARE,mount_tag=kp,security_model=none,id=kp" \
    -netdev "user,id=n0,net=10.0.2.0/24,host=10.0.2.2,ipv6=off,hostfwd=tcp:127.0.0.1:$KP_FWD_PORT-10.0.2.15:3260" \
    -device "${KP_NIC:-virtio-net-pci},netdev=n0" </dev/null >"$KP_RUN/console.log" 2>&1 &
  qemu_pid=$!
  serve_host_calls "$qemu_pid"
  wait "$qemu_pid" || log "qemu exited with status $? (see $KP_RUN/console.log)"
  qemu_pid=
  stop_all
fi
t_end=$SECONDS

# ------------------------------------------------------------------ report
guest_total=0
failed=()
passes=0
skipped=0
echo "kernel-peer: guest build $((t_built - t_start)) s, boot $((t_end - t_boot)) s, logs in $KP_RUN"
for name in "${plan[@]}"; do
  if [[ -n ${not_run[$name]+x} ]]; then
    echo "kernel-peer: $name NOT RUN (0 s): ${not_run[$name]}"
    skipped=$((skipped + 1))
    continue
  fi
  line=$(awk -v n="$name" '$1==n' "$SHARE/out/results" 2>/dev/null | tail -1)
  if [[ -z $line ]]; then
    echo "kernel-peer: $name FAIL (no result: the guest died or timed out, see $KP_RUN/console.log)"
    failed+=("${name%%#*}")
    continue
  fi
  read -r _ status secs <<<"$line"
  guest_total=$((guest_total + secs))
  case $status in
    PASS)
      echo "kernel-peer: $name PASS ($secs s)"
      passes=$((passes + 1))
      ;;
    NOT_RUN)
      echo "kernel-peer: $name NOT RUN ($secs s): $(sed -n 's/^NOT RUN: //p' "$SHARE/out/$name.log" | tail -1)"
      skipped=$((skipped + 1))
      ;;
    *)
      echo "kernel-peer: $name FAIL ($secs s), log $SHARE/out/$name.log:"
      grep -E '^(FAILED|TIMEOUT|NETWORK)' "$SHARE/out/$name.log" | sed 's/^/    /' || true
      # The host side's own failed checks, and the error lines of ironsan (one line each) and
      # of the tools on either side, say which step broke.
      errors='^  host\| (FAILED|ironsan: )|panicked|[Ee]rror|failed|refused|unreachable|timed out'
      lines=$(grep -v -E '^(ok|FAILED|NETWORK|checks failed|---)' "$SHARE/out/$name.log" |
        grep -E "$errors" | head -15 | cut -c1-300 || true)
      if [[ -n $lines ]]; then
        echo "    its log's failed host checks and error lines (first 15):"
        sed 's/^/    /' <<<"$lines"
      fi
      # CI keeps only this output: the guest's kernel lines that bear on a failure go with it.
      if [ -s "$SHARE/out/$name.dmesg" ]; then
        echo "    its kernel log (iSCSI, iSER, siw, SCSI error handling; last 20 such lines):"
        grep -i -E 'iser|siw|isert|iscsi|conn(ection)?[0-9:]* error|timeout|timed out|abort|reset|warn' \
          "$SHARE/out/$name.dmesg" | grep -v 'module verification failed' | tail -20 |
          sed 's/^/      /' || true
      fi
      failed+=("${name%%#*}")
      ;;
  esac
done
fails=${#failed[@]}
echo "kernel-peer: $passes passed, $fails failed, $skipped not run (guest time $guest_total s)"
# KP_RETRY=1 (stage 80 sets it): a few failed scenarios get one more run in a fresh boot, as in
# one CI run every check crossing the TCG guest's eth0 failed from one point on, a fault no run
# here reproduced (guest/net-probe.sh now tells whether the network was alive); their first
# failure stays printed above. Many failures are not that, and are not retried.
if ((fails > 0 && fails <= 4)) && [[ ${KP_RETRY:-0} == 1 ]]; then
  echo "kernel-peer: RETRY once, in a fresh boot: ${failed[*]}"
  KP_RETRY=0 KP_RUN=$KP_RUN-retry exec "$0" "${failed[@]}"
fi
((fails == 0))
