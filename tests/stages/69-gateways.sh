#!/usr/bin/env bash
# stage-timeout: 300
# Stage 69: several gateways, one LUN (docs/gateways.md) as real processes: two `ironsan target`
# processes on loopback, gateways A and B of one [gateway] group, serving one file LUN with an
# owner lock file beside it.
#   * failover: `ironsan bench` over both portals (multipath URL) writes and verifies while A
#     is killed with kill -9 and later restarted: no command fails, every block verifies;
#   * both gateways written at once: a bench through A alone (--verify, the LUN's first
#     16 MiB) while writes go through B alone to a distinct range; both ranges read back
#     identical through either gateway, and the ownership acquisitions both gateways count
#     (`alua.show`) stay bounded by what the hold-down allows;
#   * one owner at a time: alua.show on both gateways, sampled during that concurrent I/O,
#     never shows two gateways active/optimized (no gateway-to-gateway channel exists: the
#     owner lock on the shared storage is the only arbiter, as when the gateways are cut off
#     from each other);
#   * a bad group: a third gateway claiming A's relative target port on the same LUN logs one
#     line naming both gateways and the fix and reports its path unavailable instead of
#     serving the LUN.
set -euo pipefail
cd "$(dirname "$0")/../.."

IRONSAN="${IRONSAN:-$PWD/target/release/ironsan}"
BASE=$((36000 + RANDOM % 4000))
PA=$BASE
PB=$((BASE + 1))
PC=$((BASE + 2))
IQN=iqn.2026-11.org.ironsan.test:gateways
HOLD_DOWN_MS=2000

for tool in timeout python3 cmp; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not installed (scripts/install-deps.sh)"; exit 1; }
done
[[ -x $IRONSAN ]] || { echo "FAIL: no ironsan binary at $IRONSAN"; exit 1; }

work=$(mktemp -d /tmp/ironsan-gateways.XXXXXX)
declare -A pid=()
bg_pids=()
cleanup() {
  for p in "${pid[@]}" "${bg_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

fails=0
check() {
  local label=$1
  shift
  if "$@" >"$work/check.out" 2>&1; then
    echo "  ok: $label"
  else
    echo "  FAILED: $label"
    sed 's/^/      /' "$work/check.out" | tail -8
    fails=$((fails + 1))
  fi
}

wait_port() {
  local port=$1 deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  return 1
}

# gw_conf NAME PORT GROUP-ID REL-PORT: a gateway of group "stage-69" with the other two as peers.
gw_conf() {
  local name=$1 port=$2 tpg=$3 rel=$4
  cat <<EOF
portals = ["127.0.0.1:$port"]
control_socket = "$work/$name.sock"

[gateway]
group = "stage-69"
name = "gw-$name"
port_group = $tpg
relative_port = $rel
hold_down_ms = $HOLD_DOWN_MS
check_interval_ms = 200
EOF
  local peer p_tpg
  for peer in a b; do
    [[ $peer == "$name" ]] && continue
    p_tpg=$([[ $peer == a ]] && echo 1 || echo 2)
    # A peer whose ids this gateway itself uses is left out (the bad-group check's gateway
    # claims A's ids; its own config must pass the static check to show the run-time one).
    ((p_tpg == tpg || p_tpg == rel)) && continue
    printf '\n[[gateway.peer]]\nname = "gw-%s"\nport_group = %s\nrelative_port = %s\n' "$peer" "$p_tpg" "$p_tpg"
  done
  cat <<EOF

[[target]]
name = "$IQN"

[target.lun.0]
size = "128MiB"
backend = { type = "file", path = "$work/lun0.img", create = true }
owner_lock = "$work/lun0.owner"
serial = "stage-69-lun0"
wwn = "0x6001405abcdef0123456789abcde0069"
EOF
}

# start_gw NAME PORT GROUP-ID REL-PORT
start_gw() {
  gw_conf "$@" >"$work/$1.toml"
  IRONSAN_LOG=info "$IRONSAN" target --config "$work/$1.toml" >>"$work/$1.log" 2>&1 &
  pid[$1]=$!
  wait_port "$2" 20 || { echo "FAIL: gateway $1 did not listen on $2"; tail -20 "$work/$1.log"; exit 1; }
}

kill_gw() {
  kill -9 "${pid[$1]}" 2>/dev/null || true
  wait "${pid[$1]}" 2>/dev/null || true
  unset "pid[$1]"
}

# alua NAME: this gateway's alua.show for the target (JSON).
alua() {
  timeout 10 "$IRONSAN" admin --socket "$work/$1.sock" --timeout 5 call alua.show "{\"target\": \"$IQN\"}"
}

# lun_field NAME FIELD: one field of LUN 0 in the gateway's alua.show.
lun_field() {
  alua "$1" | python3 -c 'import json,sys; l=json.load(sys.stdin)["luns"]; print([x for x in l if x["lun"]==0][0][sys.argv[1]])' "$2"
}

# settle: waits (at most 15 s) until neither A nor B is transitioning (a hold-down ends).
settle() {
  local deadline=$((SECONDS + 15))
  while ((SECONDS < deadline)); do
    [[ "$(lun_field a state) $(lun_field b state)" != *transitioning* ]] && return 0
    sleep 0.3
  done
  return 1
}

bench_ok() { # JSON-FILE: the bench's JSON shows commands and verified bytes, no error
  python3 - "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
pts = j["points"]
assert pts, "no points"
for p in pts:
    print(f'{p["rw"]} {p["ops"]} ops {p["bytes"]} B, verified {p["verified_bytes"]} B')
    assert p["ops"] > 0 and p["bytes"] > 0 and p["verified_bytes"] > 0, p
PY
}

URL_A=iscsi://127.0.0.1:$PA/$IQN/0
URL_B=iscsi://127.0.0.1:$PB/$IQN/0
URL_AB=iscsi://127.0.0.1:$PA,127.0.0.1:$PB/$IQN/0

start_gw a "$PA" 1 1
start_gw b "$PB" 2 2
echo "== two gateways: A on $PA, B on $PB (work dir $work)"
sleep 1
check "A owns the LUN (first to start), B sees A as owner" \
  test "$(lun_field a state)/$(lun_field b owner)" = active/optimized/gw-a

# ------------------------------------------------------------------------------ failover
echo "== failover: bench over both portals while A is killed (kill -9) and restarted"
t0=$SECONDS
timeout 120 "$IRONSAN" bench "$URL_AB" --rw write --pattern rand --size 64k --qd 8 --duration 14 \
  --verify --span 32m --path-timeout 5 --path-check-interval 1 --no-path-retry 30 \
  --json "$work/failover.json" >"$work/failover.out" 2>&1 &
bench=$!
bg_pids+=("$bench")
sleep 3
kill_gw a
echo "  A killed after $((SECONDS - t0)) s"
sleep 4
start_gw a "$PA" 1 1
echo "  A restarted after $((SECONDS - t0)) s"
brc=0
wait "$bench" || brc=$?
check "bench across the failover: exit status 0" test "$brc" -eq 0
check "bench across the failover: commands done, every byte written verified" bench_ok "$work/failover.json"
check "B took the LUN over" test "$(lun_field b acquired)" -ge 1
[[ $brc -eq 0 ]] || tail -5 "$work/failover.out" | sed 's/^/      /'

# ------------------------------------------------------------------------------ concurrent
echo "== both gateways written at once, distinct ranges; one owner at a time"
acq0=$(($(lun_field a acquired) + $(lun_field b acquired)))
t1=$SECONDS
timeout 90 "$IRONSAN" bench "$URL_A" --rw write --pattern rand --size 64k --qd 4 --duration 10 \
  --verify --span 16m --seed 7 --json "$work/conc-a.json" >"$work/conc-a.out" 2>&1 &
bench=$!
bg_pids+=("$bench")
# B's range: 16 MiB from 64 MiB, written in 1 MiB pieces (one ironsan write each) in rounds.
head -c $((16 << 20)) /dev/zero >"$work/expect-b.bin"
# A write B answers NOT READY, transitioning (while it takes the LUN over, or in its hold-down)
# or UNIT ATTENTION, ASYMMETRIC ACCESS STATE CHANGED is sent again, as a host does; a write is
# expected only once B acknowledged it.
writer_b() {
  local i try retries=0 deadline=$((SECONDS + 10))
  for ((i = 0; i < 400 && SECONDS < deadline; i++)); do
    local off=$(((i * 5) % 16))
    head -c $((1 << 20)) /dev/urandom >"$work/piece.bin"
    for ((try = 0; try < 50; try++)); do
      timeout 30 "$IRONSAN" write "$URL_B" --offset $(((64 + off) << 20)) --input "$work/piece.bin" \
        >/dev/null 2>"$work/writer-b.err" && break
      grep -q -e '0x04/0x0a' -e '0x2a/0x06' "$work/writer-b.err" || { cat "$work/writer-b.err"; return 1; }
      retries=$((retries + 1))
      sleep 0.2
    done
    ((try < 50)) || { echo "piece $i: still transitioning after 50 tries"; return 1; }
    dd if="$work/piece.bin" of="$work/expect-b.bin" bs=1M seek="$off" conv=notrunc status=none
  done
  echo "$i pieces, $retries sent again after NOT READY or UNIT ATTENTION"
}
writer_b >"$work/writer-b.out" 2>&1 &
writer=$!
bg_pids+=("$writer")
# One owner at a time: both gateways' alua.show sampled over their control sockets in the
# order X, Y, X (X alternating) while the writes go on; see owner_samples.
python3 - "$work/a.sock" "$work/b.sock" "$IQN" "$work/samples" 30 "$bench" <<'PY' &
import json, os, socket, sys, time
socks, iqn, out, limit, bench = sys.argv[1:3], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6])
conns = []
for path in socks:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    conns.append((s, s.makefile("rb")))
def state(i, n=[0]):
    n[0] += 1
    s, f = conns[i]
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": n[0], "method": "alua.show", "params": {"target": iqn}}).encode() + b"\n")
    r = json.loads(f.readline())["result"]
    return time.monotonic(), [l for l in r["luns"] if l["lun"] == 0][0]["state"]
end = time.monotonic() + limit
with open(out, "w") as o:
    k = 0
    while time.monotonic() < end:
        try:
            os.kill(bench, 0)
        except ProcessLookupError:
            break
        x, y = k % 2, 1 - k % 2
        t1, s1 = state(x); t2, s2 = state(y); t3, s3 = state(x)
        o.write(f"{'ab'[x]} {t1:.4f} {s1} {'ab'[y]} {t2:.4f} {s2} {t3:.4f} {s3}\n")
        k += 1
        time.sleep(0.02)
PY
sampler=$!
bg_pids+=("$sampler")
brc=0 wrc=0 src=0
wait "$bench" || brc=$?
wait "$writer" || wrc=$?
wait "$sampler" || src=$?
elapsed=$((SECONDS - t1))
check "bench through A: exit status 0" test "$brc" -eq 0
check "bench through A: commands done, every chunk written verified" bench_ok "$work/conc-a.json"
check "writes through B: all acknowledged ($(tail -1 "$work/writer-b.out"))" test "$wrc" -eq 0
settle
for gw in a b; do
  url=$URL_A
  [[ $gw == b ]] && url=$URL_B
  check "B's range reads back identical through $gw" bash -c \
    "timeout 60 '$IRONSAN' read '$url' --offset 64MiB --length 16MiB | cmp - '$work/expect-b.bin'"
  timeout 60 "$IRONSAN" read "$url" --length 16MiB --output "$work/range-a-$gw.bin" >/dev/null 2>&1 || true
done
# A's range: its bench read every chunk back through A after the run (--verify); the same
# bytes come through B.
check "A's range reads the same through A and B" cmp "$work/range-a-a.bin" "$work/range-a-b.bin"
# X active/optimized at t1 and at t3, less than a hold-down apart, means X owned the LUN all
# along (a gateway that lost it does not take it back within its hold-down): Y active/optimized
# at t2 between them would be a second owner.
owner_samples() {
  python3 - "$work/samples" "$HOLD_DOWN_MS" <<'PY'
import collections, sys
rows = [l.split() for l in open(sys.argv[1])]
hold = int(sys.argv[2]) / 1000
opt = "active/optimized"
counts = collections.Counter()
two = []
for x, t1, s1, y, t2, s2, t3, s3 in rows:
    counts[(x, s1)] += 1
    counts[(y, s2)] += 1
    if s1 == opt and s3 == opt and s2 == opt and float(t3) - float(t1) < hold:
        two.append((x, t1, y, t2, t3))
print(f"{len(rows)} samples: " + ", ".join(f"{g} {s} {n}" for (g, s), n in sorted(counts.items())))
assert len(rows) >= 20, "too few samples"
assert not two, f"two owners at once: {two[:3]}"
PY
}
check "sampler ran (exit status $src)" test "$src" -eq 0
check "one owner at a time (alua.show of both, sampled during the writes)" owner_samples
cat "$work/check.out" | head -1 | sed 's/^/      /'
acq=$(($(lun_field a acquired) + $(lun_field b acquired) - acq0))
# Each takeover by one gateway is followed by the other's hold-down: at most one flip per
# hold-down period (plus the start of the run), however the writes interleave.
bound=$((elapsed * 1000 / HOLD_DOWN_MS + 2))
echo "  ownership acquisitions during ${elapsed} s of competing writes: $acq (bound $bound)"
check "owner flips bounded: $acq <= $bound" test "$acq" -le "$bound"

# ------------------------------------------------------------------------------ bad group
echo "== a third gateway claiming A's relative target port"
start_gw c "$PC" 3 1
deadline=$((SECONDS + 15))
until grep -q 'relative target port 1' "$work/c.log" 2>/dev/null || ((SECONDS > deadline)); do sleep 0.2; done
check "one log line naming both gateways and the fix" bash -c \
  "grep 'gw-c' '$work/c.log' | grep 'gw-a' | grep -q 'relative target port 1'"
check "C reports its path unavailable" test "$(lun_field c state)" = unavailable
check "C refuses a write: NOT READY, unavailable (04/0C)" bash -c \
  "! timeout 30 '$IRONSAN' write 'iscsi://127.0.0.1:$PC/$IQN/0' --offset 100MiB --input '$work/piece.bin' 2>'$work/e' &&
   grep -q '0x04/0x0c' '$work/e'"
check "nothing of C's write on the LUN (read through A: still zeros)" bash -c \
  "timeout 60 '$IRONSAN' read '$URL_A' --offset 100MiB --length 1MiB | cmp - <(head -c 1048576 /dev/zero)"
settle
check "A and B still serve: A reads B's range back" bash -c \
  "timeout 60 '$IRONSAN' read '$URL_A' --offset 64MiB --length 16MiB | cmp - '$work/expect-b.bin'"

if ((fails > 0)); then
  echo "FAIL: $fails gateway checks failed"
  exit 1
fi
echo "PASS: gateways failover, concurrent writers, one owner, bad group"
