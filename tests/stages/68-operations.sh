#!/usr/bin/env bash
# Operating the target: `ironsan target --metrics` is scraped while `ironsan bench` loads it,
# and Prometheus' own linter (`promtool check metrics`) accepts the scrape; a scrape after the
# run counts exactly the reads and writes bench reports (its --json); the endpoint answers
# anything but /metrics with 404. The systemd unit dist/ironsan.service passes
# `systemd-analyze verify` (its ExecStart pointed at the binary under test, since
# /usr/bin/ironsan is not installed here).
# stage-timeout: 300
set -euo pipefail
: "${IRONSAN:?set IRONSAN to the ironsan binary}"
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
tpid=
cleanup() { [[ -n $tpid ]] && kill "$tpid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() {
  echo "--- target log:" >&2
  tail -20 "$work/target.log" >&2 || true
  echo "68-operations: FAIL: $*" >&2
  exit 1
}
ok() { echo "  ok: $*"; }
for tool in promtool systemd-analyze curl python3; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/install-deps.sh installs it)"
done
iqn=iqn.2026-11.org.ironsan:ops
# Below Linux's ephemeral ports (32768 and up), which a connection may hold at any moment.
port=$((20000 + RANDOM % 12000))
mport=$((port + 1))
cat >"$work/target.toml" <<EOT
portals = ["127.0.0.1:$port"]
metrics = "127.0.0.1:$mport"
[[target]]
name = "$iqn"
[target.lun.0]
size = "256MiB"
backend = "memory"
EOT
"$IRONSAN" target --config "$work/target.toml" >"$work/target.log" 2>&1 &
tpid=$!
for _ in $(seq 100); do
  grep -q "metrics on http://" "$work/target.log" && break
  sleep 0.1
done
grep -q "metrics on http://127.0.0.1:$mport/metrics" "$work/target.log" || fail "target did not start with metrics"
murl=http://127.0.0.1:$mport/metrics
url=iscsi://127.0.0.1:$port/$iqn/0

echo "== a scrape under load passes promtool check metrics"
timeout 120 "$IRONSAN" bench "$url" --rw mixed --mix 70 --size 4k,64k --qd 16 --duration 3 \
  --json "$work/bench.json" >"$work/bench.txt" 2>&1 &
bpid=$!
sleep 1.5
curl -sf --max-time 10 "$murl" >"$work/under-load.txt" || fail "scrape under load"
grep -q '^ironsan_lun_queue_depth{' "$work/under-load.txt" || fail "no queue depth in the scrape"
promtool check metrics <"$work/under-load.txt" >"$work/promtool.txt" 2>&1 ||
  fail "promtool check metrics: $(cat "$work/promtool.txt")"
wait "$bpid" || fail "bench: $(cat "$work/bench.txt")"
ok "promtool check metrics accepts a scrape taken under load ($(grep -vc '^#' "$work/under-load.txt") samples)"
# OpenMetrics for a client that asks for it (what a Prometheus server does).
curl -sf --max-time 10 -H 'Accept: application/openmetrics-text;version=1.0.0' "$murl" >"$work/om.txt" ||
  fail "OpenMetrics scrape"
tail -1 "$work/om.txt" | grep -qx '# EOF' || fail "the OpenMetrics scrape does not end with # EOF"
ok "OpenMetrics when asked for"

echo "== the counters equal what bench reports"
curl -sf --max-time 10 "$murl" >"$work/after.txt" || fail "scrape after the run"
python3 - "$work/bench.json" "$work/after.txt" "$iqn" <<'PY' || fail "counters differ from bench"
import json, sys
points = json.load(open(sys.argv[1]))["points"]
text = open(sys.argv[2]).read()
lun = '{target="%s",lun="0"}' % sys.argv[3]
def sample(name):
    for line in text.splitlines():
        if line.startswith(name + lun + " "):
            return int(line.split()[-1])
    sys.exit(f"no {name} in the scrape")
want = {
    "ironsan_lun_read_ops_total": sum(p["reads"] for p in points),
    "ironsan_lun_write_ops_total": sum(p["writes"] for p in points),
    "ironsan_lun_read_bytes_total": sum(p["reads"] * p["size"] for p in points),
    "ironsan_lun_write_bytes_total": sum(p["writes"] * p["size"] for p in points),
}
bad = {k: (v, sample(k)) for k, v in want.items() if sample(k) != v}
if bad:
    sys.exit(f"bench vs metrics: {bad}")
print("  " + ", ".join(f"{k}={v}" for k, v in want.items()))
PY
ok "read/write ops and bytes equal bench's"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$mport/")
[[ $code == 404 ]] || fail "GET / answered $code, not 404"
ok "anything but /metrics: 404"

echo "== systemd-analyze verify accepts dist/ironsan.service"
sed "s#/usr/bin/ironsan#$IRONSAN#" "$here/dist/ironsan.service" >"$work/ironsan.service"
grep -q '^Type=notify$' "$work/ironsan.service" && grep -q '^LimitMEMLOCK=infinity$' "$work/ironsan.service" ||
  fail "the unit lost Type=notify or LimitMEMLOCK"
systemd-analyze verify "$work/ironsan.service" >"$work/verify.txt" 2>&1 ||
  fail "systemd-analyze verify: $(cat "$work/verify.txt")"
ok "systemd-analyze verify: $(wc -l <"$work/verify.txt") warnings"
echo "68-operations: PASS"
