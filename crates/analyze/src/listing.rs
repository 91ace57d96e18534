//! The translation: one readable line per PDU, and the JSON form for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::analysis::{Analysis, Connection};
use crate::iscsi::PduRecord;
use crate::iser::RdmaKind;

fn opt(name: &str, v: Option<u32>) -> String {
    v.map(|v| format!(" {name} {v}")).unwrap_or_default()
}

fn opt_tag(name: &str, v: Option<u32>) -> String {
    match v {
        Some(0xffff_ffff) => String::new(),
        Some(v) => format!(" {name} 0x{v:08x}"),
        None => String::new(),
    }
}

/// One line for a PDU: time, connection, direction, opcode, tags, sequence numbers,
/// offsets/lengths and the decoded CDB or status.
pub fn pdu_line(p: &PduRecord) -> String {
    let mut s = format!(
        "{:>12.6} c{} {} {:<22}",
        p.time,
        p.conn,
        p.dir.arrow(),
        p.name
    );
    s.push_str(&opt_tag("ITT", p.itt));
    s.push_str(&opt_tag("TTT", p.ttt));
    s.push_str(&opt("CmdSN", p.cmd_sn));
    s.push_str(&opt("StatSN", p.stat_sn));
    s.push_str(&opt("ExpStatSN", p.exp_stat_sn));
    s.push_str(&opt("ExpCmdSN", p.exp_cmd_sn));
    s.push_str(&opt("DataSN", p.data_sn));
    if p.data_len > 0 {
        let _ = write!(s, " dlen {}", p.data_len);
    }
    if !p.summary.is_empty() {
        let _ = write!(s, " | {}", p.summary);
    }
    // iSER: the buffers the initiator advertised for the command's data.
    for (name, stag, va) in [
        ("read", p.read_stag, p.read_va),
        ("write", p.write_stag, p.write_va),
    ] {
        if let Some(stag) = stag {
            let _ = write!(
                s,
                " | iSER {name} STag 0x{stag:08x} VA 0x{:x}",
                va.unwrap_or(0)
            );
        }
    }
    if let Some(t) = &p.text {
        if !t.is_empty() {
            let _ = write!(s, " [{}]", t.join(" "));
        }
    }
    s
}

/// The whole listing as text: the PDUs and, on iSER connections, the RDMA operations that
/// moved command data, in time order; then a `note:` line for each thing the analysis left
/// out to stay within its limits.
pub fn text(a: &Analysis) -> String {
    let mut lines: Vec<((u64, u64), String)> = a
        .pdus
        .iter()
        .map(|p| ((p.ts_ns, p.stream_offset), pdu_line(p)))
        .collect();
    lines.extend(rdma_lines(a));
    // By time, then (within one capture time, as FPDUs packed in one segment) by position.
    lines.sort_by_key(|(at, _)| *at);
    let mut out = String::new();
    for (_, line) in lines {
        out.push_str(&line);
        out.push('\n');
    }
    for n in &a.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// One line per RDMA Write (its segments to one STag in a row taken together) and per RDMA
/// Read Request, with the command whose iSER header named the STag.
fn rdma_lines(a: &Analysis) -> Vec<((u64, u64), String)> {
    let mut out = Vec::new();
    for c in &a.connections {
        // The last command on this connection that named each STag, up to a time.
        let mut named: Vec<(u64, u32, u32)> = Vec::new(); // (ts, stag, itt)
        for p in a.pdus.iter().filter(|p| p.conn == c.id) {
            for stag in [p.read_stag, p.write_stag].into_iter().flatten() {
                named.push((p.ts_ns, stag, p.itt.unwrap_or(0)));
            }
        }
        let itt_of = |stag: u32, ts: u64| {
            named
                .iter()
                .rev()
                .find(|(t, s, _)| *s == stag && *t <= ts)
                .map(|(_, _, itt)| *itt)
        };
        // Read Responses carry the target's STag, not a command's: the Read Request stands
        // for them.
        let ops: Vec<_> = c
            .rdma
            .iter()
            .filter(|x| x.kind != RdmaKind::ReadResponse)
            .collect();
        let mut i = 0;
        while i < ops.len() {
            let x = *ops[i];
            let (mut bytes, mut segments) = (x.bytes, 1);
            if x.kind == RdmaKind::Write {
                while let Some(n) = ops.get(i + segments) {
                    if n.kind != RdmaKind::Write || n.stag != x.stag {
                        break;
                    }
                    bytes += n.bytes;
                    segments += 1;
                }
            }
            i += segments;
            let what = match x.kind {
                RdmaKind::Write if segments == 1 => format!("{bytes} bytes in 1 segment"),
                RdmaKind::Write => format!("{bytes} bytes in {segments} segments"),
                RdmaKind::ReadRequest | RdmaKind::ReadResponse => {
                    format!("{bytes} bytes asked for")
                }
            };
            let name = match x.kind {
                RdmaKind::Write => "RDMA Write",
                RdmaKind::ReadRequest | RdmaKind::ReadResponse => "RDMA Read Request",
            };
            let mut line = format!(
                "{:>12.6} c{} T->I {:<22} STag 0x{:08x} {what}",
                x.ts_ns.saturating_sub(a.start_ns) as f64 / 1e9,
                c.id,
                name,
                x.stag
            );
            if let Some(itt) = itt_of(x.stag, x.ts_ns) {
                let _ = write!(line, " | for ITT 0x{itt:08x}");
            }
            out.push(((x.ts_ns, x.stream_offset), line));
        }
    }
    out
}

/// PDU counts per opcode name, in opcode order.
pub fn opcode_counts(a: &Analysis) -> BTreeMap<u8, (String, usize)> {
    let mut m: BTreeMap<u8, (String, usize)> = BTreeMap::new();
    for p in &a.pdus {
        m.entry(p.opcode)
            .or_insert_with(|| (p.name.to_string(), 0))
            .1 += 1;
    }
    m
}

/// The JSON document's listing part: `{"frames", "tcp_segments", "connections",
/// "opcode_counts", "pdus"}`, serialized straight to its writer. It was built as a
/// `serde_json::Value` first: a tree of maps many times the size of the text for a large
/// capture, and most of what `ironsan analyze --json` cost (fuzzing's profile showed it).
#[derive(Serialize)]
pub struct JsonListing<'a> {
    pub frames: u64,
    pub tcp_segments: u64,
    pub connections: &'a [Connection],
    /// PDUs per opcode, keyed `0xNN`.
    pub opcode_counts: BTreeMap<String, usize>,
    pub pdus: &'a [PduRecord],
    /// What the analysis left out to stay within its limits (absent when nothing).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub notes: &'a [String],
}

/// The listing part of the JSON document (see [`JsonListing`]).
pub fn json(a: &Analysis) -> JsonListing<'_> {
    JsonListing {
        frames: a.frames,
        tcp_segments: a.tcp_segments,
        connections: &a.connections,
        opcode_counts: opcode_counts(a)
            .into_iter()
            .map(|(op, (_, n))| (format!("0x{op:02x}"), n))
            .collect(),
        pdus: &a.pdus,
        notes: &a.notes,
    }
}
