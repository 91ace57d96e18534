#!/usr/bin/env bash
# Stage 80: interop with the Linux kernel's own iSCSI peers (open-iscsi initiator, LIO target)
# and soft-iWARP, in a stock Debian kernel booted under qemu. tests/kernel-peer/run.sh installs
# its host packages, builds or reuses the cached guest (target/kernel-peer-cache/), boots it once
# for all scenarios and prints one line per scenario; it exits non-zero on any FAIL. A few
# failed scenarios run once more in a fresh boot (KP_RETRY, see run.sh): in one CI run every
# check crossing the TCG guest's eth0 failed from one point on; the first failure stays in the
# output.
# stage-timeout: 1500
set -euo pipefail
cd "$(dirname "$0")/../.."
KP_RETRY=1 exec tests/kernel-peer/run.sh
