//! Per-command phase breakdown, as btt breaks block I/O into phases. Times are taken where
//! the capture was made (at the initiator for an initiator's `--trace`).
//!
//! A READ: command sent → first read data (the target's service time) → last read data (the
//! transfer) → status. A WRITE: command sent → first R2T (waiting for the target to ask) →
//! last Data-Out (the transfer, burst by burst, each burst with the wait for its R2T) →
//! status; immediate data rides in the command and unsolicited Data-Out follows it
//! (TTT 0xffffffff). On iSER the data phases are RDMA operations tied to the command by the
//! STags its iSER header named: RDMA Writes to the Read STag carry read data, each RDMA Read
//! Request of the Write STag starts a burst and the Read Responses to its sink STag end it.

use std::collections::HashMap;

use report::{Cell, Table};
use serde::Serialize;

use crate::analysis::{Analysis, Connection};
use crate::iscsi::PduRecord;
use crate::iser::{RdmaKind, RdmaXfer};

const UNSOLICITED_TTT: u32 = 0xffff_ffff;

/// Which way a command moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum IoDir {
    Read,
    Write,
    /// No data, or both ways (bidirectional commands are not broken down).
    Other,
}

impl IoDir {
    pub fn name(self) -> &'static str {
        match self {
            IoDir::Read => "read",
            IoDir::Write => "write",
            IoDir::Other => "other",
        }
    }
}

/// One solicited burst of a WRITE: an R2T (or RDMA Read Request) and the data it asked for.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    /// From the end of the previous burst (or the command) to this burst's R2T.
    pub r2t_wait_us: f64,
    /// From the R2T to the last byte of its data (None: no data seen).
    pub transfer_us: Option<f64>,
    /// Bytes the R2T asked for.
    pub desired_bytes: u64,
    /// Bytes that came.
    pub bytes: u64,
}

/// The phases of one SCSI command, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct CommandPhases {
    pub conn: usize,
    pub itt: u32,
    pub dir: IoDir,
    pub cdb: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lba: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    pub expected_len: u32,
    /// Capture time of the command's first byte.
    pub start_ns: u64,
    /// Capture time of the status (None: not in the capture).
    pub end_ns: Option<u64>,
    pub total_us: Option<f64>,
    /// The command PDU on the wire, first byte to last (immediate data included).
    pub send_us: f64,
    /// READ: command → first read data: the target's service time.
    pub service_us: Option<f64>,
    /// WRITE: command → first R2T.
    pub r2t_wait_us: Option<f64>,
    /// First data → last data (a WRITE whose data is all unsolicited: command → last Data-Out).
    pub transfer_us: Option<f64>,
    /// Last data (or the command) → status.
    pub status_us: Option<f64>,
    pub read_bytes: u64,
    pub immediate_bytes: u64,
    pub unsolicited_bytes: u64,
    pub solicited_bytes: u64,
    pub bursts: Vec<Burst>,
}

/// A burst while it is being followed.
#[derive(Debug, Clone, Copy)]
struct OpenBurst {
    /// TTT (TCP) or the target's sink STag (iSER).
    tag: u32,
    r2t_ns: u64,
    desired: u64,
    bytes: u64,
    last_data_ns: Option<u64>,
}

/// The moments of one command as the PDUs (and RDMA operations) go by.
#[derive(Debug, Clone)]
struct Moments {
    conn: usize,
    itt: u32,
    dir: IoDir,
    cdb: String,
    lba: Option<u64>,
    blocks: Option<u32>,
    expected_len: u32,
    start_ns: u64,
    sent_ns: u64,
    end_ns: Option<u64>,
    first_read_ns: Option<u64>,
    last_read_ns: Option<u64>,
    read_bytes: u64,
    immediate_bytes: u64,
    unsolicited_bytes: u64,
    last_unsolicited_ns: Option<u64>,
    bursts: Vec<OpenBurst>,
    read_stag: Option<u32>,
    write_stag: Option<u32>,
}

impl Moments {
    fn of_command(p: &PduRecord, itt: u32) -> Moments {
        let dir = match p.command_flags() {
            (true, false) => IoDir::Read,
            (false, true) => IoDir::Write,
            _ => IoDir::Other,
        };
        Moments {
            conn: p.conn,
            itt,
            dir,
            cdb: p.cdb.clone().unwrap_or_default(),
            lba: p.lba,
            blocks: p.blocks,
            expected_len: p.expected_len.unwrap_or(0),
            start_ns: p.first_ts_ns,
            sent_ns: p.ts_ns,
            end_ns: None,
            first_read_ns: None,
            last_read_ns: None,
            read_bytes: 0,
            immediate_bytes: p.data_len as u64,
            unsolicited_bytes: 0,
            last_unsolicited_ns: None,
            bursts: Vec::new(),
            read_stag: p.read_stag,
            write_stag: p.write_stag,
        }
    }

    fn read_data(&mut self, first_ns: u64, last_ns: u64, bytes: u64) {
        self.first_read_ns.get_or_insert(first_ns);
        self.last_read_ns = Some(last_ns);
        self.read_bytes += bytes;
    }

    fn burst_data(&mut self, tag: u32, ts_ns: u64, bytes: u64) {
        if let Some(b) = self.bursts.iter_mut().rev().find(|b| b.tag == tag) {
            b.bytes += bytes;
            b.last_data_ns = Some(ts_ns);
        }
    }

    /// Takes one PDU of this command (after the command itself); true when it is the status.
    fn take(&mut self, p: &PduRecord) -> bool {
        match p.opcode {
            0x25 => self.read_data(p.first_ts_ns, p.ts_ns, p.data_len as u64),
            0x31 => self.bursts.push(OpenBurst {
                tag: p.ttt.unwrap_or(0),
                r2t_ns: p.ts_ns,
                desired: p.desired_len.unwrap_or(0) as u64,
                bytes: 0,
                last_data_ns: None,
            }),
            0x05 => match p.ttt {
                Some(UNSOLICITED_TTT) | None => {
                    self.unsolicited_bytes += p.data_len as u64;
                    self.last_unsolicited_ns = Some(p.ts_ns);
                }
                Some(ttt) => self.burst_data(ttt, p.ts_ns, p.data_len as u64),
            },
            _ => {}
        }
        let status = p.opcode == 0x21 || (p.opcode == 0x25 && p.status.is_some());
        if status {
            self.end_ns = Some(p.ts_ns);
        }
        status
    }

    fn phases(self) -> CommandPhases {
        let us = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1e3;
        let last_write_data = self
            .bursts
            .iter()
            .filter_map(|b| b.last_data_ns)
            .chain(self.last_unsolicited_ns)
            .max();
        let first_r2t = self.bursts.first().map(|b| b.r2t_ns);
        let (service_us, r2t_wait_us, transfer_us, last_data) = match self.dir {
            IoDir::Read => (
                self.first_read_ns.map(|t| us(self.sent_ns, t)),
                None,
                self.first_read_ns
                    .zip(self.last_read_ns)
                    .map(|(a, b)| us(a, b)),
                self.last_read_ns,
            ),
            IoDir::Write => (
                None,
                first_r2t.map(|t| us(self.sent_ns, t)),
                last_write_data.map(|end| us(first_r2t.unwrap_or(self.sent_ns), end)),
                last_write_data,
            ),
            IoDir::Other => (None, None, None, None),
        };
        let mut previous_end = self.sent_ns;
        let bursts = self
            .bursts
            .iter()
            .map(|b| {
                let burst = Burst {
                    r2t_wait_us: us(previous_end, b.r2t_ns),
                    transfer_us: b.last_data_ns.map(|t| us(b.r2t_ns, t)),
                    desired_bytes: b.desired,
                    bytes: b.bytes,
                };
                previous_end = b.last_data_ns.unwrap_or(b.r2t_ns);
                burst
            })
            .collect();
        CommandPhases {
            conn: self.conn,
            itt: self.itt,
            dir: self.dir,
            cdb: self.cdb,
            lba: self.lba,
            blocks: self.blocks,
            expected_len: self.expected_len,
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            total_us: self.end_ns.map(|e| us(self.start_ns, e)),
            send_us: us(self.start_ns, self.sent_ns),
            service_us,
            r2t_wait_us,
            transfer_us,
            status_us: self
                .end_ns
                .map(|e| us(last_data.unwrap_or(self.sent_ns).max(self.sent_ns), e)),
            read_bytes: self.read_bytes,
            immediate_bytes: self.immediate_bytes,
            unsolicited_bytes: self.unsolicited_bytes,
            solicited_bytes: self.bursts.iter().map(|b| b.bytes).sum(),
            bursts,
        }
    }
}

/// Every SCSI command of the capture with its phases, in the order the commands were sent.
pub fn command_phases(a: &Analysis) -> Vec<CommandPhases> {
    let mut moments: Vec<Moments> = Vec::new();
    let mut open: HashMap<(usize, u32), usize> = HashMap::new();
    for p in &a.pdus {
        let Some(itt) = p.itt else { continue };
        if p.opcode == 0x01 {
            open.insert((p.conn, itt), moments.len());
            moments.push(Moments::of_command(p, itt));
            continue;
        }
        if !matches!(p.opcode, 0x05 | 0x21 | 0x25 | 0x31) {
            continue;
        }
        let Some(&i) = open.get(&(p.conn, itt)) else {
            continue;
        };
        if moments[i].take(p) {
            open.remove(&(p.conn, itt));
        }
    }
    for conn in a.connections.iter().filter(|c| !c.rdma.is_empty()) {
        add_rdma_moments(conn, &mut moments);
    }
    moments.into_iter().map(Moments::phases).collect()
}

/// iSER: RDMA Writes to a command's Read STag are its read data; an RDMA Read Request of its
/// Write STag opens a burst, named by the target's sink STag, that the Read Responses to that
/// sink STag fill. A STag belongs to the command that named it while that command is open.
fn add_rdma_moments(conn: &Connection, moments: &mut [Moments]) {
    let mut by_stag: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, m) in moments
        .iter()
        .enumerate()
        .filter(|(_, m)| m.conn == conn.id)
    {
        for stag in [m.read_stag, m.write_stag].into_iter().flatten() {
            by_stag.entry(stag).or_default().push(i);
        }
    }
    let mut xfers: Vec<&RdmaXfer> = conn.rdma.iter().collect();
    xfers.sort_by_key(|x| x.ts_ns);
    // Sink STag of an open burst → the command it belongs to.
    let mut burst_owner: HashMap<u32, usize> = HashMap::new();
    for x in xfers {
        let owner = |stag: u32| {
            by_stag.get(&stag).and_then(|cands| {
                cands.iter().copied().find(|&i| {
                    let m = &moments[i];
                    x.ts_ns >= m.start_ns && m.end_ns.is_none_or(|end| x.ts_ns <= end)
                })
            })
        };
        match x.kind {
            RdmaKind::Write => {
                if let Some(i) = owner(x.stag).filter(|&i| moments[i].read_stag == Some(x.stag)) {
                    moments[i].read_data(x.ts_ns, x.ts_ns, x.bytes);
                }
            }
            RdmaKind::ReadRequest => {
                let Some(i) = owner(x.stag).filter(|&i| moments[i].write_stag == Some(x.stag))
                else {
                    continue;
                };
                let tag = x.sink_stag.unwrap_or(0);
                moments[i].bursts.push(OpenBurst {
                    tag,
                    r2t_ns: x.ts_ns,
                    desired: x.bytes,
                    bytes: 0,
                    last_data_ns: None,
                });
                burst_owner.insert(tag, i);
            }
            RdmaKind::ReadResponse => {
                if let Some(&i) = burst_owner.get(&x.stag) {
                    moments[i].burst_data(x.stag, x.ts_ns, x.bytes);
                }
            }
        }
    }
}

/// Nearest-rank percentile of sorted values (`q` in 0..=1).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The distribution of one phase over the commands of one direction.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseSummary {
    pub dir: IoDir,
    pub phase: &'static str,
    pub count: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// This phase's time as a share of the commands' total time (None for per-burst rows).
    pub share: Option<f64>,
}

/// The phases reported for a direction, with how to read each from a command.
type PhaseOf = fn(&CommandPhases) -> Option<f64>;

fn phase_columns(dir: IoDir) -> Vec<(&'static str, PhaseOf)> {
    let total: (&'static str, PhaseOf) = ("total", |c| c.total_us);
    // What a command waits for between sending and its data moving.
    let wait: (&'static str, PhaseOf) = match dir {
        IoDir::Read => ("service", |c| c.service_us),
        IoDir::Write => ("r2t_wait", |c| c.r2t_wait_us),
        IoDir::Other => return vec![total],
    };
    vec![
        ("send", |c| Some(c.send_us)),
        wait,
        ("transfer", |c| c.transfer_us),
        ("status", |c| c.status_us),
        total,
    ]
}

/// The p50 and p99 of some values (0 for none), sorting them.
pub fn p50_p99(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        percentile(values, 0.5).unwrap_or(0.0),
        percentile(values, 0.99).unwrap_or(0.0),
    )
}

fn summarize(dir: IoDir, phase: &'static str, mut values: Vec<f64>, total: f64) -> PhaseSummary {
    let (p50_us, p99_us) = p50_p99(&mut values);
    let sum: f64 = values.iter().sum();
    PhaseSummary {
        dir,
        phase,
        count: values.len(),
        p50_us,
        p99_us,
        mean_us: sum / values.len().max(1) as f64,
        share: (total > 0.0).then_some(sum / total),
    }
}

/// p50/p99 of every phase, per direction, over the commands that completed; WRITEs also get
/// per-burst rows (the wait for each R2T and each burst's transfer).
pub fn summary(cmds: &[CommandPhases]) -> Vec<PhaseSummary> {
    let mut out = Vec::new();
    for dir in [IoDir::Read, IoDir::Write] {
        let done: Vec<&CommandPhases> = cmds
            .iter()
            .filter(|c| c.dir == dir && c.total_us.is_some())
            .collect();
        if done.is_empty() {
            continue;
        }
        let total: f64 = done.iter().filter_map(|c| c.total_us).sum();
        for (phase, of) in phase_columns(dir) {
            let values: Vec<f64> = done.iter().filter_map(|c| of(c)).collect();
            if !values.is_empty() {
                out.push(summarize(dir, phase, values, total));
            }
        }
        if dir == IoDir::Write {
            let bursts = || done.iter().flat_map(|c| c.bursts.iter());
            let waits: Vec<f64> = bursts().map(|b| b.r2t_wait_us).collect();
            let transfers: Vec<f64> = bursts().filter_map(|b| b.transfer_us).collect();
            if !waits.is_empty() {
                let mut row = summarize(dir, "burst_r2t_wait", waits, total);
                out.push(row.clone());
                row = summarize(dir, "burst_transfer", transfers, 0.0);
                out.push(row);
            }
        }
    }
    out
}

/// Bytes of the WRITEs by how they travelled.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WriteDataSplit {
    pub commands: usize,
    pub immediate_bytes: u64,
    pub unsolicited_bytes: u64,
    pub solicited_bytes: u64,
    pub bursts: usize,
}

pub fn write_data_split(cmds: &[CommandPhases]) -> WriteDataSplit {
    let mut s = WriteDataSplit::default();
    for c in cmds.iter().filter(|c| c.dir == IoDir::Write) {
        s.commands += 1;
        s.immediate_bytes += c.immediate_bytes;
        s.unsolicited_bytes += c.unsolicited_bytes;
        s.solicited_bytes += c.solicited_bytes;
        s.bursts += c.bursts.len();
    }
    s
}

/// The summary as a table: one row per direction and phase.
pub fn summary_table(rows: &[PhaseSummary]) -> Table {
    let mut t = Table::new([
        "dir", "phase", "count", "p50_us", "p99_us", "mean_us", "share",
    ]);
    for r in rows {
        t.push_row([
            Cell::Text(r.dir.name().into()),
            Cell::Text(r.phase.into()),
            Cell::from(r.count),
            Cell::float(r.p50_us, 1),
            Cell::float(r.p99_us, 1),
            Cell::float(r.mean_us, 1),
            r.share
                .map_or(Cell::Text("-".into()), |s| Cell::float(s, 3)),
        ]);
    }
    t
}

/// The text block `--phases` prints: the table and how the WRITE data travelled.
pub fn text(cmds: &[CommandPhases]) -> String {
    let mut out = summary_table(&summary(cmds)).to_string();
    let w = write_data_split(cmds);
    if w.commands > 0 {
        out.push_str(&format!(
            "\nwrites: {} commands, {} bytes immediate, {} unsolicited, {} solicited in {} bursts\n",
            w.commands, w.immediate_bytes, w.unsolicited_bytes, w.solicited_bytes, w.bursts
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{data_in, data_out, r2t, response, rw10, Synthetic};

    /// A READ of 8 KiB in two Data-In (the second with status) and a WRITE of 8 KiB with
    /// 1 KiB immediate data and two R2T bursts.
    #[test]
    fn reads_and_writes_break_into_their_phases() {
        let k = vec![0u8; 1024];
        let four_k = vec![0u8; 4096];
        let a = Synthetic::new()
            .pdu(1_000, rw10(1, false, 0, 16, 0), &[])
            .pdu(3_000, data_in(1, 0, false), &four_k)
            .pdu(4_000, data_in(1, 4096, true), &four_k)
            .pdu(10_000, rw10(2, true, 16, 16, 1024), &k)
            .pdu(12_000, r2t(2, 7, 1024, 3072), &[])
            .pdu(13_000, data_out(2, 7, 1024), &vec![0u8; 3072])
            .pdu(15_000, r2t(2, 8, 4096, 4096), &[])
            .pdu(16_500, data_out(2, 8, 4096), &four_k)
            .pdu(18_000, response(2), &[])
            .analysis();
        let cmds = command_phases(&a);
        assert_eq!(cmds.len(), 2);
        let read = &cmds[0];
        assert_eq!(read.dir, IoDir::Read);
        assert_eq!((read.lba, read.blocks), (Some(0), Some(16)));
        assert_eq!(read.service_us, Some(2000.0));
        assert_eq!(read.transfer_us, Some(1000.0));
        assert_eq!(read.status_us, Some(0.0));
        assert_eq!(read.total_us, Some(3000.0));
        assert_eq!(read.read_bytes, 8192);
        let write = &cmds[1];
        assert_eq!(write.dir, IoDir::Write);
        assert_eq!(write.immediate_bytes, 1024);
        assert_eq!(write.solicited_bytes, 7168);
        assert_eq!(write.r2t_wait_us, Some(2000.0));
        assert_eq!(write.transfer_us, Some(4500.0));
        assert_eq!(write.status_us, Some(1500.0));
        let waits: Vec<f64> = write.bursts.iter().map(|b| b.r2t_wait_us).collect();
        assert_eq!(waits, [2000.0, 2000.0]);
        assert_eq!(write.bursts[1].transfer_us, Some(1500.0));
        let rows = summary(&cmds);
        let service = rows
            .iter()
            .find(|r| r.dir == IoDir::Read && r.phase == "service")
            .expect("service row");
        assert_eq!((service.count, service.p50_us), (1, 2000.0));
        assert!(text(&cmds).contains("1024 bytes immediate"));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
