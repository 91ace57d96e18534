# Is the guest's network alive? In one CI run (TCG) every check crossing eth0 failed from one
# point on (the host's initiator against LIO, discovery from the guest to the host's target),
# while LIO over the guest's own loopback went on working; the output could not tell a dead
# network from a fault of the peers. These lines tell it, in a failed scenario's log.

# net_probe: a TCP connect to a port nothing on the host listens on ($KP_PROBE_PORT via slirp's
# 10.0.2.2) must be refused within 5 s: the SYN and slirp's reset cross virtio-net both ways.
net_probe() {
  python3 -c '
import socket, sys
try:
    socket.create_connection(("10.0.2.2", int(sys.argv[1])), timeout=5).close()
    print("connected (the probe port is in use)")
except ConnectionRefusedError:
    pass
except OSError as e:
    print(e)
    sys.exit(1)
' "$KP_PROBE_PORT"
}

# net_after_failure: NETWORK lines for a failed scenario's log: whether the network answers,
# and if not, whether taking eth0 down and up (virtio-net refills and rearms its queues)
# brings it back for the scenarios after it.
net_after_failure() {
  if out=$(net_probe 2>&1); then
    echo "NETWORK: alive after the failure (10.0.2.2 answered the probe)"
    return 0
  fi
  echo "NETWORK: dead after the failure: a connect to 10.0.2.2:$KP_PROBE_PORT got '$out', not a refusal"
  ip -s link show eth0 | sed 's/^/NETWORK:   /'
  grep -E '^(MemFree|MemAvailable):' /proc/meminfo | sed 's/^/NETWORK:   /'
  dmesg | grep -i -E 'virtio|allocation failure|oom|eth0' | tail -5 | sed 's/^/NETWORK:   /'
  ip link set eth0 down
  sleep 1
  ip link set eth0 up
  sleep 1
  if out=$(net_probe 2>&1); then
    echo "NETWORK: alive again after eth0 down and up"
  else
    echo "NETWORK: still dead after eth0 down and up ($out)"
  fi
}
