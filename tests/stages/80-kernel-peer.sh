#!/usr/bin/env bash
# Stage 80: interop with the Linux kernel's own iSCSI peers (open-iscsi initiator, LIO target)
# and soft-iWARP, in a stock Debian kernel booted under qemu. tests/kernel-peer/run.sh installs
# its host packages, builds or reuses the cached guest (target/kernel-peer-cache/), boots it once
# for all scenarios and prints one line per scenario; it exits non-zero on any FAIL.
# stage-timeout: 1500
set -euo pipefail
cd "$(dirname "$0")/../.."
exec tests/kernel-peer/run.sh
