#!/usr/bin/env bash
# Coverage-guided fuzzing of ironsan's decoders (fuzz/, see docs/testing.md, "Fuzzing").
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  how long each target runs (default 60)
#   TARGET              names from fuzz/fuzz_targets/ (default: all of them)
# Environment:
#   FUZZ_JOBS=N         targets run side by side (default 1)
#   FUZZ_ARGS="..."     extra libFuzzer flags (e.g. "-max_len=65536")
#
# Builds every target with libFuzzer and runs each for the given time, bounded by
# `timeout`. New inputs the fuzzer finds go to fuzz/work/corpus/<target>/ (git-ignored;
# the committed seeds in fuzz/corpus/<target>/ and fuzz/regressions/<target>/ are read
# only); a crash, panic, timeout or out-of-memory leaves its input in
# fuzz/artifacts/<target>/. Prints a table of executions, coverage and results, and exits
# non-zero if any target crashed.
#
# Toolchain: stable Rust is enough. We do not use cargo-fuzz: without a sanitizer it adds
# nothing but a second tool to install, and its default (AddressSanitizer) needs nightly.
# libFuzzer itself comes from the libfuzzer-sys crate (built with the system's C++
# compiler), and the coverage instrumentation libFuzzer feeds on (8-bit edge counters, the
# PC table, comparison tracing) is LLVM's SanitizerCoverage pass, which stable rustc runs
# when asked with -Cpasses=sancov-module and -Cllvm-args. The --target flag keeps these
# flags off build scripts and proc macros (which are not linked with libFuzzer), and the
# separate target directory (fuzz/target) keeps the main build untouched. Rust code is
# memory-safe, so no sanitizer is needed to find panics; overflow checks and debug
# assertions are on.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || ((secs < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi
shift || true
all=$(ls fuzz/fuzz_targets/ | sed -n 's/\.rs$//p' | sort)
if (($#)); then
  targets="$*"
  for t in $targets; do
    grep -qx "$t" <<<"$all" || { echo "unknown target $t (known: $(echo $all))" >&2; exit 2; }
  done
else
  # The order of ironsan_fuzz::TARGETS: cheap codecs first.
  targets="iscsi_pdu login_target login_initiator chap text_keys send_targets iser mpa ddp_rdmap scsi pcap tcp_stream config control_request session_core session_tcp session_iser"
  for t in $all; do grep -qw "$t" <<<"$targets" || targets="$targets $t"; done
fi
jobs="${FUZZ_JOBS:-1}"

# libfuzzer-sys compiles libFuzzer (C++) with the system's compiler.
if ! command -v c++ >/dev/null 2>&1; then
  echo "installing g++ (libFuzzer is C++)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null; }
fi
host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$PWD/fuzz/target"
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers"
export CARGO_TERM_COLOR=never
bins=()
for t in $targets; do bins+=(--bin "$t"); done
echo "=== building ${targets// /, } (stable toolchain, $host)"
cargo build --release --manifest-path fuzz/Cargo.toml --features libfuzzer \
  --target "$host" "${bins[@]}"
bindir="$CARGO_TARGET_DIR/$host/release"

logs=fuzz/work/logs
mkdir -p "$logs"
run_one() {
  local t="$1"
  local work="fuzz/work/corpus/$t"
  mkdir -p "$work" "fuzz/artifacts/$t"
  local seeds=()
  [[ -d "fuzz/corpus/$t" ]] && seeds+=("fuzz/corpus/$t")
  [[ -d "fuzz/regressions/$t" ]] && seeds+=("fuzz/regressions/$t")
  local rc=0
  # -max_total_time bounds the run; timeout(1) bounds it again should libFuzzer hang
  # (a hung input is also caught per input by -timeout).
  # shellcheck disable=SC2086
  timeout -k 10 $((secs + 120)) "$bindir/$t" "$work" "${seeds[@]}" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" ${FUZZ_ARGS:-} >"$logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$logs/$t.rc"
}

running=0
for t in $targets; do
  echo "=== fuzzing $t for $secs s (log: $logs/$t.log)"
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=()
printf '%-16s %8s %12s %8s %8s %8s  %s\n' target seconds execs cov ft corpus result
for t in $targets; do
  log="$logs/$t.log"
  rc=$(cat "$logs/$t.rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  line=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$line")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$line")
  result=ok
  if ((rc != 0)); then
    result="CRASH (exit $rc): $(ls -t "fuzz/artifacts/$t" 2>/dev/null | head -3 | tr '\n' ' ')"
    failed+=("$t")
  fi
  printf '%-16s %8s %12s %8s %8s %8s  %s\n' "$t" "$secs" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
if ((${#failed[@]})); then
  for t in "${failed[@]}"; do
    echo "--- $t:"
    grep -E -A25 'panicked at|ERROR: libFuzzer|==[0-9]+== ERROR|deadly signal|timeout after' "$logs/$t.log" | head -40 || tail -20 "$logs/$t.log"
  done
  echo "crashed: ${failed[*]} (inputs in fuzz/artifacts/<target>/; add each to fuzz/regressions/<target>/ once fixed)"
  exit 1
fi
echo "no crashes"
