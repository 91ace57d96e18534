#!/usr/bin/env python3
"""A real long link between two network namespaces, without sch_netem: two TUN devices, one
moved into each namespace as a point-to-point link (10.77.0.1 <-> 10.77.0.2), and this process
in between holding every IP packet for DELAY_MS before passing it on. TCP on either side then
sees a real round trip of 2 x DELAY_MS, with its own windows, acknowledgements and congestion
control (the user-space delay proxy only stretches the time between two loopback hops).

Usage: tun-delay.py NS_A NS_B DELAY_MS SECONDS
Prints "ready" once both ends are up; exits after SECONDS.
"""
import fcntl
import heapq
import os
import select
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def run(*args):
    subprocess.run(args, check=True)


def main():
    ns_a, ns_b, delay_ms, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    ends = {}
    for ns, dev, me, peer in ((ns_a, "tunA", "10.77.0.1", "10.77.0.2"),
                              (ns_b, "tunB", "10.77.0.2", "10.77.0.1")):
        ends[dev] = tun(dev)
        run("ip", "link", "set", dev, "netns", ns)
        run("ip", "-n", ns, "addr", "add", me, "peer", peer, "dev", dev)
        run("ip", "-n", ns, "link", "set", dev, "mtu", "9000", "up")
    a, b = ends["tunA"], ends["tunB"]
    other = {a: b, b: a}
    delay = delay_ms / 1000.0
    print("ready", flush=True)
    end = time.monotonic() + seconds
    queue = []  # (due, seq, fd, packet)
    seq = 0
    while True:
        now = time.monotonic()
        if now >= end:
            return
        while queue and queue[0][0] <= now:
            _, _, fd, packet = heapq.heappop(queue)
            try:
                os.write(fd, packet)
            except OSError:
                pass  # the namespace is going away
        wait = min(end - now, queue[0][0] - now if queue else 0.05)
        readable, _, _ = select.select([a, b], [], [], max(wait, 0))
        for fd in readable:
            # Drain what is there: one select per packet would cost more than the packet.
            for _ in range(256):
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                seq += 1
                heapq.heappush(queue, (time.monotonic() + delay, seq, other[fd], packet))


if __name__ == "__main__":
    main()
