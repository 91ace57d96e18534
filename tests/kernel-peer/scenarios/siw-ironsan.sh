# Scenario 5: ironsan's software iWARP against Linux siw in the guest, speaking rping's protocol;
# 20 validated pings with MPA CRC off (siw's default), then on (asked for by ironsan; siw follows),
# then on with 16000-byte pings.
# Kind = the role of ironsan on the host:
#   server: rping -c in the guest -> `ironsan rdma ping --server` on 127.0.0.1:$KP_HOST_PORT
#           (10.0.2.2 in the guest);
#   client: `ironsan rdma ping` on the host -> rping -s in the guest, through the slirp forward
#           127.0.0.1:$KP_FWD_PORT -> 10.0.2.15:3260.
#   verbs:  ironsan's second provider (crates/verbs over libibverbs/librdmacm, example
#           verbs-ping) runs in the guest on siw0: as client and server of the host's software
#           RNIC, and against rping -s / rping -c in the guest (CRC off: siw's choice).
# Both sides' payloads are compared with the text rping generates, so a placement or CRC error
# shows up as a mismatch, not only as an exit status.
KP_DEFAULT_KIND=server
KP_TIMEOUT=90
host_available() {
  case $1 in
    server | client) rdma_ping_available ;;
    verbs) rdma_ping_available && verbs_ping_available ;;
    *)
      echo "unknown kind $1 (server | client)"
      return 1
      ;;
  esac
}

guest_main() {
  siw_up || bad "siw0 on eth0"
  if [ "$KP_KIND" = verbs ]; then
    verbs_main
    finish
    return
  fi
  # MODE SIZE: rping's default 64-byte pings, then 16000-byte ones (each RDMA Read Response and
  # Write spans many MSS-sized FPDUs, siw's and ours).
  for pass in "off 64" "on 64" "on 16000"; do
    # shellcheck disable=SC2086 # two words
    case $KP_KIND in
      server) rping_client_vs_host $pass ;;
      client) rping_server_vs_host $pass ;;
    esac
  done
  finish
}

# rping_client_vs_host MODE SIZE: rping -c here, ironsan rdma ping --server on the host.
rping_client_vs_host() {
  mode=$1
  size=$2
  step "rping -c -a 10.0.2.2 -p $KP_HOST_PORT -C 20 -S $size -v -V  ->  ironsan rdma ping --server (CRC $mode)"
  host_call server_start "$mode"
  check "host: ironsan rdma ping --server listening (CRC $mode)" test $? -eq 0
  timeout 40 rping -c -a 10.0.2.2 -p "$KP_HOST_PORT" -C 20 -S "$size" -v -V >/tmp/rping-c.out 2>/tmp/rping-c.err
  rc=$?
  cat /tmp/rping-c.err
  head -2 /tmp/rping-c.out | cut -c1-100
  check "rping client exit status 0 (CRC $mode)" test $rc -eq 0
  rping_expect 20 "$size" 'ping data: ' >/tmp/expect
  check "rping client: 20 pings, payloads as sent (CRC $mode)" \
    sh -c "grep '^ping data: ' /tmp/rping-c.out | cmp -s - /tmp/expect"
  check "rping client saw no error (CRC $mode)" sh -c "! grep -qi -E 'error|fail' /tmp/rping-c.out /tmp/rping-c.err"
  host_call server_check "$mode" "$size"
  check "host: ironsan server read 20 payloads, MPA CRC $mode" test $? -eq 0
}

# rping_server_vs_host MODE SIZE: rping -s here (port 3260, the forwarded one), ironsan rdma ping
# on the host.
rping_server_vs_host() {
  mode=$1
  size=$2
  step "ironsan rdma ping 127.0.0.1:$KP_FWD_PORT --count 20 --size $size -v  ->  rping -s -a 10.0.2.15 -p 3260 (CRC $mode)"
  timeout 60 rping -s -a 10.0.2.15 -p 3260 -S "$size" -v -V >/tmp/rping-s.out 2>/tmp/rping-s.err &
  srv=$!
  wait_listen 3260
  host_call client "$mode" "$size"
  check "host: ironsan rdma ping: 20 pings verified, MPA CRC $mode" test $? -eq 0
  wait_gone $srv
  echo "  rping -s: $(grep -c '^server ping data: ' /tmp/rping-s.out) lines of server ping data; stderr: $(tr '\n' ' ' </tmp/rping-s.err)"
  rping_expect 20 "$size" 'server ping data: ' >/tmp/expect
  check "rping -s read 20 payloads as sent (CRC $mode)" \
    sh -c "grep '^server ping data: ' /tmp/rping-s.out | cmp -s - /tmp/expect"
  check "rping -s ended on the client's disconnect, no error (CRC $mode)" \
    sh -c "grep -q 'DISCONNECT EVENT' /tmp/rping-s.err && ! grep -qi -E 'error|fail' /tmp/rping-s.out /tmp/rping-s.err"
}

# verbs_main: the verbs provider (verbs-ping) over siw0 against ironsan's software RNIC on the
# host in both directions, then against rdma-core's rping in the guest in both directions.
verbs_main() {
  host_call verbs_stage
  check "host: verbs-ping staged" test $? -eq 0
  vp=/mnt/host/bin/verbs-ping
  rping_expect 20 64 'ping data: ' >/tmp/expect-c
  rping_expect 20 64 'server ping data: ' >/tmp/expect-s

  step "verbs-ping (siw) -> ironsan rdma ping --server (software RNIC on the host)"
  host_call server_start off
  timeout 40 $vp 10.0.2.2:"$KP_HOST_PORT" --count 20 --size 64 -v >/tmp/vp.out 2>&1
  rc=$?
  head -3 /tmp/vp.out
  tail -1 /tmp/vp.out
  check "verbs-ping client exit status 0" test $rc -eq 0
  check "verbs-ping client: 20 payloads as sent" sh -c "grep '^ping data: ' /tmp/vp.out | cmp -s - /tmp/expect-c"
  host_call server_check off 64
  check "host: ironsan server read 20 payloads from the verbs client" test $? -eq 0

  step "ironsan rdma ping (software RNIC on the host) -> verbs-ping --server (siw)"
  timeout 60 $vp --server 10.0.2.15:3260 -v >/tmp/vps.out 2>&1 &
  srv=$!
  wait_listen 3260
  host_call client off 64
  check "host: ironsan rdma ping: 20 pings verified by the verbs server" test $? -eq 0
  wait_gone $srv
  tail -1 /tmp/vps.out
  check "verbs-ping server: 20 payloads read, orderly disconnect" \
    sh -c "grep '^server ping data: ' /tmp/vps.out | cmp -s - /tmp/expect-s && grep -q 'client disconnected after 20 pings' /tmp/vps.out"

  step "verbs-ping -> rping -s (both on siw0)"
  timeout 60 rping -s -a 10.0.2.15 -p 7175 -S 64 -v >/tmp/rs.out 2>/tmp/rs.err &
  srv=$!
  wait_listen 7175
  timeout 40 $vp 10.0.2.15:7175 --count 20 --size 64 -v >/tmp/vp2.out 2>&1
  rc=$?
  tail -1 /tmp/vp2.out
  wait_gone $srv
  check "verbs-ping client against rping -s: exit 0, 20 payloads" \
    sh -c "test $rc -eq 0 && grep '^ping data: ' /tmp/vp2.out | cmp -s - /tmp/expect-c"
  check "rping -s read 20 payloads from verbs-ping" sh -c "grep '^server ping data: ' /tmp/rs.out | cmp -s - /tmp/expect-s"

  step "rping -c -> verbs-ping --server (both on siw0)"
  timeout 60 $vp --server 10.0.2.15:7176 -v >/tmp/vps2.out 2>&1 &
  srv=$!
  wait_listen 7176
  timeout 40 rping -c -a 10.0.2.15 -p 7176 -C 20 -S 64 -v -V >/tmp/rc.out 2>/tmp/rc.err
  rc=$?
  cat /tmp/rc.err
  wait_gone $srv
  tail -1 /tmp/vps2.out
  check "rping -c against verbs-ping: exit 0, 20 payloads" \
    sh -c "test $rc -eq 0 && grep '^ping data: ' /tmp/rc.out | cmp -s - /tmp/expect-c"
  check "verbs-ping server read 20 payloads from rping -c" \
    sh -c "grep '^server ping data: ' /tmp/vps2.out | cmp -s - /tmp/expect-s && grep -q 'client disconnected after 20 pings' /tmp/vps2.out"
}

# wait_listen PORT: waits up to 5 s for a TCP listener on PORT (siw listens on kernel sockets).
wait_listen() {
  i=0
  while ! ss -ltnH "sport = :$1" | grep -q . && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
  done
}

# wait_gone PID: waits up to 10 s for PID to end, then kills it.
wait_gone() {
  i=0
  while kill -0 "$1" 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  kill "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}

# siw_up: siw loaded and siw0 on eth0 (another scenario of this boot may have done it already).
siw_up() {
  for m in siw rdma_ucm ib_uverbs; do modprobe $m || return 1; done
  rdma link show siw0/1 >/dev/null 2>&1 || rdma link add siw0 type siw netdev eth0
}

# rping_expect COUNT SIZE PREFIX: the lines rping -v prints for COUNT pings of SIZE bytes:
# "rdma-ping-N: " then letters cycling 'A'..'z' from a start that moves by one per ping, the
# last byte a NUL (librdmacm/examples/rping.c).
rping_expect() {
  awk -v n="$1" -v size="$2" -v pre="$3" 'BEGIN {
    start = 65
    for (p = 0; p < n; p++) {
      s = "rdma-ping-" p ": "; c = start
      while (length(s) < size - 1) { s = s sprintf("%c", c); c++; if (c > 122) c = 65 }
      start++; if (start > 122) start = 65
      print pre s
    }
  }'
}

# ----------------------------------------------------------------------------- host side
rdma_ping_available() {
  if [ -z "${IRONSAN:-}" ] || [ ! -x "${IRONSAN:-}" ]; then
    echo "no ironsan binary (\$IRONSAN unset or not executable)"
    return 1
  fi
  "$IRONSAN" rdma ping --help >/dev/null 2>&1 || {
    echo "'$IRONSAN rdma ping' not available"
    return 1
  }
}

# (Host functions are parsed by the guest's dash too: no bash-only syntax.)

# The verbs provider's ping: $KP_VERBS_PING, else next to $IRONSAN (cargo build --release -p verbs
# --features rdma-core --example verbs-ping puts it in target/release/examples/).
verbs_ping_path() { echo "${KP_VERBS_PING:-$(dirname "${IRONSAN:-.}")/examples/verbs-ping}"; }
verbs_ping_available() {
  [ -x "$(verbs_ping_path)" ] || {
    echo "no verbs-ping at $(verbs_ping_path) (cargo build --release -p verbs --features rdma-core --example verbs-ping)"
    return 1
  }
}
# verbs_stage: copies verbs-ping into the share (/mnt/host/bin in the guest).
host_verbs_stage() {
  mkdir -p "$KP_RUN/share/bin" && cp "$(verbs_ping_path)" "$KP_RUN/share/bin/verbs-ping" &&
    echo "staged $(verbs_ping_path)"
}

# server_start MODE: one-shot ping server on 127.0.0.1:$KP_HOST_PORT, MPA CRC asked for if MODE=on.
host_server_start() {
  crc=
  [ "$1" = on ] && crc=--crc
  stop pingsrv
  rm -f "$KP_RUN/host/pingsrv-$1.log"
  # shellcheck disable=SC2086 # $crc is empty or one word
  spawn "pingsrv-$1" "$IRONSAN" rdma ping --server --listen "127.0.0.1:$KP_HOST_PORT" -v --timeout 60 $crc
  mv "$KP_RUN/pids/pingsrv-$1.pid" "$KP_RUN/pids/pingsrv.pid"
  wait_for 10 listening "$KP_HOST_PORT"
}

# server_check MODE SIZE: the server ends by itself once the client disconnects; its log must show the
# negotiated CRC mode and the 20 payloads it read from the client by RDMA Read.
host_server_check() {
  mode=$1
  log=$KP_RUN/host/pingsrv-$1.log
  fails=0
  pid=$(cat "$KP_RUN/pids/pingsrv.pid" 2>/dev/null)
  [ -n "$pid" ] && wait_for 20 sh -c "! kill -0 $pid"
  stop pingsrv
  sed 's/^/  /' "$log" | head -4 | cut -c1-100
  echo "  ... $(grep -c '^server ping data: ' "$log") lines of server ping data"
  tail -1 "$log" | sed 's/^/  /'
  grep -q "^accepted .*: MPA CRC $mode," "$log" || {
    echo "FAILED: MPA CRC $mode not reported"
    fails=1
  }
  rping_expect 20 "$2" 'server ping data: ' >"$KP_RUN/host/expect-srv"
  grep '^server ping data: ' "$log" | cmp -s - "$KP_RUN/host/expect-srv" || {
    echo "FAILED: server payloads differ from rping's"
    fails=1
  }
  grep -q 'client disconnected after 20 pings' "$log" || {
    echo "FAILED: server did not see 20 pings and an orderly disconnect"
    fails=1
  }
  return $fails
}

# client MODE SIZE: 20 pings to the guest's rping -s; the output must show the negotiated CRC mode, the
# 20 payloads read back from the guest, and the summary.
host_client() {
  mode=$1
  log=$KP_RUN/host/pingcli-$1.log
  crc=
  [ "$mode" = on ] && crc=--crc
  fails=0
  # shellcheck disable=SC2086 # $crc is empty or one word
  timeout 60 "$IRONSAN" rdma ping "127.0.0.1:$KP_FWD_PORT" --count 20 --size "$2" -v --timeout 20 $crc >"$log" 2>&1
  rc=$?
  sed 's/^/  /' "$log" | head -3 | cut -c1-100
  echo "  ... $(grep -c '^ping data: ' "$log") lines of ping data"
  tail -1 "$log" | sed 's/^/  /'
  [ $rc -eq 0 ] || {
    echo "FAILED: exit status $rc"
    fails=1
  }
  grep -q "^connected to .*: MPA CRC $mode," "$log" || {
    echo "FAILED: MPA CRC $mode not reported"
    fails=1
  }
  rping_expect 20 "$2" 'ping data: ' >"$KP_RUN/host/expect-cli"
  grep '^ping data: ' "$log" | cmp -s - "$KP_RUN/host/expect-cli" || {
    echo "FAILED: payloads differ from rping's"
    fails=1
  }
  grep -q ": 20/20 pings ok, MPA CRC $mode," "$log" || {
    echo "FAILED: no '20/20 pings ok' summary"
    fails=1
  }
  return $fails
}
