#!/usr/bin/env bash
# The rdma-core provider (crates/verbs, feature rdma-core) must compile, pass clippy and link
# against libibverbs and librdmacm. It cannot run on this machine (no RDMA devices): its tests
# check that the provider type implements the rdma API and that opening a device fails cleanly.
# The stage also builds the verbs-ping example that the kernel-peer scenario siw-ironsan@verbs
# runs over Linux siw in the qemu guest (target/release/examples/verbs-ping), and ironsan itself
# with the rdma-core feature, in a target directory of its own (target/verbs/release/ironsan),
# whose target serves the kernel's iSER initiator in scenario kinit-iser-verbs.
set -euo pipefail
# (Pipes into grep use -c, never -q: grep -q exits at the first match, the writer may then die
# of SIGPIPE, and pipefail turns a match into a failure; that failed a CI run.)
cd "$(dirname "$0")/../.."
fail() {
  echo "40-iwarp-verbs-build: FAIL: $*" >&2
  exit 1
}
timeout 900 cargo clippy -q --release -p verbs --features rdma-core --all-targets -- -D warnings ||
  fail "clippy on the verbs provider"
out=$(timeout 900 cargo test --release -p verbs --features rdma-core 2>&1) || {
  echo "$out" | tail -20
  fail "cargo test -p verbs --features rdma-core"
}
echo "$out" | grep -E '^test |test result' | head -5
echo "$out" | grep -c 'test tests::verbs_implements_the_rdma_api ... ok' >/dev/null ||
  fail "the provider test did not run"
bin=$(timeout 900 cargo test --release -p verbs --features rdma-core --no-run 2>&1 |
  sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))$/\1/p' | head -1)
[[ -x $bin ]] || fail "no test binary found"
libs=$(ldd "$bin")
grep -q 'libibverbs\.so' <<<"$libs" || fail "not linked against libibverbs"
grep -q 'librdmacm\.so' <<<"$libs" || fail "not linked against librdmacm"
timeout 900 cargo build -q --release -p verbs --features rdma-core --example verbs-ping ||
  fail "building the verbs-ping example"
echo "linked: $(grep -oE 'lib(ibverbs|rdmacm)\.so[.0-9]*' <<<"$libs" | sort -u | paste -sd' ' -)"
CARGO_TARGET_DIR=target/verbs timeout 900 cargo clippy -q --release -p ironsan -p iscsi-target --features ironsan/rdma-core --all-targets -- -D warnings ||
  fail "clippy on ironsan with the rdma-core feature"
CARGO_TARGET_DIR=target/verbs timeout 900 cargo build -q --release -p ironsan --features rdma-core ||
  fail "building ironsan with the rdma-core feature"
ldd target/verbs/release/ironsan | grep -c 'librdmacm\.so' >/dev/null || fail "target/verbs/release/ironsan is not linked against librdmacm"
echo "built: target/verbs/release/ironsan (iser_provider = \"rdma-core\")"
echo "40-iwarp-verbs-build: OK"
