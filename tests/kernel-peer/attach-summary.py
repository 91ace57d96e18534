#!/usr/bin/env python3
"""What an iSCSI initiator sent at attach time, decoded by tshark.

Usage: attach-summary.py PCAP [PORT] [--until SECONDS]

Reads a capture of one target port (e.g. target/kernel-peer/host/basic-tgtd.pcap from
`KP_CAPTURE=1 tests/kernel-peer/run.sh kinit-basic@tgtd`), has tshark decode it as iSCSI, and
prints: the keys of every Login/Text request and response, then each distinct SCSI command the
initiator sent in the first SECONDS (default 5) from the first SCSI command — opcode, the CDB fields
that select what is asked (VPD page, mode page, service action, REPORT SUPPORTED OPERATION CODES
options), allocation length, how often, and the status the target gave.
"""
import json
import subprocess
import sys
from collections import OrderedDict

FIELDS = [
    "frame.number", "frame.time_relative", "tcp.srcport", "iscsi.opcode",
    "iscsi.initiatortasktag", "iscsi.keyvalue", "iscsi.login.csg", "iscsi.login.nsg",
    "scsi.lun", "scsi.spc.opcode", "scsi_sbc.opcode", "scsi_sbc.sa", "scsi.inquiry.flags",
    "scsi.inquiry.evpd.pagecode", "scsi.mode.sbc.pagecode", "scsi.mode.spc.pagecode",
    "scsi.mode.pc", "scsi.mode.flags", "scsi.mpi.service_action", "scsi.report_opcodes.options",
    "scsi.report_opcodes.requested_operation_code",
    "scsi.report_opcodes.requested_service_action", "scsi.spc.select_report",
    "scsi.cdb.alloclen", "scsi.cdb.alloclen16", "scsi.cdb.alloclen32", "scsi_sbc.alloclen16",
    "scsi_sbc.alloclen32", "scsi.status", "iscsi.scsiresponse.status", "scsi.sns.key",
    "scsi.sns.asc", "scsi.sns.ascq",
]


def tshark_rows(pcap, port):
    cmd = ["tshark", "-r", pcap, "-d", f"tcp.port=={port},iscsi", "-Y", "iscsi", "-T", "json"]
    for f in FIELDS:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [p["_source"]["layers"] for p in json.loads(out or "[]")]


def first(row, *names):
    for n in names:
        v = row.get(n)
        if v:
            return v[0]
    return None


def main():
    args = [a for a in sys.argv[1:]]
    until = 5.0
    if "--until" in args:
        i = args.index("--until")
        until = float(args[i + 1])
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    pcap = args[0]
    if len(args) > 1:
        port = args[1]
    else:
        port = subprocess.run(
            ["tshark", "-r", pcap, "-c", "1", "-T", "fields", "-e", "tcp.dstport"],
            capture_output=True, text=True, check=True).stdout.split()[0]
    rows = tshark_rows(pcap, port)

    print(f"== login / text keys (target port {port})")
    t_login = None
    for r in rows:
        ops = r.get("iscsi.opcode", [])
        keys = r.get("iscsi.keyvalue", [])
        for op in ops:
            op = int(op, 16) if op.startswith("0x") else int(op)
            if op in (0x03, 0x04, 0x23, 0x24) and keys:
                name = {0x03: "Login Request", 0x04: "Text Request", 0x23: "Login Response",
                        0x24: "Text Response"}[op]
                stage = ""
                if op in (0x03, 0x23):
                    stage = f" CSG={first(r, 'iscsi.login.csg')} NSG={first(r, 'iscsi.login.nsg')}"
                print(f"  #{first(r, 'frame.number')} {name}{stage}: " + " ".join(keys))
            if op == 0x01 and t_login is None:
                t_login = float(first(r, "frame.time_relative"))
    if t_login is None:
        t_login = 0.0

    print(f"== SCSI commands in the first {until:g} s from the first one")
    cmds = OrderedDict()
    pending = {}
    for r in rows:
        t = float(first(r, "frame.time_relative"))
        ops = [int(o, 16) if o.startswith("0x") else int(o) for o in r.get("iscsi.opcode", [])]
        if 0x01 in ops and t_login <= t <= t_login + until:
            op = first(r, "scsi.spc.opcode", "scsi_sbc.opcode")
            op = int(op, 16) if op and op.startswith("0x") else (int(op) if op else None)
            detail = []
            for label, field in (("evpd_page", "scsi.inquiry.evpd.pagecode"),
                                 ("mode_page", "scsi.mode.sbc.pagecode"),
                                 ("mode_page", "scsi.mode.spc.pagecode"),
                                 ("pc", "scsi.mode.pc"),
                                 ("sa", "scsi.mpi.service_action"), ("sa", "scsi_sbc.sa"),
                                 ("rsoc_options", "scsi.report_opcodes.options"),
                                 ("rsoc_op", "scsi.report_opcodes.requested_operation_code"),
                                 ("rsoc_sa", "scsi.report_opcodes.requested_service_action"),
                                 ("select_report", "scsi.spc.select_report")):
                v = first(r, field)
                if v is not None and f"{label}={v}" not in detail:
                    if label == "evpd_page" and not int(first(r, "scsi.inquiry.flags") or "0", 0) & 1:
                        continue
                    detail.append(f"{label}={v}")
            alloc = first(r, "scsi.cdb.alloclen16", "scsi.cdb.alloclen32", "scsi.cdb.alloclen",
                          "scsi_sbc.alloclen16", "scsi_sbc.alloclen32")
            lun = first(r, "scsi.lun")
            key = (op, tuple(detail))
            e = cmds.setdefault(key, {"count": 0, "allocs": set(), "luns": set(), "status": set()})
            e["count"] += 1
            if alloc:
                e["allocs"].add(alloc)
            if lun:
                e["luns"].add(lun)
            itt = first(r, "iscsi.initiatortasktag")
            if itt:
                pending[itt] = key
        status = first(r, "iscsi.scsiresponse.status", "scsi.status")
        itt = first(r, "iscsi.initiatortasktag")
        if status is not None and itt in pending and (0x21 in ops or 0x25 in ops):
            s = status
            sk = first(r, "scsi.sns.key")
            if sk:
                s += f" sense={sk}/{first(r, 'scsi.sns.asc')}/{first(r, 'scsi.sns.ascq')}"
            cmds[pending.pop(itt)]["status"].add(s)
    names = opcode_names()
    for (op, detail), e in cmds.items():
        name = names.get(op, "?")
        print(f"  0x{op:02x} {name:<34} {' '.join(detail):<34} x{e['count']:<3} "
              f"alloc={','.join(sorted(e['allocs'])) or '-'} lun={','.join(sorted(e['luns']))} "
              f"status={','.join(sorted(e['status'])) or '?'}")


def opcode_names():
    return {
        0x00: "TEST UNIT READY", 0x03: "REQUEST SENSE", 0x12: "INQUIRY", 0x1a: "MODE SENSE(6)",
        0x5a: "MODE SENSE(10)", 0x25: "READ CAPACITY(10)", 0x9e: "SERVICE ACTION IN(16)",
        0xa0: "REPORT LUNS", 0xa3: "MAINTENANCE IN (REPORT SUPPORTED OPCODES)",
        0x28: "READ(10)", 0x88: "READ(16)", 0x2a: "WRITE(10)", 0x8a: "WRITE(16)",
        0x35: "SYNCHRONIZE CACHE(10)", 0x91: "SYNCHRONIZE CACHE(16)", 0x1e: "PREVENT ALLOW",
        0x4d: "LOG SENSE", 0x42: "UNMAP", 0x93: "WRITE SAME(16)", 0x41: "WRITE SAME(10)",
        0x1b: "START STOP UNIT", 0x37: "READ DEFECT DATA(10)", 0x5e: "PERSISTENT RESERVE IN",
    }


if __name__ == "__main__":
    main()
