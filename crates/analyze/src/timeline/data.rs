//! The data a timeline page embeds, as compact JSON columns: per connection its two PDU
//! lanes (times in µs since the capture start, durations, colour category, data bytes, and
//! each PDU's listing line packed as a template plus numbers), its commands (start, duration,
//! row, kind, details), RDMA transfers, bytes in flight and advertised window per data
//! segment, TCP events, and TCP_INFO samples when given. Arrays that grow (times, indexes,
//! the numbers of the listing lines) are stored as differences from the previous element so
//! that a million PDUs stay within tens of MB; the page's script undoes the differences.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::analysis::{Analysis, Connection};
use crate::iscsi::Dir;
use crate::iser::RdmaKind;
use crate::listing::pdu_line;
use crate::stats::{CommandStat, StatsOptions};
use crate::tcp::TcpEventKind;
use crate::tcpinfo::TcpSample;
use crate::window::flight_series;

/// Above this many PDUs in one pixel column of a lane the page draws the column's count
/// (density) instead of each PDU.
pub const AGGREGATE_ABOVE: usize = 3;
/// Rows of the command lane: concurrent commands are stacked, the rest share rows.
pub const MAX_COMMAND_ROWS: usize = 12;

/// Colour categories of PDUs: legend label and colour; a PDU's `k` column is the index.
pub const CATEGORIES: [(&str, &str); 7] = [
    ("SCSI Command", "#4e79a7"),
    ("Data-In / Data-Out", "#59a14f"),
    ("SCSI Response", "#f28e2b"),
    ("R2T", "#b07aa1"),
    ("Login / Text / Logout", "#9c755f"),
    ("Reject", "#e15759"),
    ("NOP / task management / other", "#bab0ac"),
];

/// The colour category of an opcode (index into [`CATEGORIES`]).
pub fn category(opcode: u8) -> u8 {
    match opcode {
        0x01 => 0,
        0x05 | 0x25 => 1,
        0x21 => 2,
        0x31 => 3,
        0x03 | 0x23 | 0x04 | 0x24 | 0x06 | 0x26 => 4,
        0x3f => 5,
        _ => 6,
    }
}

/// TCP event kinds in the order of the page's `ev` kind column.
pub const EVENT_KINDS: [TcpEventKind; 4] = [
    TcpEventKind::Retransmission,
    TcpEventKind::LostRetransmitted,
    TcpEventKind::OutOfOrder,
    TcpEventKind::Unrecovered,
];

/// Placeholders in templates: a decimal number, and a hex number followed by its width
/// (as the character '0' + width). Control characters never appear in listing lines.
const NUM: char = '\u{1}';
const HEX: char = '\u{2}';

/// Splits a line into a template and the numbers in it. Only numbers that start a word (after
/// a space) are taken out, so names such as READ(10) stay in the template; numbers that a
/// JavaScript double cannot hold exactly, or with leading zeros, stay literal.
pub(crate) fn split(line: &str) -> (String, Vec<u64>) {
    let clean;
    let line = if line.contains([NUM, HEX]) {
        clean = line.replace([NUM, HEX], "\u{fffd}");
        &clean
    } else {
        line
    };
    let b = line.as_bytes();
    let mut tpl = String::with_capacity(line.len());
    let mut nums = Vec::new();
    let (mut i, mut lit) = (0, 0);
    let word_end = |j: usize| {
        !b.get(j)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    };
    while i < b.len() {
        if (i == 0 || b[i - 1] == b' ') && b[i].is_ascii_digit() {
            if b[i] == b'0' && b.get(i + 1) == Some(&b'x') {
                let mut j = i + 2;
                while j < b.len() && matches!(b[j], b'0'..=b'9' | b'a'..=b'f') {
                    j += 1;
                }
                let width = j - i - 2;
                if (1..=13).contains(&width) && word_end(j) {
                    tpl.push_str(&line[lit..i + 2]);
                    tpl.push(HEX);
                    tpl.push(char::from(b'0' + width as u8));
                    nums.push(u64::from_str_radix(&line[i + 2..j], 16).unwrap_or(0));
                    (i, lit) = (j, j);
                    continue;
                }
            } else {
                let mut j = i;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                let width = j - i;
                if width <= 15 && (width == 1 || b[i] != b'0') && word_end(j) {
                    tpl.push_str(&line[lit..i]);
                    tpl.push(NUM);
                    nums.push(line[i..j].parse().unwrap_or(0));
                    (i, lit) = (j, j);
                    continue;
                }
            }
        }
        i += 1;
    }
    tpl.push_str(&line[lit..]);
    (tpl, nums)
}

/// The templates of one page, shared by all its packed sequences.
#[derive(Default)]
pub(crate) struct Templates {
    ids: HashMap<String, u32>,
    pub(crate) list: Vec<String>,
}

impl Templates {
    fn id(&mut self, tpl: String) -> u32 {
        if let Some(&id) = self.ids.get(&tpl) {
            return id;
        }
        let id = self.list.len() as u32;
        self.list.push(tpl.clone());
        self.ids.insert(tpl, id);
        id
    }
}

/// A sequence of lines packed against [`Templates`]: per line its template id, and its
/// numbers as differences from the same slot of the previous line with that template
/// (sequence numbers and tags then mostly cost a digit or two).
#[derive(Default)]
pub(crate) struct Packed {
    pub(crate) tpl: Vec<u32>,
    pub(crate) nums: Vec<i64>,
    prev: HashMap<u32, Vec<u64>>,
}

impl Packed {
    pub(crate) fn push(&mut self, templates: &mut Templates, line: &str) {
        let (tpl, nums) = split(line);
        let id = templates.id(tpl);
        let prev = self.prev.entry(id).or_insert_with(|| vec![0; nums.len()]);
        for (p, v) in prev.iter_mut().zip(nums) {
            self.nums.push(v as i64 - *p as i64);
            *p = v;
        }
        self.tpl.push(id);
    }
}

/// TCP_INFO samples of one socket, named as in the file they came from (the `conn` column of
/// `ironsan bench --tcp-info`, or the file name `conn-N-PEER` of `ironsan target --tcp-info`).
#[derive(Debug, Clone)]
pub struct TcpInfoTrace {
    pub name: String,
    pub samples: Vec<TcpSample>,
}

/// Where a TCP_INFO trace lands in the capture.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpInfoMatch {
    pub conn: usize,
    /// Capture time (ns, same clock as the frames) of the samples' t = 0.
    pub t0_ns: i64,
    /// How the connection was chosen and the time aligned, for the page.
    pub how: String,
}

/// The accept order (from 1) and peer of `ironsan target --tcp-info`'s file names
/// (`conn-3-127.0.0.1_45678`; the peer may come cut at its last dot).
fn target_file(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("conn-")?;
    let (n, peer) = rest.split_once('-')?;
    Some((n.parse().ok()?, peer))
}

/// `ironsan bench`'s names: `s<session>c<connection>`.
fn bench_index(name: &str) -> Option<(u32, u32)> {
    let (s, c) = name.strip_prefix('s')?.split_once('c')?;
    Some((s.parse().ok()?, c.parse().ok()?))
}

/// The samples' t = 0 in capture time, from the bytes the socket had received at each sample:
/// the capture shows when the connection's payload in `dir` reached that count. A sample is
/// taken after its bytes arrived, so each one bounds the origin from below; the 90th
/// percentile of the bounds is taken (robust to a few segments the capture missed). Returns
/// the origin and the number of samples that gave a bound.
fn align_by_bytes(c: &Connection, dir: Dir, samples: &[TcpSample]) -> Option<(i64, usize)> {
    let mut cum = Vec::new();
    let mut total = 0u64;
    let mut packets: Vec<(u64, u32)> = c
        .packets
        .iter()
        .filter(|p| p.dir == dir)
        .map(|p| (p.ts_ns, p.payload))
        .collect();
    packets.sort_unstable();
    for (ts, len) in &packets {
        total += *len as u64;
        cum.push((total, *ts));
    }
    let mut est: Vec<i64> = Vec::new();
    let mut last = 0u64;
    for s in samples {
        let b = s.info.bytes_received;
        if b > last {
            let i = cum.partition_point(|(n, _)| *n < b);
            if let Some(&(_, ts)) = cum.get(i) {
                est.push(ts as i64 - (s.t * 1e9) as i64);
            }
        }
        last = last.max(b);
    }
    if est.is_empty() {
        return None;
    }
    est.sort_unstable();
    Some((est[(est.len() - 1) * 9 / 10], est.len()))
}

/// Connections that carried a SCSI command, by first frame.
fn scsi_connections(a: &Analysis) -> Vec<usize> {
    let mut v: Vec<&Connection> = a
        .connections
        .iter()
        .filter(|c| a.pdus.iter().any(|p| p.conn == c.id && p.opcode == 0x01))
        .collect();
    v.sort_by_key(|c| c.first_ts_ns);
    v.into_iter().map(|c| c.id).collect()
}

/// Places each trace on a connection of the capture and finds its time origin. TCP_INFO
/// files carry seconds since their sampler started, not wall-clock time, so the origin is
/// aligned by the bytes the socket had received (see [`align_by_bytes`]), and the connection
/// is the candidate on which that aligns the most samples: for a target file (`conn-N-PEER`)
/// the connection from PEER, else any (the N-th accepted preferred on a tie); for bench
/// traces (`sIcJ`) and others the connections that carried SCSI commands (in order for
/// bench). When no bytes moved, t = 0 is the preferred connection's first frame.
pub fn match_tcp_info(a: &Analysis, traces: &[TcpInfoTrace]) -> Vec<Option<TcpInfoMatch>> {
    let scsi = scsi_connections(a);
    let mut bench: Vec<(u32, u32, usize)> = traces
        .iter()
        .enumerate()
        .filter_map(|(i, t)| bench_index(&t.name).map(|(s, c)| (s, c, i)))
        .collect();
    bench.sort_unstable();
    let mut taken: Vec<usize> = Vec::new();
    let mut out = vec![None; traces.len()];
    // Per trace: the connections it may belong to, the one its name prefers, and the
    // direction(s) its socket received.
    let mut by_time: Vec<&Connection> = a.connections.iter().collect();
    by_time.sort_by_key(|c| c.first_ts_ns);
    let all: Vec<usize> = by_time.iter().map(|c| c.id).collect();
    let mut rules: Vec<(Vec<usize>, Option<usize>, &[Dir])> = Vec::new();
    for t in traces {
        rules.push(if let Some((n, peer)) = target_file(&t.name) {
            // The target's socket: it receives what goes to the target.
            let exact: Vec<usize> = a
                .connections
                .iter()
                .filter(|c| c.initiator.to_string().replace([':', '[', ']'], "_") == peer)
                .map(|c| c.id)
                .collect();
            let preferred = exact
                .first()
                .copied()
                .or(all.get(n.wrapping_sub(1)).copied());
            let candidates = if exact.is_empty() { all.clone() } else { exact };
            (candidates, preferred, &[Dir::ToTarget])
        } else if let Some(k) = bench.iter().position(|b| traces[b.2].name == t.name) {
            (scsi.clone(), scsi.get(k).copied(), &[Dir::ToInitiator])
        } else {
            (scsi.clone(), None, &[Dir::ToInitiator, Dir::ToTarget])
        });
    }
    // Every (trace, connection) alignment; the ones aligning the most samples are taken
    // first, the preferred connection winning a tie.
    let mut scores: Vec<(usize, bool, usize, usize, i64)> = Vec::new(); // (n, preferred, trace, conn, t0)
    for (i, (candidates, preferred, dirs)) in rules.iter().enumerate() {
        for &conn in candidates {
            let Some(c) = a.connections.iter().find(|c| c.id == conn) else {
                continue;
            };
            for d in *dirs {
                if let Some((t0, n)) = align_by_bytes(c, *d, &traces[i].samples) {
                    scores.push((n, *preferred == Some(conn), i, conn, t0));
                }
            }
        }
    }
    scores.sort_by(|x, y| (y.0, y.1).cmp(&(x.0, x.1)).then(x.2.cmp(&y.2)));
    for (n, _, i, conn, t0) in scores {
        if out[i].is_none() && !taken.contains(&conn) {
            taken.push(conn);
            out[i] = Some(TcpInfoMatch {
                conn,
                t0_ns: t0,
                how: format!("aligned by bytes received ({n} samples)"),
            });
        }
    }
    for (i, (_, preferred, _)) in rules.iter().enumerate() {
        let free = |c: &usize| !taken.contains(c);
        let fallback = preferred
            .filter(free)
            .or_else(|| rules[i].0.iter().copied().find(free));
        if out[i].is_none() {
            if let Some(c) = fallback.and_then(|p| a.connections.iter().find(|c| c.id == p)) {
                taken.push(c.id);
                out[i] = Some(TcpInfoMatch {
                    conn: c.id,
                    t0_ns: c.first_ts_ns as i64,
                    how: "t = 0 at the connection's first frame (no bytes to align by)".into(),
                });
            }
        }
    }
    out
}

/// Writes `[a,b,...]`.
fn arr<T: std::fmt::Display>(out: &mut String, v: impl IntoIterator<Item = T>) {
    out.push('[');
    for (i, x) in v.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{x}");
    }
    out.push(']');
}

/// Writes `[a,b-a,c-b,...]`.
fn deltas(out: &mut String, v: impl IntoIterator<Item = i64>) {
    let mut prev = 0i64;
    arr(
        out,
        v.into_iter().map(|x| {
            let d = x - prev;
            prev = x;
            d
        }),
    );
}

fn jstr(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Microseconds since the capture start, rounded.
fn us(a: &Analysis, ts_ns: u64) -> i64 {
    ((ts_ns.saturating_sub(a.start_ns) + 500) / 1000) as i64
}

/// A PDU's time in µs exactly as its listing line prints it (`{:.6}` of seconds).
fn listed_us(time: f64) -> i64 {
    format!("{time:.6}").replace('.', "").parse().unwrap_or(0)
}

/// First-fit rows for commands sorted by start: a command takes the first row free at its
/// start; with all rows busy, the one that frees first.
fn command_rows(spans: &[(i64, i64)]) -> (Vec<usize>, usize) {
    let mut ends: Vec<i64> = Vec::new();
    let rows = spans
        .iter()
        .map(|&(s, e)| {
            let r = match ends.iter().position(|&end| end <= s) {
                Some(r) => r,
                None if ends.len() < MAX_COMMAND_ROWS => {
                    ends.push(i64::MIN);
                    ends.len() - 1
                }
                None => (0..ends.len()).min_by_key(|&r| ends[r]).unwrap_or(0),
            };
            ends[r] = e;
            r
        })
        .collect();
    (rows, ends.len().max(1))
}

/// The page's data object as JSON text. `tcp_info` pairs each trace with where it landed
/// ([`match_tcp_info`]).
pub fn page_data(
    a: &Analysis,
    cmds: &[CommandStat],
    opts: &StatsOptions,
    tcp_info: &[(TcpInfoTrace, Option<TcpInfoMatch>)],
) -> String {
    let mut templates = Templates::default();
    let mut o = String::with_capacity(64 + a.pdus.len() * 28);
    let span_us = us(a, a.end_ns).max(1);
    let _ = write!(
        o,
        "{{\"v\":1,\"span\":{span_us},\"agg\":{AGGREGATE_ABOVE},\"idle_us\":{},\"title\":{},",
        opts.idle_gap_ns / 1000,
        jstr(&format!(
            "iSCSI timeline: {} PDUs on {} connection(s), {:.6} s",
            a.pdus.len(),
            a.connections.len(),
            (a.end_ns.saturating_sub(a.start_ns)) as f64 / 1e9
        ))
    );
    o.push_str("\"cats\":[");
    for (i, (name, colour)) in CATEGORIES.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        let _ = write!(o, "{sep}[{},{}]", jstr(name), jstr(colour));
    }
    o.push_str("],\"conns\":[");
    // The self-test's PDU: the middle one of the lane with the most PDUs.
    let mut selftest: Option<(usize, usize, usize, usize)> = None; // (lane size, conn, lane, j)
    for (ci, c) in a.connections.iter().enumerate() {
        if ci > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"id\":{},\"ini\":{},\"tgt\":{},\"lanes\":[",
            c.id,
            jstr(&c.initiator.to_string()),
            jstr(&c.target.to_string())
        );
        for (li, dir) in [Dir::ToTarget, Dir::ToInitiator].into_iter().enumerate() {
            let mut pdus: Vec<(i64, u64, usize)> = a
                .pdus
                .iter()
                .enumerate()
                .filter(|(_, p)| p.conn == c.id && p.dir == dir)
                .map(|(i, p)| (listed_us(p.time), p.stream_offset, i))
                .collect();
            pdus.sort_unstable();
            if selftest.is_none_or(|(n, ..)| pdus.len() > n) && !pdus.is_empty() {
                selftest = Some((pdus.len(), ci, li, 0));
            }
            let mut packed = Packed::default();
            for &(_, _, i) in &pdus {
                let line = pdu_line(&a.pdus[i]);
                // The page prints time, connection and arrow itself (from the columns).
                let head = format!("{:>12.6} c{} {} ", a.pdus[i].time, c.id, dir.arrow());
                packed.push(&mut templates, line.strip_prefix(&head).unwrap_or(&line));
            }
            if li > 0 {
                o.push(',');
            }
            let _ = write!(o, "{{\"arrow\":{},\"t\":", jstr(dir.arrow()));
            deltas(&mut o, pdus.iter().map(|p| p.0));
            o.push_str(",\"d\":");
            arr(
                &mut o,
                pdus.iter()
                    .map(|p| (p.0 - us(a, a.pdus[p.2].first_ts_ns)).max(0)),
            );
            o.push_str(",\"k\":");
            arr(&mut o, pdus.iter().map(|p| category(a.pdus[p.2].opcode)));
            o.push_str(",\"i\":");
            deltas(&mut o, pdus.iter().map(|p| a.pdus[p.2].index as i64));
            // SCSI data carried (as series.rs counts it): Data-In to the initiator, immediate
            // data and Data-Out to the target.
            o.push_str(",\"b\":");
            arr(
                &mut o,
                pdus.iter().map(|p| {
                    let r = &a.pdus[p.2];
                    match r.opcode {
                        0x25 | 0x01 | 0x05 => r.data_len,
                        _ => 0,
                    }
                }),
            );
            o.push_str(",\"p\":");
            arr(&mut o, packed.tpl.iter());
            o.push_str(",\"n\":");
            arr(&mut o, packed.nums.iter());
            o.push('}');
        }
        o.push_str("],");
        commands_json(&mut o, a, c, cmds, &mut templates);
        rdma_json(&mut o, a, c);
        flight_json(&mut o, a, c);
        events_json(&mut o, a, c);
        // Pauses on the wire: no payload packet either way for at least the idle gap.
        let mut times: Vec<u64> = c.packets.iter().map(|p| p.ts_ns).collect();
        times.sort_unstable();
        o.push_str(",\"idle\":");
        deltas(
            &mut o,
            times
                .windows(2)
                .filter(|w| w[1] - w[0] >= opts.idle_gap_ns.max(1))
                .flat_map(|w| [us(a, w[0]), us(a, w[1])]),
        );
        o.push_str(",\"ti\":");
        match tcp_info
            .iter()
            .find(|(_, m)| m.as_ref().is_some_and(|m| m.conn == c.id))
        {
            Some((trace, Some(m))) => tcp_info_json(&mut o, a, trace, m),
            _ => o.push_str("null"),
        }
        o.push('}');
    }
    o.push_str("],\"tpl\":[");
    for (i, t) in templates.list.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        o.push_str(&jstr(t));
    }
    o.push(']');
    if let Some((_, c, l, _)) = selftest {
        let dir = [Dir::ToTarget, Dir::ToInitiator][l];
        let _ = write!(o, ",\"st\":{{\"c\":{c},\"l\":{l},\"cand\":[");
        for (k, (j, line)) in selftest_pdus(a, a.connections[c].id, dir)
            .iter()
            .enumerate()
        {
            let sep = if k > 0 { "," } else { "" };
            let _ = write!(o, "{sep}[{j},{}]", jstr(line));
        }
        o.push_str("]}");
    }
    o.push('}');
    o
}

/// Candidates for the self-test's PDU in a lane, the best first: PDUs whose mark no
/// neighbour's touches (hovering one names it alone: the PDU before ends, and the one after
/// starts, at another µs), from the densest stretches of the lane (drawn aggregated at full
/// view). Each with its index in the lane and its listing line; the page takes the one whose
/// pixel column holds the most PDUs.
fn selftest_pdus(a: &Analysis, conn: usize, dir: Dir) -> Vec<(usize, String)> {
    let mut pdus: Vec<(i64, u64, usize)> = a
        .pdus
        .iter()
        .enumerate()
        .filter(|(_, p)| p.conn == conn && p.dir == dir)
        .map(|(i, p)| (listed_us(p.time), p.stream_offset, i))
        .collect();
    pdus.sort_unstable();
    const BINS: i64 = 1000;
    let span = us(a, a.end_ns).max(1);
    let bin = |t: i64| (t * BINS / span).clamp(0, BINS - 1) as usize;
    let mut count = vec![0usize; BINS as usize];
    for p in &pdus {
        count[bin(p.0)] += 1;
    }
    let first = |j: usize| us(a, a.pdus[pdus[j].2].first_ts_ns).min(pdus[j].0);
    let alone = |j: usize| {
        (j == 0 || pdus[j - 1].0 < first(j)) && (j + 1 >= pdus.len() || first(j + 1) > pdus[j].0)
    };
    let mut best: Vec<(usize, usize)> = (0..pdus.len())
        .filter(|&j| alone(j))
        .map(|j| (count[bin(pdus[j].0)], j))
        .collect();
    // Densest first; one per bin, so that the candidates spread over the lane.
    best.sort_by_key(|&(n, j)| (std::cmp::Reverse(n), j));
    best.dedup_by_key(|&mut (_, j)| bin(pdus[j].0));
    best.truncate(32);
    best.into_iter()
        .map(|(_, j)| (j, pdu_line(&a.pdus[pdus[j].2])))
        .collect()
}

fn commands_json(
    o: &mut String,
    a: &Analysis,
    c: &Connection,
    cmds: &[CommandStat],
    templates: &mut Templates,
) {
    let end_us = us(a, a.end_ns);
    let mut mine: Vec<&CommandStat> = cmds.iter().filter(|k| k.conn == c.id).collect();
    mine.sort_by_key(|k| k.start_ns);
    let spans: Vec<(i64, i64)> = mine
        .iter()
        .map(|k| (us(a, k.start_ns), k.end_ns.map_or(end_us, |e| us(a, e))))
        .collect();
    let (rows, nrows) = command_rows(&spans);
    let mut packed = Packed::default();
    for k in &mine {
        let status = k
            .status
            .map_or("none".to_string(), |s| format!("0x{s:02x}"));
        packed.push(
            templates,
            &format!(
                "ITT 0x{:08x} {} | in {} B, out {} B, {} PDUs, {} R2T, status {status}, idle {} us",
                k.itt,
                k.cdb,
                k.data_in_bytes,
                k.data_out_bytes,
                k.pdus,
                k.r2ts,
                k.idle_us.round() as u64
            ),
        );
    }
    let _ = write!(o, "\"cmds\":{{\"rows\":{nrows},\"t\":");
    deltas(o, spans.iter().map(|s| s.0));
    o.push_str(",\"d\":");
    arr(
        o,
        mine.iter()
            .zip(&spans)
            .map(|(k, s)| if k.end_ns.is_some() { s.1 - s.0 } else { -1 }),
    );
    o.push_str(",\"r\":");
    arr(o, rows);
    o.push_str(",\"w\":");
    arr(
        o,
        mine.iter()
            .map(|k| u8::from(k.read && !k.write) + 2 * u8::from(k.write && !k.read)),
    );
    o.push_str(",\"p\":");
    arr(o, packed.tpl.iter());
    o.push_str(",\"n\":");
    arr(o, packed.nums.iter());
    o.push('}');
}

/// iSER data moved by RDMA (not in the PDUs): RDMA Writes are read data, Read Responses
/// write data.
fn rdma_json(o: &mut String, a: &Analysis, c: &Connection) {
    let mut x: Vec<(i64, u64, u8)> = c
        .rdma
        .iter()
        .filter_map(|x| match x.kind {
            RdmaKind::Write => Some((us(a, x.ts_ns), x.bytes, 1)),
            RdmaKind::ReadResponse => Some((us(a, x.ts_ns), x.bytes, 0)),
            RdmaKind::ReadRequest => None,
        })
        .collect();
    x.sort_unstable();
    o.push_str(",\"rdma\":{\"t\":");
    deltas(o, x.iter().map(|x| x.0));
    o.push_str(",\"b\":");
    arr(o, x.iter().map(|x| x.1));
    o.push_str(",\"r\":");
    arr(o, x.iter().map(|x| x.2));
    o.push('}');
}

fn flight_json(o: &mut String, a: &Analysis, c: &Connection) {
    o.push_str(",\"win\":[");
    for (i, s) in flight_series(c).iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"dir\":{},\"t\":",
            u8::from(s.dir == Dir::ToInitiator)
        );
        deltas(o, s.points.iter().map(|p| us(a, p.ts_ns)));
        o.push_str(",\"f\":");
        arr(o, s.points.iter().map(|p| p.in_flight));
        o.push_str(",\"w\":");
        deltas(o, s.points.iter().map(|p| p.window as i64));
        o.push('}');
    }
    o.push(']');
}

fn events_json(o: &mut String, a: &Analysis, c: &Connection) {
    let mut ev: Vec<(i64, u8, usize, u64, u64, u64)> = c
        .tcp_events
        .iter()
        .map(|(d, e)| {
            let kind = EVENT_KINDS.iter().position(|k| *k == e.kind).unwrap_or(0);
            let dir = u8::from(*d == Dir::ToInitiator);
            (us(a, e.ts_ns), dir, kind, e.frame, e.offset, e.len)
        })
        .collect();
    ev.sort_unstable();
    o.push_str(",\"ev\":[");
    for (i, e) in ev.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        let _ = write!(o, "{sep}[{},{},{},{},{},{}]", e.0, e.1, e.2, e.3, e.4, e.5);
    }
    o.push(']');
}

fn tcp_info_json(o: &mut String, a: &Analysis, trace: &TcpInfoTrace, m: &TcpInfoMatch) {
    let t = |s: &TcpSample| (m.t0_ns + (s.t * 1e9) as i64 - a.start_ns as i64).div_euclid(1000);
    let _ = write!(
        o,
        "{{\"name\":{},\"how\":{},\"t\":",
        jstr(&trace.name),
        jstr(&m.how)
    );
    deltas(o, trace.samples.iter().map(t));
    o.push_str(",\"cwnd\":");
    arr(o, trace.samples.iter().map(|s| s.info.snd_cwnd));
    o.push_str(",\"rtt\":");
    arr(o, trace.samples.iter().map(|s| s.info.rtt_us));
    o.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::commands;
    use crate::synthetic::{data_in, data_out, r2t, response, rw10, Synthetic};
    use crate::tcpinfo::TcpInfo;
    use serde_json::Value;

    /// The page's decoding, in Rust: undoes the differences of an array.
    fn undelta(v: &Value) -> Vec<i64> {
        let mut acc = 0;
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| {
                acc += x.as_i64().unwrap();
                acc
            })
            .collect()
    }

    fn ints(v: &Value) -> Vec<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    }

    /// The page's line expansion (page.js `expand`), in Rust.
    fn unpack(tpl: &[String], ids: &[i64], nums: &[i64]) -> Vec<String> {
        let mut prev: HashMap<i64, Vec<i64>> = HashMap::new();
        let mut k = 0;
        ids.iter()
            .map(|&id| {
                let t: Vec<char> = tpl[id as usize].chars().collect();
                let slots = t.iter().filter(|&&c| c == NUM || c == HEX).count();
                let p = prev.entry(id).or_insert_with(|| vec![0; slots]);
                let (mut s, mut slot, mut i) = (String::new(), 0, 0);
                while i < t.len() {
                    match t[i] {
                        NUM | HEX => {
                            p[slot] += nums[k];
                            k += 1;
                            if t[i] == NUM {
                                s += &p[slot].to_string();
                            } else {
                                let w = (t[i + 1] as u8 - b'0') as usize;
                                s += &format!("{:0w$x}", p[slot]);
                                i += 1;
                            }
                            slot += 1;
                        }
                        ch => s.push(ch),
                    }
                    i += 1;
                }
                s
            })
            .collect()
    }

    /// A READ and a WRITE with an R2T: 6 PDUs on one connection.
    fn capture() -> Analysis {
        let four_k = vec![0u8; 4096];
        Synthetic::new()
            .pdu(0, rw10(1, false, 0, 8, 0), &[])
            .pdu(150, data_in(1, 0, true), &four_k)
            .pdu(200, rw10(2, true, 8, 8, 0), &[])
            .pdu(260, r2t(2, 7, 0, 4096), &[])
            .pdu(300, data_out(2, 7, 0), &four_k)
            .pdu(1_000_400, response(2), &[])
            .analysis()
    }

    #[test]
    fn numbers_leave_the_template() {
        let (t, n) = split("SCSI Command   ITT 0x0000001a CmdSN 12 | READ(10) LBA 0 blocks 8 R");
        assert_eq!(
            t,
            "SCSI Command   ITT 0x\u{2}8 CmdSN \u{1} | READ(10) LBA \u{1} blocks \u{1} R"
        );
        assert_eq!(n, [0x1a, 12, 0, 8]);
        // Leading zeros, words with digits and numbers too big for a double stay literal.
        let (t, n) = split("x 007 a1 12ab 1234567890123456 0x12345678901234");
        assert_eq!(t, "x 007 a1 12ab 1234567890123456 0x12345678901234");
        assert!(n.is_empty());
    }

    #[test]
    fn every_pdu_once_with_its_listing_line() {
        let a = capture();
        let cmds = commands(&a, &StatsOptions::default());
        let doc: Value = serde_json::from_str(&page_data(&a, &cmds, &StatsOptions::default(), &[]))
            .expect("valid JSON");
        let tpl: Vec<String> = doc["tpl"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
        let conns = doc["conns"].as_array().unwrap();
        assert_eq!(conns.len(), 1);
        let mut seen = Vec::new();
        for (li, lane) in conns[0]["lanes"].as_array().unwrap().iter().enumerate() {
            let t = undelta(&lane["t"]);
            let idx = undelta(&lane["i"]);
            let k = ints(&lane["k"]);
            let b = ints(&lane["b"]);
            let lines = unpack(&tpl, &ints(&lane["p"]), &ints(&lane["n"]));
            assert!(t.windows(2).all(|w| w[0] <= w[1]), "sorted times");
            for j in 0..t.len() {
                let p = &a.pdus[idx[j] as usize];
                let dir = [Dir::ToTarget, Dir::ToInitiator][li];
                assert_eq!(p.dir, dir, "lane {li} holds its direction only");
                assert_eq!(t[j], (p.time * 1e6).round() as i64);
                assert_eq!(k[j], category(p.opcode) as i64);
                let full = format!(
                    "{:>12.6} c{} {} {}",
                    t[j] as f64 / 1e6,
                    p.conn,
                    dir.arrow(),
                    lines[j]
                );
                assert_eq!(full, pdu_line(p));
                if p.opcode == 0x25 || p.opcode == 0x05 {
                    assert_eq!(b[j], 4096);
                }
                seen.push(idx[j] as usize);
            }
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..a.pdus.len()).collect::<Vec<_>>(),
            "every PDU once"
        );
        // To the target: READ, WRITE, Data-Out; to the initiator: Data-In, R2T, response.
        let lanes = conns[0]["lanes"].as_array().unwrap();
        assert_eq!(ints(&lanes[0]["k"]), [0, 0, 1]);
        assert_eq!(ints(&lanes[1]["k"]), [1, 3, 2]);
        // The commands: start, duration, kind; the WRITE's status comes 1 s later.
        let c = &conns[0]["cmds"];
        assert_eq!(undelta(&c["t"]), [0, 200]);
        assert_eq!(ints(&c["d"]), [150, 1_000_200]);
        assert_eq!(ints(&c["w"]), [1, 2]);
        assert_eq!(ints(&c["r"]), [0, 0], "one after the other: one row");
        let details = unpack(&tpl, &ints(&c["p"]), &ints(&c["n"]));
        assert!(
            details[1].starts_with("ITT 0x00000002 WRITE(10)"),
            "{}",
            details[1]
        );
        assert!(
            details[1].contains("out 4096 B, 4 PDUs, 1 R2T"),
            "{}",
            details[1]
        );
        // The one pause of at least 1 ms on the wire: from the Data-Out to the response.
        assert_eq!(undelta(&conns[0]["idle"]), [300, 1_000_400]);
        // Self-test candidates: PDUs of the fullest lane, each with its listing line.
        let st = &doc["st"];
        let cand = st["cand"].as_array().unwrap();
        assert!(!cand.is_empty());
        let lane = &conns[0]["lanes"][st["l"].as_u64().unwrap() as usize];
        let idx = undelta(&lane["i"]);
        for c in cand {
            let j = c[0].as_u64().unwrap() as usize;
            assert_eq!(c[1].as_str().unwrap(), pdu_line(&a.pdus[idx[j] as usize]));
        }
    }

    #[test]
    fn overlapping_commands_get_rows() {
        let spans = [(0, 10), (1, 5), (2, 3), (6, 20), (4, 8)];
        let (rows, n) = command_rows(&spans);
        assert_eq!(rows, [0, 1, 2, 1, 2]);
        assert_eq!(n, 3);
        let many: Vec<(i64, i64)> = (0..40).map(|i| (i, 100)).collect();
        let (rows, n) = command_rows(&many);
        assert_eq!(n, MAX_COMMAND_ROWS);
        assert!(rows.iter().all(|&r| r < MAX_COMMAND_ROWS));
    }

    /// Bench traces land on the SCSI connection and are aligned by the bytes received.
    #[test]
    fn tcp_info_is_aligned_by_bytes() {
        let a = capture();
        // The Data-In PDU (48 + 4096 bytes) arrives at 150 µs; the socket saw its bytes at
        // 0.1 ms after its sampler started: t = 0 is at 50 µs.
        let sample = |t: f64, received: u64| TcpSample {
            t,
            info: TcpInfo {
                bytes_received: received,
                snd_cwnd: 10,
                ..TcpInfo::default()
            },
        };
        let trace = TcpInfoTrace {
            name: "s0c0".into(),
            samples: vec![sample(0.0, 0), sample(0.0001, 4144)],
        };
        let m = match_tcp_info(&a, std::slice::from_ref(&trace));
        let m = m[0].clone().expect("placed");
        assert_eq!(m.conn, a.connections[0].id);
        assert_eq!(m.t0_ns - a.start_ns as i64, 50_000, "{}", m.how);
        let doc: Value = serde_json::from_str(&page_data(
            &a,
            &[],
            &StatsOptions::default(),
            &[(trace, Some(m))],
        ))
        .unwrap();
        let ti = &doc["conns"][0]["ti"];
        assert_eq!(undelta(&ti["t"]), [50, 150]);
        assert_eq!(ints(&ti["cwnd"]), [10, 10]);
        // A file of the target names its peer.
        assert_eq!(
            target_file("conn-3-127.0.0.1_45678"),
            Some((3, "127.0.0.1_45678"))
        );
        assert_eq!(bench_index("s1c2"), Some((1, 2)));
    }
}
