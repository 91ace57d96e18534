//! Per-command and per-connection statistics over an [`Analysis`]: command-to-response
//! latency, bytes, PDUs and R2Ts per SCSI command, the time nothing moved on the wire while
//! it was outstanding, and per connection the throughput, idle ratio and TCP anomalies.

use std::collections::HashMap;

use crate::iser::RdmaKind;

use report::{Cell, Table};
use serde::Serialize;

use crate::analysis::{Analysis, Connection, PacketMark};
use crate::iscsi::Dir;

/// How statistics are computed.
#[derive(Debug, Clone, Copy)]
pub struct StatsOptions {
    /// A pause between payload packets of a connection at least this long counts as idle.
    pub idle_gap_ns: u64,
    /// Link rate in bytes per second, for utilization (None: not reported).
    pub link_rate: Option<f64>,
}

impl Default for StatsOptions {
    fn default() -> Self {
        StatsOptions {
            idle_gap_ns: 1_000_000,
            link_rate: None,
        }
    }
}

/// One SCSI command from its Command PDU to its status.
#[derive(Debug, Clone, Serialize)]
pub struct CommandStat {
    pub conn: usize,
    pub itt: u32,
    pub cdb: String,
    pub read: bool,
    pub write: bool,
    pub expected_len: u32,
    /// Seconds since the capture start when the command was sent.
    pub start: f64,
    pub start_ns: u64,
    /// None when the capture holds no response.
    pub end_ns: Option<u64>,
    pub latency_us: Option<f64>,
    pub data_in_bytes: u64,
    pub data_out_bytes: u64,
    pub pdus: u32,
    pub r2ts: u32,
    pub status: Option<u8>,
    /// Time inside [start, end] with no payload packet on this connection for at least the
    /// idle gap.
    pub idle_us: f64,
}

/// Totals for one connection.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionStat {
    pub conn: usize,
    pub initiator: String,
    pub target: String,
    pub transport: &'static str,
    pub duration_s: f64,
    pub pdus: usize,
    pub commands: usize,
    pub bytes_to_target: u64,
    pub bytes_to_initiator: u64,
    /// SCSI data (Data-In, Data-Out and immediate data; on iSER also RDMA Writes and Read
    /// Responses) per second over the duration.
    pub data_throughput_mbps: f64,
    /// TCP payload per second, both directions.
    pub wire_throughput_mbps: f64,
    pub utilization: Option<f64>,
    pub idle_s: f64,
    pub idle_ratio: f64,
    pub mean_latency_us: Option<f64>,
    pub max_latency_us: Option<f64>,
    pub retransmissions: u64,
    pub lost_segments: u64,
    pub out_of_order: u64,
    pub unrecovered_bytes: u64,
    pub digest_errors: u64,
    pub header_digest: Option<bool>,
    pub data_digest: Option<bool>,
}

/// Sum of the gaps of at least `gap` between consecutive packet times inside [lo, hi]
/// (times must be sorted).
pub fn idle_between(times: &[u64], lo: u64, hi: u64, gap: u64) -> u64 {
    let from = times.partition_point(|&t| t < lo);
    let to = times.partition_point(|&t| t <= hi);
    let mut idle = 0;
    let mut prev = lo;
    for &t in &times[from..to] {
        if t - prev >= gap {
            idle += t - prev;
        }
        prev = t;
    }
    if hi > prev && hi - prev >= gap {
        idle += hi - prev;
    }
    idle
}

/// The connection's packet times, sorted.
pub(crate) fn packet_times(c: &Connection) -> Vec<u64> {
    let mut t: Vec<u64> = c.packets.iter().map(|p: &PacketMark| p.ts_ns).collect();
    t.sort_unstable();
    t
}

/// Every SCSI command in the capture, in the order they were sent.
pub fn commands(a: &Analysis, opts: &StatsOptions) -> Vec<CommandStat> {
    let mut out: Vec<CommandStat> = Vec::new();
    // iSER: each command's Read and Write STags, by index in `out`.
    let mut stags: Vec<(Option<u32>, Option<u32>)> = Vec::new();
    let mut open: HashMap<(usize, u32), usize> = HashMap::new();
    for p in &a.pdus {
        let Some(itt) = p.itt else { continue };
        match p.opcode {
            0x01 => {
                let i = out.len();
                let (read, write) = p.command_flags();
                out.push(CommandStat {
                    conn: p.conn,
                    itt,
                    cdb: p.cdb.clone().unwrap_or_default(),
                    read,
                    write,
                    expected_len: p.expected_len.unwrap_or(0),
                    start: p.first_ts_ns.saturating_sub(a.start_ns) as f64 / 1e9,
                    start_ns: p.first_ts_ns,
                    end_ns: None,
                    latency_us: None,
                    data_in_bytes: 0,
                    data_out_bytes: p.data_len as u64,
                    pdus: 1,
                    r2ts: 0,
                    status: None,
                    idle_us: 0.0,
                });
                stags.push((p.read_stag, p.write_stag));
                open.insert((p.conn, itt), i);
            }
            0x05 | 0x25 | 0x31 | 0x21 => {
                let Some(&i) = open.get(&(p.conn, itt)) else {
                    continue;
                };
                let c = &mut out[i];
                c.pdus += 1;
                match p.opcode {
                    0x05 => c.data_out_bytes += p.data_len as u64,
                    0x25 => c.data_in_bytes += p.data_len as u64,
                    0x31 => c.r2ts += 1,
                    _ => {}
                }
                if p.opcode == 0x21 || (p.opcode == 0x25 && p.status.is_some()) {
                    c.status = p.status;
                    c.end_ns = Some(p.ts_ns);
                    c.latency_us = Some(p.ts_ns.saturating_sub(c.start_ns) as f64 / 1e3);
                    open.remove(&(p.conn, itt));
                }
            }
            _ => {}
        }
    }
    add_rdma_bytes(a, &mut out, &stags);
    let times: Vec<Vec<u64>> = a.connections.iter().map(packet_times).collect();
    for c in &mut out {
        if let (Some(end), Some(t)) = (c.end_ns, times.get(c.conn)) {
            c.idle_us = idle_between(t, c.start_ns, end, opts.idle_gap_ns) as f64 / 1e3;
        }
    }
    out
}

/// iSER: the data of each command moved by RDMA, tied to it by the STag its iSER header named
/// and by time (between the command and its status): RDMA Writes to its Read STag are its
/// read data, RDMA Read Requests of its Write STag its solicited write data.
fn add_rdma_bytes(a: &Analysis, out: &mut [CommandStat], stags: &[(Option<u32>, Option<u32>)]) {
    let mut by_stag: HashMap<(usize, u32), Vec<usize>> = HashMap::new();
    for (i, (read, write)) in stags.iter().enumerate() {
        for stag in [read, write].into_iter().flatten() {
            by_stag.entry((out[i].conn, *stag)).or_default().push(i);
        }
    }
    if by_stag.is_empty() {
        return;
    }
    for conn in &a.connections {
        for x in &conn.rdma {
            let Some(cands) = by_stag.get(&(conn.id, x.stag)) else {
                continue;
            };
            let within = |c: &CommandStat| {
                x.ts_ns >= c.start_ns && c.end_ns.is_none_or(|end| x.ts_ns <= end)
            };
            let Some(&i) = cands.iter().find(|&&i| within(&out[i])) else {
                continue;
            };
            match x.kind {
                RdmaKind::Write if stags[i].0 == Some(x.stag) => out[i].data_in_bytes += x.bytes,
                RdmaKind::ReadRequest if stags[i].1 == Some(x.stag) => {
                    out[i].data_out_bytes += x.bytes
                }
                _ => {}
            }
        }
    }
}

/// One summary per connection.
pub fn connections(a: &Analysis, cmds: &[CommandStat], opts: &StatsOptions) -> Vec<ConnectionStat> {
    a.connections
        .iter()
        .map(|c| {
            let times = packet_times(c);
            let (lo, hi) = (
                times.first().copied().unwrap_or(c.first_ts_ns),
                times.last().copied().unwrap_or(c.last_ts_ns),
            );
            let span_ns = hi.saturating_sub(lo);
            let duration_s = span_ns as f64 / 1e9;
            let idle = idle_between(&times, lo, hi, opts.idle_gap_ns);
            // iSER moves READ data in RDMA Writes and solicited WRITE data in Read Responses.
            let rdma: u64 = c
                .rdma
                .iter()
                .filter(|x| x.kind != RdmaKind::ReadRequest)
                .map(|x| x.bytes)
                .sum();
            let data: u64 = rdma
                + a.pdus
                    .iter()
                    .filter(|p| p.conn == c.id && matches!(p.opcode, 0x01 | 0x05 | 0x25))
                    .map(|p| p.data_len as u64)
                    .sum::<u64>();
            let wire: u64 = c.packets.iter().map(|p| p.payload as u64).sum();
            let rate = |bytes: u64| {
                if duration_s > 0.0 {
                    bytes as f64 / duration_s / 1e6
                } else {
                    0.0
                }
            };
            let lat: Vec<f64> = cmds
                .iter()
                .filter(|k| k.conn == c.id)
                .filter_map(|k| k.latency_us)
                .collect();
            let bytes = |d: Dir| {
                c.packets
                    .iter()
                    .filter(|p| p.dir == d)
                    .map(|p| p.payload as u64)
                    .sum()
            };
            ConnectionStat {
                conn: c.id,
                initiator: c.initiator.to_string(),
                target: c.target.to_string(),
                transport: c.transport,
                duration_s,
                pdus: c.pdus,
                commands: cmds.iter().filter(|k| k.conn == c.id).count(),
                bytes_to_target: bytes(Dir::ToTarget),
                bytes_to_initiator: bytes(Dir::ToInitiator),
                data_throughput_mbps: rate(data),
                wire_throughput_mbps: rate(wire),
                utilization: opts
                    .link_rate
                    .filter(|_| duration_s > 0.0)
                    .map(|r| wire as f64 / duration_s / r),
                idle_s: idle as f64 / 1e9,
                idle_ratio: if span_ns > 0 {
                    idle as f64 / span_ns as f64
                } else {
                    0.0
                },
                mean_latency_us: (!lat.is_empty())
                    .then(|| lat.iter().sum::<f64>() / lat.len() as f64),
                max_latency_us: lat.iter().copied().reduce(f64::max),
                retransmissions: c.to_target.retransmissions + c.to_initiator.retransmissions,
                lost_segments: c.to_target.lost_retransmitted + c.to_initiator.lost_retransmitted,
                out_of_order: c.to_target.out_of_order + c.to_initiator.out_of_order,
                unrecovered_bytes: c.to_target.unrecovered_bytes + c.to_initiator.unrecovered_bytes,
                digest_errors: c.framing_to_target.digest_errors
                    + c.framing_to_initiator.digest_errors,
                header_digest: c.header_digest,
                data_digest: c.data_digest,
            }
        })
        .collect()
}

fn opt_f(v: Option<f64>, decimals: usize) -> Cell {
    v.map_or(Cell::Text("-".into()), |v| Cell::float(v, decimals))
}

/// The per-command table.
pub fn commands_table(cmds: &[CommandStat]) -> Table {
    let mut t = Table::new([
        "conn",
        "ITT",
        "start_s",
        "command",
        "latency_us",
        "in_bytes",
        "out_bytes",
        "pdus",
        "r2ts",
        "idle_us",
        "status",
    ]);
    for c in cmds {
        t.push_row([
            Cell::from(c.conn),
            Cell::Text(format!("0x{:08x}", c.itt)),
            Cell::float(c.start, 6),
            Cell::Text(c.cdb.clone()),
            opt_f(c.latency_us, 1),
            Cell::from(c.data_in_bytes),
            Cell::from(c.data_out_bytes),
            Cell::from(c.pdus),
            Cell::from(c.r2ts),
            Cell::float(c.idle_us, 1),
            Cell::Text(c.status.map_or("-".into(), crate::cdb::status_name)),
        ]);
    }
    t
}

/// The per-connection summary table.
pub fn connections_table(conns: &[ConnectionStat]) -> Table {
    let mut t = Table::new([
        "conn",
        "initiator",
        "target",
        "transport",
        "duration_s",
        "pdus",
        "commands",
        "data_MB/s",
        "wire_MB/s",
        "util",
        "idle_s",
        "idle_ratio",
        "mean_lat_us",
        "retrans",
        "lost",
        "ooo",
        "unrecovered_B",
        "digests",
    ]);
    for c in conns {
        let digests = match (c.header_digest, c.data_digest) {
            (Some(true), Some(true)) => "header+data",
            (Some(true), _) => "header",
            (_, Some(true)) => "data",
            _ => "none",
        };
        t.push_row([
            Cell::from(c.conn),
            Cell::Text(c.initiator.clone()),
            Cell::Text(c.target.clone()),
            Cell::Text(c.transport.into()),
            Cell::float(c.duration_s, 3),
            Cell::from(c.pdus),
            Cell::from(c.commands),
            Cell::float(c.data_throughput_mbps, 2),
            Cell::float(c.wire_throughput_mbps, 2),
            opt_f(c.utilization, 3),
            Cell::float(c.idle_s, 3),
            Cell::float(c.idle_ratio, 3),
            opt_f(c.mean_latency_us, 1),
            Cell::from(c.retransmissions),
            Cell::from(c.lost_segments),
            Cell::from(c.out_of_order),
            Cell::from(c.unrecovered_bytes),
            Cell::Text(digests.into()),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_counts_only_long_gaps() {
        let t = [0, 10, 20, 1000, 1010];
        assert_eq!(idle_between(&t, 0, 1010, 100), 980);
        assert_eq!(idle_between(&t, 0, 2010, 100), 1980);
        assert_eq!(idle_between(&t, 0, 1010, 1000), 0);
    }
}
