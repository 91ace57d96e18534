//! The translation: one readable line per PDU, and the JSON form for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::analysis::Analysis;
use crate::iscsi::PduRecord;

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
    if let Some(t) = &p.text {
        if !t.is_empty() {
            let _ = write!(s, " [{}]", t.join(" "));
        }
    }
    s
}

/// The whole listing as text.
pub fn text(a: &Analysis) -> String {
    let mut out = String::new();
    for p in &a.pdus {
        out.push_str(&pdu_line(p));
        out.push('\n');
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

/// The JSON document: `{"pdus": [...], "connections": [...], "opcode_counts": {...}}`.
pub fn json(a: &Analysis) -> Value {
    let counts: serde_json::Map<String, Value> = opcode_counts(a)
        .into_iter()
        .map(|(op, (_, n))| (format!("0x{op:02x}"), json!(n)))
        .collect();
    json!({
        "frames": a.frames,
        "tcp_segments": a.tcp_segments,
        "connections": a.connections,
        "opcode_counts": counts,
        "pdus": a.pdus,
    })
}
