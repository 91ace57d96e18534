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
  kinit_fio fio 128
  kinit_logout
  kinit_end
}
