# Scenario 2: the kernel initiator with fio (Debian's fio, in the guest) against a host target:
# random writes of mixed 4 KiB-1 MiB blocks over a 128 MiB region at queue depth 16 with
# crc32c verify of every block, then fio's JSON must show 128 MiB written, no errors, and the
# verify pass reading the same amount back.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=300
host_available() { kind_available "$1"; }

guest_main() {
  command -v fio >/dev/null || not_run "fio is not packaged in the guest"
  . /mnt/host/guest/kinit.sh
  kinit_begin basic
  kinit_login fio
  if session_disks "$IQN" >/tmp/lun-disks; then
    read -r lun dev </tmp/lun-disks
    slow_guest_timeouts "$dev"
    step "fio on /dev/$dev (LUN $lun)"
    fio --name=kp-verify --filename=/dev/$dev --direct=1 --ioengine=libaio --iodepth=16 \
      --rw=randwrite --bssplit=4k/30:16k/20:64k/20:256k/15:1m/15 --blockalign=4k \
      --size=128m --offset=0 --norandommap=0 --verify=crc32c --verify_fatal=1 --do_verify=1 \
      --verify_backlog=0 --output-format=json --output=/tmp/fio.json
    rc=$?
    check "fio exit status 0" test $rc -eq 0
    python3 - /tmp/fio.json <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
w, r = job["write"], job["read"]
print(f"  fio: wrote {w['io_bytes']} B in {w['total_ios']} I/Os, verify read {r['io_bytes']} B, "
      f"errors {job['error']}, write {w['bw'] / 1024:.1f} MiB/s")
ok = job["error"] == 0 and w["io_bytes"] == 128 << 20 and r["io_bytes"] == w["io_bytes"]
sys.exit(0 if ok else 1)
PY
    if [ $? -eq 0 ]; then ok "fio wrote 128 MiB, verified all of it, no errors"; else bad "fio JSON check"; fi
  else
    bad "no disk attached"
  fi
  kinit_logout
  kinit_end
}
