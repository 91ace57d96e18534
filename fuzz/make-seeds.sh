#!/usr/bin/env bash
# Regenerates the seed corpora in fuzz/corpus/ from real traffic: records ironsan's target
# and initiator on loopback (tcpdump on lo, and the target's own --trace) doing discovery,
# logins with CHAP and mutual CHAP, reads and writes with and without digests, and
# iSER over the software iWARP RNIC (also with MPA CRC), plus an rping-style RDMA ping;
# then cuts seeds from those captures and the project's reference captures
# (../shared/captures, ../shared/design/...) with the `seeds` tool (fuzz/src/bin/seeds.rs).
# Needs root (tcpdump on lo) and target/release/ironsan (built when missing).
# Usage: fuzz/make-seeds.sh [OUT_DIR]   (default fuzz/corpus; existing seeds are kept)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-fuzz/corpus}"
ironsan="${IRONSAN:-$PWD/target/release/ironsan}"
[[ -x "$ironsan" ]] || cargo build --release -p ironsan
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
ping_port=$((port + 1))
iqn=iqn.2026-11.org.ironsan:seeds
chap_iqn=iqn.2026-11.org.ironsan:seeds-chap
cat >"$tmp/target.toml" <<EOF
portals = ["tcp://127.0.0.1:$port", "iser://127.0.0.1:$port"]
queue_depth = 32

[[target]]
name = "$iqn"
header_digest = "allowed"
data_digest = "allowed"

[target.lun.0]
size = "4MiB"
backend = "memory"

[[target]]
name = "$chap_iqn"
chap = { user = "alice", secret = "alicesecret12" }
mutual_chap = { user = "target1", secret = "targetsecret1" }

[target.lun.0]
size = "1MiB"
backend = "memory"
block_size = 4096
EOF

timeout 120 tcpdump -i lo -s 0 -U -w "$tmp/lo.pcap" "tcp port $port or tcp port $ping_port" \
  2>"$tmp/tcpdump.log" &
pids+=($!)
sleep 1
timeout 120 "$ironsan" target --config "$tmp/target.toml" --trace "$tmp/target.pcapng" \
  >"$tmp/target.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

run() { timeout 30 "$ironsan" "$@" >/dev/null 2>>"$tmp/client.log" || echo "seed traffic: '$*' failed" >&2; }
# Refusals are traffic too (a failed CHAP login, a LUN listing that meets CHAP).
refused() { timeout 30 "$ironsan" "$@" >/dev/null 2>>"$tmp/client.log" || true; }
url="iscsi://127.0.0.1:$port/$iqn/0"
head -c 65536 /dev/urandom >"$tmp/data"
run discover "127.0.0.1:$port"
refused ls "iscsi://127.0.0.1:$port"
run inq "$url"
run write "$url" --offset 4k -i "$tmp/data"
run read "$url" --offset 4k --length 64k
run write "$url" --header-digest crc32c --data-digest crc32c -i "$tmp/data"
run read "$url" --header-digest crc32c --data-digest crc32c --length 32k
run write "$url" --initial-r2t yes --immediate-data no -i "$tmp/data"
run read "iscsi://alice%alicesecret12@127.0.0.1:$port/$chap_iqn/0?target_user=target1&target_password=targetsecret1" --length 8k
run read "iscsi://alice%alicesecret12@127.0.0.1:$port/$chap_iqn/0" --length 4k
refused read "iscsi://alice%wrongsecret00@127.0.0.1:$port/$chap_iqn/0" --length 4k
run inq "iser://127.0.0.1:$port/$iqn/0"
run write "iser://127.0.0.1:$port/$iqn/0" -i "$tmp/data"
run read "iser://127.0.0.1:$port/$iqn/0" --length 64k
timeout 30 "$ironsan" rdma ping --server --listen "127.0.0.1:$ping_port" >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
run rdma ping "127.0.0.1:$ping_port" --count 3 --crc
sleep 1
for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()

# The documented configuration examples (docs/*.md) and the one above are the config seeds.
sed -n '/^```toml$/,/^```$/p' docs/*.md | awk '/^```toml$/{n++; f="'"$tmp"'/readme-" n ".toml"; next} /^```$/{f=""; next} f{print > f}'
cargo run --release --quiet --manifest-path fuzz/Cargo.toml --bin seeds -- "$out" \
  "$tmp/lo.pcap" "$tmp/target.pcapng" \
  $(ls ../shared/captures/*.pcap* ../shared/design/*/reference/*.pcap* 2>/dev/null) \
  "$tmp"/*.toml
du -sh "$out"
