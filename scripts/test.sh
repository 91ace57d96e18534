#!/usr/bin/env bash
# The one command that runs every ironsan test on a fresh Debian 12 machine:
# installs the system packages the tests need, checks formatting and lints, runs the
# Rust test suites, then the interop stages in tests/stages/ (in name order).
# Usage: scripts/test.sh [STAGE-NAME-FILTER]
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-}"

scripts/install-deps.sh

export CARGO_TERM_COLOR=never
echo "=== cargo fmt"
cargo fmt --all -- --check
echo "=== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "=== cargo build"
cargo build --workspace --release --bins
echo "=== cargo test"
cargo test --workspace --release

export IRONSAN="$PWD/target/release/ironsan"
failed=()
for stage in tests/stages/*.sh; do
  name=$(basename "$stage" .sh)
  [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
  echo "=== stage $name"
  start=$SECONDS
  if bash "$stage"; then
    echo "=== stage $name: PASS ($((SECONDS - start)) s)"
  else
    echo "=== stage $name: FAIL ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
done
if ((${#failed[@]})); then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all tests passed"
