#!/usr/bin/env python3
"""Checks a capture of an iSER session served by ironsan, decoded by tshark (an independent decoder).

Usage: iser-capture-check.py PCAP TARGET_PORT [--ironsan BIN --write-bytes N --read-bytes N]

tshark's iwarp_mpa / iwarp_ddp_rdmap dissectors decode the FPDUs; the iSER header and the BHS in
each Send are read from the Send's payload as tshark extracts it. Checks:
  - no frame from the target that tshark calls malformed or an error (the initiator's frames,
    re-cut by qemu, are counted, not judged);
  - every payload segment the target sends on an iSER connection decodes as MPA (FPDUs aligned
    with segments), TCP retransmissions and capture reordering aside;
  - the target sends no R2T and no Data-In PDU: read data goes as RDMA Writes, write data is
    fetched with RDMA Read Requests;
  - each RDMA Write and each Read Request names an STag that a later SCSI Response invalidates;
  - each SCSI Response to a command that advertised an STag is a Send with Invalidate of that
    STag (commands matched by ITT where tshark decoded them: the initiator's segments reach the
    capture through qemu's user-mode network, which re-segments them);
  - with --ironsan: `ironsan analyze --json` counts exactly --write-bytes of WRITE data and
    between --read-bytes and --read-bytes + 1 MiB of READ data (the kernel reads a few blocks
    at attach).
Prints one summary line; exits 1 with the reasons on failure.
"""
import argparse
import json
import subprocess
import sys

# Debian 12's tshark tries its RPC-over-RDMA heuristic on every iWARP Send and calls the
# iSER payloads it cannot parse "malformed"; it has no iSER heuristic for iWARP.
TSHARK = ["tshark", "--disable-heuristic", "rpcrdma_iwarp"]
FIELDS = [
    "frame.number", "tcp.stream", "tcp.srcport", "tcp.len", "tcp.analysis.flags",
    "iwarp_mpa.ulpdulength", "iwarp_mpa.key.req", "iwarp_mpa.key.rep", "iwarp_rdma.opcode", "iwarp_ddp.stag",
    "iwarp_rdma.inval_stag", "iwarp_rdma.srcstag", "data.data",
]
SEND, SEND_INV, WRITE, READ_REQ = 3, 4, 0, 1
SCSI_CMD, SCSI_RSP, DATA_IN, R2T = 0x01, 0x21, 0x25, 0x31


def tshark_rows(pcap, display_filter=None):
    cmd = TSHARK + ["-r", pcap, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=;"]
    if display_filter:
        cmd += ["-Y", display_filter]
    for f in FIELDS:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        row = line.split("\t")
        row += [""] * (len(FIELDS) - len(row))
        yield dict(zip(FIELDS, row))


def ints(field):
    return [int(v, 0) for v in field.split(";") if v]


def iser_pdu(hexdata):
    """(write STag or None, read STag or None, BHS opcode, ITT) of one Send's payload."""
    b = bytes.fromhex(hexdata)
    if len(b) < 28 + 48:
        return None
    flags = b[0]
    wstag = int.from_bytes(b[4:8], "big") if flags & 0x08 else None
    rstag = int.from_bytes(b[16:20], "big") if flags & 0x04 else None
    bhs = b[28:]
    return wstag, rstag, bhs[0] & 0x3F, int.from_bytes(bhs[16:20], "big")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pcap")
    ap.add_argument("port", type=int)
    ap.add_argument("--ironsan")
    ap.add_argument("--write-bytes", type=int)
    ap.add_argument("--read-bytes", type=int)
    a = ap.parse_args()
    problems = []

    # Only the target's frames are judged: the initiator's reach the capture through qemu's
    # user-mode network, which re-cuts the stream, and tshark's MPA dissector takes a segment
    # that starts mid-FPDU for a malformed FPDU (seen once in a long run: an initiator frame
    # of 1456 bytes read as an Atomic Request).
    broken = "(_ws.malformed || _ws.expert.severity == error)"
    bad = list(tshark_rows(a.pcap, f"{broken} && tcp.srcport == {a.port}"))
    if bad:
        problems.append(f"{len(bad)} target frames malformed or in error, first {bad[0]['frame.number']}")
    recut = list(tshark_rows(a.pcap, f"{broken} && tcp.srcport != {a.port}"))

    rows = list(tshark_rows(a.pcap, "tcp.len > 0"))
    iwarp_streams = {r["tcp.stream"] for r in rows if r["iwarp_mpa.key.req"]}
    commands = {}  # ITT -> (write STag, read STag) of the latest command with that ITT
    invalidated = set()
    named = []  # (frame, op, STag) of RDMA Writes and Read Requests
    counts = {"target segments": 0, "unaligned": 0, "writes": 0, "read requests": 0,
              "responses": 0, "matched": 0, "sends from initiator": 0}
    for r in rows:
        if r["tcp.stream"] not in iwarp_streams:
            continue
        from_target = int(r["tcp.srcport"]) == a.port
        ops = ints(r["iwarp_rdma.opcode"])
        if from_target:
            counts["target segments"] += 1
            framed = r["iwarp_mpa.ulpdulength"] or r["iwarp_mpa.key.rep"]
            if not framed and not r["tcp.analysis.flags"]:
                counts["unaligned"] += 1
                problems.append(f"frame {r['frame.number']}: a target segment that is not an FPDU")
            if len(ops) > 1:
                problems.append(f"frame {r['frame.number']}: {len(ops)} FPDUs in one target segment")
        if len(ops) != 1 or (not from_target and r["tcp.analysis.flags"]):
            # An initiator segment re-cut by qemu, or a retransmission (whose command, if
            # decoded, would be noted again after its response): not decoded. The
            # commands it carried may reuse ITTs of commands noted before, so what is noted is
            # no longer known to be the latest: forget it rather than check against it.
            if not from_target:
                commands.clear()
            continue
        op = ops[0]
        if from_target and op in (WRITE, READ_REQ):
            field = "iwarp_ddp.stag" if op == WRITE else "iwarp_rdma.srcstag"
            stags = ints(r[field])
            if stags:
                named.append((r["frame.number"], op, stags[0]))
            counts["writes" if op == WRITE else "read requests"] += 1
        if op not in (SEND, SEND_INV) or not r["data.data"]:
            continue
        pdu = iser_pdu(r["data.data"].split(";")[0])
        if pdu is None:
            continue
        wstag, rstag, opcode, itt = pdu
        if not from_target:
            counts["sends from initiator"] += 1
            if opcode == SCSI_CMD:
                commands[itt] = (wstag, rstag)
            continue
        if opcode in (DATA_IN, R2T):
            problems.append(f"frame {r['frame.number']}: the target sent a {'Data-In' if opcode == DATA_IN else 'R2T'} PDU")
        if op == SEND_INV:
            invalidated.update(ints(r["iwarp_rdma.inval_stag"]))
        if opcode != SCSI_RSP:
            continue
        counts["responses"] += 1
        cmd = commands.pop(itt, None)
        if cmd is None:
            continue
        want = cmd[1] if cmd[1] is not None else cmd[0]
        got = ints(r["iwarp_rdma.inval_stag"]) if op == SEND_INV else []
        if want is None and op == SEND:
            counts["matched"] += 1
        elif want is not None and got == [want]:
            counts["matched"] += 1
        else:
            problems.append(f"frame {r['frame.number']}: response to ITT {itt:#x} invalidates {got}, the command advertised {want:#x}" if want is not None else f"frame {r['frame.number']}: response to ITT {itt:#x} invalidates {got} but the command had no STag")
    for frame, op, stag in named:
        if stag not in invalidated:
            problems.append(f"frame {frame}: {'RDMA Write' if op == WRITE else 'Read Request'} to STag {stag:#x}, which no response invalidates")
    if counts["writes"] == 0 or counts["read requests"] == 0:
        problems.append(f"expected RDMA Writes and Read Requests, saw {counts['writes']} and {counts['read requests']}")
    if counts["responses"] == 0 or counts["matched"] < counts["responses"] // 2:
        problems.append(f"only {counts['matched']} of {counts['responses']} responses matched to their command")

    if a.ironsan and (a.write_bytes is not None or a.read_bytes is not None):
        out = subprocess.run([a.ironsan, "analyze", "--json", "--port", str(a.port), a.pcap],
                             capture_output=True, text=True, check=True).stdout
        cmds = json.loads(out)["commands"]
        wrote = sum(c["data_out_bytes"] for c in cmds if c["cdb"].startswith("WRITE"))
        read = sum(c["data_in_bytes"] for c in cmds if c["cdb"].startswith("READ("))
        counts["analyze write bytes"], counts["analyze read bytes"] = wrote, read
        if a.write_bytes is not None and wrote != a.write_bytes:
            problems.append(f"ironsan analyze counts {wrote} WRITE bytes, dd wrote {a.write_bytes}")
        if a.read_bytes is not None and not a.read_bytes <= read <= a.read_bytes + (1 << 20):
            problems.append(f"ironsan analyze counts {read} READ bytes, dd read {a.read_bytes}")

    counts["initiator frames tshark could not frame (re-cut by qemu)"] = len(recut)
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    if problems:
        print(f"FAIL: {a.pcap}: {summary}")
        for p in problems[:20]:
            print("  " + p)
        sys.exit(1)
    print(f"tshark agrees: {summary}")


if __name__ == "__main__":
    main()
