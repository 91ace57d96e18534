#!/usr/bin/env python3
"""Hostile clients on an iWARP listening port, held while a real client logs in.

Usage: hostile.py HOST PORT IDLE SECONDS

Opens IDLE connections that never send a byte, port probes (connect and close, connect and
reset), a client that sends 64 bytes that are no MPA Request, one whose Request has an unknown
revision, one that sends a valid Request a byte every half second, and one whose valid Request
(iSER CM private data) is followed by silence. Prints "ready" once all are in place, holds them
for SECONDS, then closes everything and prints one summary line. Exits 0 unless the connections
could not be made at all.
"""
import resource
import socket
import struct
import sys
import threading
import time

host, port, idle, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, idle + 256)), hard))


def mpa_request(revision, private_data):
    # RFC 5044: key, flags (no marker, no CRC), revision, private data length.
    return b"MPA ID Req Frame" + struct.pack(">BBH", 0, revision, len(private_data)) + private_data


def connect():
    s = socket.create_connection((host, port), timeout=5)
    s.settimeout(None)
    return s


held = []
made = 0
for _ in range(idle):
    try:
        held.append(connect())
        made += 1
    except OSError as e:
        print(f"idle connection {made + 1}: {e}")
        break
for i in range(20):
    try:
        s = connect()
        if i % 2:
            # SO_LINGER 0: close with a reset.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError as e:
        print(f"probe {i}: {e}")
specials = {
    "junk": bytes(range(64)),
    "bad revision": mpa_request(9, b""),
    "valid Request, then silence": mpa_request(1, bytes([0xC0, 0, 0, 0])),
}
for name, data in specials.items():
    try:
        s = connect()
        s.sendall(data)
        held.append(s)
    except OSError as e:
        print(f"{name}: {e}")

stop = threading.Event()


def trickle():
    try:
        s = connect()
    except OSError as e:
        print(f"trickle: {e}")
        return
    for b in mpa_request(1, bytes([0xC0, 0, 0, 0])):
        if stop.wait(0.5):
            break
        try:
            s.send(bytes([b]))
        except OSError:
            break
    stop.wait()
    s.close()


t = threading.Thread(target=trickle)
t.start()
print(f"ready: {made} idle connections, 20 probes, {len(specials)} bad or silent MPA clients, 1 trickling", flush=True)
time.sleep(seconds)
stop.set()
t.join()
# A connection the far side has closed reads as EOF (or a reset) without blocking.
closed = 0
for s in held:
    s.setblocking(False)
    try:
        if s.recv(4096) == b"":
            closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
    s.close()
print(f"done: held {len(held)} connections for {seconds:.0f} s, {closed} closed by the listener")
sys.exit(0 if made > 0 else 1)
