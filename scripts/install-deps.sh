#!/usr/bin/env bash
# Installs the Debian packages the test suite needs (idempotent; quiet when all are present).
set -euo pipefail
packages=(
  libiscsi-bin   # iscsi-ls, iscsi-inq, iscsi-perf, iscsi-test-cu: the conformance peer
  tgt            # tgtd: the comparison target
  tshark         # independent decoder for our wire bytes
  tcpdump
  iptables       # iptables-legacy: one-shot segment drop for the analyzer loss test
  libibverbs-dev # the verbs provider links rdma-core (compile-only: no RDMA devices here)
  librdmacm-dev
  gcc            # the verbs provider's C shim over libibverbs' inline functions (cc crate)
  rdma-core
  iproute2
  python3
  qemu-utils     # qemu-img, qemu-io: real NBD clients of `ironsan nbd` (crates/nbd/tests)
  libnbd-bin     # nbdinfo, nbdcopy: libnbd's NBD clients
  fuse3          # fusermount3: `ironsan mount` by a user other than root (root mounts directly)
  fio            # crc32c-verified random I/O through `ironsan mount` + losetup (crates/ironsan/tests)
  e2fsprogs      # mkfs.ext4 on the loop device of a mounted LUN
  ceph-mon       # the one-node test cluster of scripts/ceph-test-cluster.sh (RBD LUNs, stage 67)
  ceph-osd
  ceph-common    # ceph, rbd: cluster setup, rbd export/import; pulls in librbd1 and librados2
  tgt-rbd        # tgtd's bs_rbd store: the comparison of `ironsan bench rbd` (stage 67)
  chromium       # headless browser: runs the self-test of `ironsan analyze --html` pages
  prometheus     # promtool: lints a scrape of `ironsan target --metrics` (stage 68)
  systemd        # systemd-analyze: verifies dist/ironsan.service (stage 68)
  curl           # scrapes the metrics endpoint (stage 68)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -c "install ok installed" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is not installed: install the Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
