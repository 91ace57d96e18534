# Guest-side runner (started by /init, output on the serial console). Runs each scenario of
# /mnt/host/plan ("NAME FILE KIND TIMEOUT" per line) in its own shell, bounded by TIMEOUT
# seconds, with its log in /mnt/host/out/NAME.log (kernel messages in NAME.dmesg), and appends "NAME STATUS SECONDS" to
# /mnt/host/out/results. Exit status 0 = PASS, 77 = NOT RUN, anything else = FAIL.
echo "kernel-peer: guest up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r)"
mkdir -p /mnt/host/out /mnt/host/ctl
now() { cut -d' ' -f1 /proc/uptime; }
. /mnt/host/env
. /mnt/host/guest/net-probe.sh
# The probe must pass on a fresh guest, or what it says after a failure means nothing.
if net_probe >/tmp/probe.out 2>&1; then probe_ok=1; else
  probe_ok=0
  echo "kernel-peer: guest: the network probe fails on a fresh guest ($(cat /tmp/probe.out)); not used"
fi
while read -r name file kind limit; do
  case "$name" in '' | '#'*) continue ;; esac
  echo "kernel-peer: guest: $name ..."
  dmesg -C
  t0=$(now)
  KP_SCENARIO=$name KP_FILE=$file KP_KIND=$kind timeout -k 5 "$limit" sh -c '
    . /mnt/host/guest/lib.sh
    . /mnt/host/scenarios/$KP_FILE.sh
    guest_main
  ' >"/mnt/host/out/$name.log" 2>&1
  rc=$?
  t1=$(now)
  dmesg >"/mnt/host/out/$name.dmesg"
  case $rc in
    0) status=PASS ;;
    77) status=NOT_RUN ;;
    124 | 137)
      status=FAIL
      echo "TIMEOUT: no end within $limit s" >>"/mnt/host/out/$name.log"
      ;;
    *) status=FAIL ;;
  esac
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", b-a}')
  echo "$name $status $secs" >>/mnt/host/out/results
  echo "kernel-peer: guest: $name $status ($secs s)"
  if [ $status = FAIL ]; then
    tail -25 "/mnt/host/out/$name.log"
    [ $probe_ok = 1 ] && net_after_failure >>"/mnt/host/out/$name.log" 2>&1
  fi
  # Leave no session behind for the next scenario.
  iscsiadm -m node --logoutall=all >/dev/null 2>&1
  iscsiadm -m node -o delete >/dev/null 2>&1
done </mnt/host/plan
echo "kernel-peer: guest done after $(now) s"
