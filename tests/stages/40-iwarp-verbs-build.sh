#!/usr/bin/env bash
# The rdma-core provider must compile and link with its feature on (it cannot run here: no RDMA
# devices); its test checks that opening a device fails cleanly.
set -euo pipefail
cd "$(dirname "$0")/../.."
timeout 900 cargo test --release -p verbs --features rdma-core 2>&1 | tail -5
echo "40-iwarp-verbs-build: OK"
