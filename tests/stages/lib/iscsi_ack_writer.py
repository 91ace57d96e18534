#!/usr/bin/env python3
"""Writes numbered 4 KiB blocks to LUN 1 of a target until the connection drops (the target
is killed) or COUNT blocks are written, and prints each block whose write is acknowledged
as durable: even blocks are WRITE(10) with FUA ("fua N" once the status is GOOD), odd blocks a
plain WRITE(10) followed by SYNCHRONIZE CACHE(10) ("sync N" once the SYNCHRONIZE CACHE is GOOD).
Block N lies at byte N * 4096 and holds struct.pack(">I", N) repeated (see `expected`).

Usage: iscsi_ack_writer.py PORT TARGET-IQN COUNT
"""
import socket
import struct
import sys

BLOCK = 4096


def expected(n):
    return struct.pack(">I", n) * (BLOCK // 4)


def main():
    port, iqn, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    s = socket.create_connection(("127.0.0.1", port), timeout=30)

    def send(bhs, data=b""):
        s.sendall(bhs + data + b"\0" * ((-len(data)) % 4))

    def recv_exact(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise ConnectionError("connection closed")
            b += c
        return b

    def recv_pdu():
        bhs = recv_exact(48)
        dlen = int.from_bytes(bhs[5:8], "big")
        return bhs, recv_exact(dlen + ((-dlen) % 4))[:dlen]

    def keys(d):
        return b"".join(k.encode() + b"=" + v.encode() + b"\0" for k, v in d.items())

    isid = bytes([0x80, 0, 0, 0, 0x67, 0x01])
    k = keys({"InitiatorName": "iqn.2026-11.org.ironsan.test:ack-writer", "TargetName": iqn,
              "SessionType": "Normal", "AuthMethod": "None"})
    bhs = bytearray(48); bhs[0] = 0x43; bhs[1] = 0x81
    bhs[5:8] = len(k).to_bytes(3, "big"); bhs[8:14] = isid; bhs[16:20] = (1).to_bytes(4, "big")
    send(bytes(bhs), k)
    r, _ = recv_pdu()
    assert r[0] & 0x3F == 0x23 and r[36] == 0, ("login (security)", r[36:38].hex())
    k = keys({"HeaderDigest": "None", "DataDigest": "None", "ImmediateData": "Yes", "InitialR2T": "No",
              "MaxRecvDataSegmentLength": "65536", "MaxBurstLength": "262144", "FirstBurstLength": "65536",
              "MaxConnections": "1", "ErrorRecoveryLevel": "0", "DefaultTime2Wait": "0",
              "DefaultTime2Retain": "0", "MaxOutstandingR2T": "1", "DataPDUInOrder": "Yes",
              "DataSequenceInOrder": "Yes"})
    bhs = bytearray(48); bhs[0] = 0x43; bhs[1] = 0x80 | (1 << 2) | 3
    bhs[5:8] = len(k).to_bytes(3, "big"); bhs[8:14] = isid; bhs[16:20] = (1).to_bytes(4, "big")
    bhs[14:16] = r[14:16]
    send(bytes(bhs), k)
    r, d = recv_pdu()
    assert r[0] & 0x3F == 0x23 and r[36] == 0 and r[1] & 0x80, ("login (operational)", r[36:38].hex())
    params = dict(x.split("=", 1) for x in d.decode().split("\0") if "=" in x)
    immediate = params.get("ImmediateData") == "Yes"
    statsn = int.from_bytes(r[24:28], "big")
    cmdsn, itt = int.from_bytes(r[28:32], "big"), 0

    def scsi(cdb, data=b""):
        nonlocal cmdsn, itt, statsn
        itt += 1
        bhs = bytearray(48); bhs[0] = 0x01; bhs[1] = 0x80 | (0x20 if data else 0) | 1
        bhs[8:16] = (1 << 48).to_bytes(8, "big")
        bhs[16:20] = itt.to_bytes(4, "big"); bhs[20:24] = len(data).to_bytes(4, "big")
        bhs[24:28] = cmdsn.to_bytes(4, "big"); bhs[28:32] = (statsn + 1).to_bytes(4, "big")
        bhs[32:32 + len(cdb)] = cdb
        imm = data if immediate else b""
        bhs[5:8] = len(imm).to_bytes(3, "big")
        send(bytes(bhs), imm)
        cmdsn += 1
        while True:
            r, _ = recv_pdu()
            op = r[0] & 0x3F
            if op == 0x31:  # R2T: send what it asks for in one Data-Out
                off, length = int.from_bytes(r[40:44], "big"), int.from_bytes(r[44:48], "big")
                o = bytearray(48); o[0] = 0x05; o[1] = 0x80
                o[5:8] = length.to_bytes(3, "big"); o[8:16] = (1 << 48).to_bytes(8, "big")
                o[16:20] = itt.to_bytes(4, "big"); o[20:24] = r[20:24]
                o[28:32] = (statsn + 1).to_bytes(4, "big"); o[40:44] = off.to_bytes(4, "big")
                send(bytes(o), data[off:off + length])
            elif op == 0x21:
                statsn = int.from_bytes(r[24:28], "big")
                return r[3]
            elif op == 0x20:
                continue
            else:
                raise SystemExit(f"unexpected PDU opcode {op:#x}")

    def cdb10(op, lba, blocks, flags=0):
        return bytes([op, flags]) + lba.to_bytes(4, "big") + b"\0" + blocks.to_bytes(2, "big") + b"\0"

    try:
        for n in range(count):
            lba = n * (BLOCK // 512)
            if n % 2 == 0:
                st = scsi(cdb10(0x2A, lba, BLOCK // 512, 0x08), expected(n))
                if st != 0:
                    print(f"status {st} for FUA write {n}", flush=True)
                    break
                print(f"fua {n}", flush=True)
            else:
                st = scsi(cdb10(0x2A, lba, BLOCK // 512), expected(n))
                if st != 0:
                    print(f"status {st} for write {n}", flush=True)
                    break
                st = scsi(cdb10(0x35, 0, 0))
                if st != 0:
                    print(f"status {st} for SYNCHRONIZE CACHE after {n}", flush=True)
                    break
                print(f"sync {n}", flush=True)
    except (ConnectionError, OSError) as e:
        print(f"connection lost: {e}", flush=True)


if __name__ == "__main__":
    main()
