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
step() { echo "=== $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"; }
step "cargo fmt"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
step "cargo build"
cargo build --workspace --release --bins
step "cargo test"
cargo test --workspace --release
# The fuzz package (fuzz/, its own workspace and target dir): the replay of every committed
# seed and crash input through the fuzz harnesses (stable Rust, no libFuzzer). The fuzzing
# itself (scripts/fuzz.sh) runs outside CI.
step "fuzz replay"
cargo fmt --manifest-path fuzz/Cargo.toml --all -- --check
cargo test --manifest-path fuzz/Cargo.toml --release

export IRONSAN="$PWD/target/release/ironsan"
# Each stage's output also goes to a log, so that a failing stage's last lines can be printed
# again at the very end, where a CI log cut to its tail still shows why.
logs=target/stage-logs
mkdir -p "$logs"
failed=()
for stage in tests/stages/*.sh; do
  name=$(basename "$stage" .sh)
  [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
  # Every stage is bounded: `timeout` signals the stage's whole process group (servers it
  # started included), then SIGKILLs it 30 s later. A stage may raise its limit with a
  # "# stage-timeout: SECONDS" line.
  limit=$(sed -n 's/^# stage-timeout: *\([0-9]\+\).*/\1/p' "$stage" | head -1)
  limit=${limit:-${STAGE_TIMEOUT:-600}}
  step "stage $name (limit $limit s)"
  start=$SECONDS
  # To a file rather than through a pipe: a server a stage left behind holding its output
  # cannot keep the run waiting.
  rc=0
  timeout -k 30 "$limit" bash "$stage" >"$logs/$name.log" 2>&1 || rc=$?
  cat "$logs/$name.log"
  if ((rc == 0)); then
    echo "=== stage $name: PASS ($((SECONDS - start)) s)"
  else
    ((rc == 124)) && echo "=== stage $name: TIMED OUT after $limit s"
    echo "=== stage $name: FAIL ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
done
if ((${#failed[@]})); then
  for name in "${failed[@]}"; do
    echo "--- last lines of stage $name:"
    tail -15 "$logs/$name.log" | cut -c1-300
  done
  echo "--- disk: $(df -h --output=avail,target . /tmp | tail -n +2 | paste -sd' ')"
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all tests passed ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
