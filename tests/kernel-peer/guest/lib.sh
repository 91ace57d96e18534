# Helpers for the guest side of the scenarios (POSIX sh: the guest runs dash).
# The host share is /mnt/host; /mnt/host/env holds the values the driver chose for this run
# (ports, names, CHAP secrets), so both sides agree on them.
. /mnt/host/env

FAILS=0
ok() { echo "ok: $*"; }
bad() {
  echo "FAILED: $*"
  FAILS=$((FAILS + 1))
}
step() { echo "--- $* ---"; }

# wait_line FILE PATTERN PID TENTHS: waits until FILE has a line matching PATTERN, while PID
# lives, at most TENTHS tenths of a second.
wait_line() {
  _i=0
  while ! grep -q "$2" "$1" && kill -0 "$3" 2>/dev/null && [ $_i -lt "$4" ]; do
    sleep 0.1
    _i=$((_i + 1))
  done
}
# check LABEL CMD...: runs CMD, records ok/bad under LABEL.
check() {
  label=$1
  shift
  if "$@"; then ok "$label"; else bad "$label"; fi
}
# finish: the scenario's exit status, 0 only when no check failed.
finish() {
  echo "checks failed: $FAILS"
  [ "$FAILS" -eq 0 ]
}
# not_run REASON: the scenario cannot run here (exit status 77 tells the runner).
not_run() {
  echo "NOT RUN: $*"
  exit 77
}

# host_call STEP [ARGS...]: asks the host driver to run host_STEP from this scenario's file, waits
# (bounded) for it, and copies its output into this log. The host's output is also left in
# $HOST_OUT for the caller to parse. Returns the host function's exit status.
KP_CALLS=0
host_call() {
  KP_CALLS=$((KP_CALLS + 1))
  id=$KP_SCENARIO.$KP_CALLS
  id=$(echo "$id" | tr '@' '_')
  HOST_OUT=/mnt/host/ctl/$id.out
  echo "$KP_FILE $KP_KIND $*" >/mnt/host/ctl/$id.tmp
  mv /mnt/host/ctl/$id.tmp /mnt/host/ctl/$id.req
  i=0
  while [ ! -f /mnt/host/ctl/$id.rc ] && [ $i -lt 1800 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  if [ ! -f /mnt/host/ctl/$id.rc ]; then
    echo "host_call $*: no answer from the host within 180 s"
    return 1
  fi
  echo ">>> host: $*"
  sed 's/^/  host| /' "$HOST_OUT"
  rc=$(cat /mnt/host/ctl/$id.rc)
  echo "<<< host: $* -> $rc"
  return "$rc"
}

# ---------------------------------------------------------------- open-iscsi initiator
start_iscsid() {
  modprobe sd_mod
  modprobe sg
  modprobe iscsi_tcp
  # Fail fast instead of open-iscsi's long default login retry loops. The replacement timeout
  # (how long a session may stay in recovery before its disks go offline and every I/O fails
  # with "rejecting I/O to offline device") stays well above a relogin's worst case in a TCG
  # guest on a loaded host (tens of seconds), so slowness is not mistaken for a fault.
  # NOP-Out every second: under TCG on a busy host, qemu sometimes stops moving host->guest
  # packets until the guest transmits something (captures show the target's data stuck behind
  # a zero window for exactly the 5 s NOP-Out interval, with tgtd and ironsan alike); a 1 s
  # ping shortens such stalls (32 MiB reads: 9 s and 0.8 s instead of 20-36 s in one trial).
  sed -i -e 's/^node.session.initial_login_retry_max = .*/node.session.initial_login_retry_max = 2/' \
    -e 's/^node.conn\[0\].timeo.noop_out_interval = .*/node.conn[0].timeo.noop_out_interval = 1/' \
    -e 's/^node.conn\[0\].timeo.noop_out_timeout = .*/node.conn[0].timeo.noop_out_timeout = 15/' \
    -e 's/^node.conn\[0\].timeo.login_timeout = .*/node.conn[0].timeo.login_timeout = 10/' \
    -e 's/^node.session.timeo.replacement_timeout = .*/node.session.timeo.replacement_timeout = 60/' \
    /etc/iscsi/iscsid.conf
  grep -E '^node.(conn\[0\].timeo.noop_out_interval|session.timeo.replacement_timeout)' \
    /etc/iscsi/iscsid.conf | sed 's/^/  iscsid.conf: /'
  if ! pgrep -x iscsid >/dev/null; then
    iscsid -f >/tmp/iscsid.log 2>&1 &
    i=0
    while [ ! -S /run/iscsid.sock ] && ! iscsiadm -m session >/dev/null 2>&1 && [ $i -lt 50 ]; do
      sleep 0.1
      i=$((i + 1))
    done
  fi
}

# discover PORTAL IQN: SendTargets discovery must list IQN. The target advertises its own
# listening address (127.0.0.1 on the host), so the node record used for login is made for the
# slirp-side PORTAL instead.
discover() {
  iscsiadm -m discovery -t sendtargets -p "$1" >/tmp/discovery.out 2>&1
  rc=$?
  sed 's/^/  /' /tmp/discovery.out
  [ $rc -eq 0 ] && grep -q " $2\$" /tmp/discovery.out
}

# node_new PORTAL IQN: a fresh node record (older ones deleted).
node_new() {
  iscsiadm -m node -o delete -T "$2" >/dev/null 2>&1
  iscsiadm -m node -o new -T "$2" -p "$1" >/dev/null
}
# node_set PORTAL IQN NAME VALUE
node_set() { iscsiadm -m node -T "$2" -p "$1" -o update -n "$3" -v "$4"; }
login() { iscsiadm -m node -T "$2" -p "$1" --login; }
logout() { iscsiadm -m node -T "$2" -p "$1" --logout; }
no_session() { ! iscsiadm -m session 2>/dev/null | grep -q " $1\$"; }

# session_disks IQN: prints "LUN sdX" for each disk attached by IQN's session (bounded wait for
# at least COUNT disks, default 1).
session_disks() {
  want=${2:-1}
  i=0
  while [ $i -lt 300 ]; do
    iscsiadm -m session -P3 2>/dev/null | awk -v t="$1" '
      /^Target:/ {cur=$2}
      /scsi[0-9]+ Channel [0-9]+ Id [0-9]+ Lun:/ {lun=$NF}
      /Attached scsi disk/ {if (cur==t) print lun, $4}' >/tmp/disks
    n=0
    all=1
    while read -r lun d; do
      n=$((n + 1))
      [ -b "/dev/$d" ] || all=0
    done </tmp/disks
    if [ $n -ge "$want" ] && [ $all = 1 ]; then
      cat /tmp/disks
      return 0
    fi
    sleep 0.2
    i=$((i + 1))
  done
  return 1
}

# slow_guest_timeouts DEV: SCSI timeouts for a TCG guest. The kernel's defaults (30 s per
# command, 10 s for the error handler's TEST UNIT READY) assume real hardware; here the
# initiator can queue tens of MiB of writes behind a link that moves a few MB/s when the host is
# busy, so a command can wait longer than 30 s without any fault. A timeout starts the error
# handler (ABORT TASK, LUN RESET, target reset, session reset, each followed by a TUR that
# queues behind the same data) and, when all of them time out too, the disk is set offline.
# Longer timeouts keep that for real faults (a target that never answers still fails the
# scenario, by its own time limit).
slow_guest_timeouts() {
  echo 120 >"/sys/block/$1/device/timeout"
  echo 60 >"/sys/block/$1/device/eh_timeout"
  echo "  /dev/$1: command timeout $(cat "/sys/block/$1/device/timeout") s," \
    "error handler $(cat "/sys/block/$1/device/eh_timeout") s"
}

# recovery_events: the kernel's messages about connection recovery and SCSI error handling
# since the scenario began (none is expected outside kinit-reconnect).
recovery_events() {
  dmesg | grep -i -E 'conn(ection)?[0-9:]* error|ping timeout|session recovery|abort|reset|offline|timing out|timed out|eh_'
}

# raw_pattern_io DEV MIB LABEL: writes MIB MiB of random data with O_DIRECT, reads it back with
# O_DIRECT and compares. Leaves the pattern in /tmp/pat.$DEV.
raw_pattern_io() {
  dev=$1
  mib=$2
  dd if=/dev/urandom of=/tmp/pat.$dev bs=1M count="$mib" 2>/dev/null
  dd if=/tmp/pat.$dev of=/dev/$dev bs=1M oflag=direct conv=fsync 2>&1 | tail -1
  dd if=/dev/$dev of=/tmp/back.$dev bs=1M count="$mib" iflag=direct 2>&1 | tail -1
  check "$3: $mib MiB O_DIRECT pattern read back identical" cmp /tmp/pat.$dev /tmp/back.$dev
  rm -f /tmp/back.$dev
}

# ext4_io DEV LABEL: mkfs.ext4, mount, write files, sync, unmount, drop caches, remount, verify.
ext4_io() {
  dev=$1
  mkdir -p /mnt/t
  if ! mkfs.ext4 -q -F "/dev/$dev" || ! mount "/dev/$dev" /mnt/t; then
    bad "$2: mkfs.ext4 + mount"
    return
  fi
  ok "$2: mkfs.ext4 + mount"
  mkdir -p /mnt/t/dir
  n=0
  while [ $n -lt 20 ]; do
    head -c $((n * 37 * 1024 + 511)) /dev/urandom >/mnt/t/dir/f$n
    n=$((n + 1))
  done
  cp "/tmp/pat.$dev" /mnt/t/big 2>/dev/null || head -c 8M /dev/urandom >/mnt/t/big
  (cd /mnt/t && find . -type f | sort | xargs sha256sum) >/tmp/sums.$dev
  sync
  umount /mnt/t
  echo 3 >/proc/sys/vm/drop_caches
  if mount "/dev/$dev" /mnt/t; then
    check "$2: files identical after unmount + remount" sh -c "cd /mnt/t && sha256sum -c --quiet /tmp/sums.$dev"
    check "$2: fsck clean" sh -c "umount /mnt/t && fsck.ext4 -n -f /dev/$dev >/tmp/fsck.out 2>&1"
    cat /tmp/fsck.out 2>/dev/null | tail -2
  else
    bad "$2: remount"
  fi
  umount /mnt/t 2>/dev/null
}

# attach_clean DEV: the sd driver's attach messages for DEV show the caching mode page was read
# (a failed MODE SENSE makes it print "Assuming drive cache") and report no failed command.
attach_clean() {
  dmesg | grep -F "[$1]" >/tmp/attach.$1
  sed 's/^/  /' /tmp/attach.$1
  grep -q 'Write cache:' /tmp/attach.$1 &&
    ! grep -q -i -E 'fail|assuming|sense key|unknown|invalid|error' /tmp/attach.$1
}

# iser_dmesg_clean [PATTERN]: no iser/siw error in the kernel log (siw is built out of tree: its
# unsigned-module taint line is not an error; a WARNING's "Modules linked in:" list names
# ib_iser, siw and net_failover whatever warned; lines matching PATTERN are judged elsewhere).
iser_dmesg_clean() {
  dmesg | grep -i -E 'iser|siw' | grep -v -e 'module verification failed' -e 'Modules linked in:' |
    grep -v -e "${1:-^\$never}" | grep -i -E 'err|fail|timeout|drop' >/tmp/iser-errors
  sed 's/^/  dmesg| /' /tmp/iser-errors
  check "no iser or siw error in the kernel log" test ! -s /tmp/iser-errors
}
