//! Time series per connection, for plots and for reading a run's course in the JSON output:
//! commands outstanding (time-weighted mean in each bin) and data throughput per direction.

use serde::Serialize;

use crate::analysis::{Analysis, Connection};
use crate::iser::RdmaKind;
use crate::phases::CommandPhases;

/// Bins per connection at most.
const MAX_BINS: u64 = 200;
/// Narrowest bin.
const MIN_BIN_NS: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SeriesPoint {
    /// Start of the bin, seconds since the capture's first frame.
    pub t: f64,
    pub outstanding: f64,
    /// Read data (Data-In, RDMA Writes), MB/s.
    pub read_mbps: f64,
    /// Write data (immediate, Data-Out, RDMA Read Responses), MB/s.
    pub write_mbps: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConnectionSeries {
    pub conn: usize,
    pub bin_ms: f64,
    pub points: Vec<SeriesPoint>,
}

struct Bins {
    start_ns: u64,
    width_ns: u64,
    points: Vec<SeriesPoint>,
}

impl Bins {
    fn index(&self, ts_ns: u64) -> Option<usize> {
        let i = (ts_ns.checked_sub(self.start_ns)? / self.width_ns) as usize;
        (i < self.points.len()).then_some(i)
    }

    fn add_bytes(&mut self, ts_ns: u64, bytes: u64, read: bool) {
        let Some(i) = self.index(ts_ns) else { return };
        let mbps = bytes as f64 / (self.width_ns as f64 / 1e9) / 1e6;
        let p = &mut self.points[i];
        if read {
            p.read_mbps += mbps;
        } else {
            p.write_mbps += mbps;
        }
    }

    /// Adds a command outstanding over [from, to) to every bin it overlaps.
    fn add_interval(&mut self, from: u64, to: u64) {
        let Some(first) = self.index(from.max(self.start_ns)) else {
            return;
        };
        for i in first..self.points.len() {
            let lo = self.start_ns + i as u64 * self.width_ns;
            let hi = lo + self.width_ns;
            if lo >= to {
                break;
            }
            let overlap = to.min(hi).saturating_sub(from.max(lo));
            self.points[i].outstanding += overlap as f64 / self.width_ns as f64;
        }
    }
}

fn one(a: &Analysis, c: &Connection, cmds: &[&CommandPhases]) -> ConnectionSeries {
    let start = cmds
        .iter()
        .map(|k| k.start_ns)
        .min()
        .unwrap_or(c.first_ts_ns);
    // One past the last frame, so that its bytes fall in the last bin.
    let end = c.last_ts_ns.max(start) + 1;
    let width = ((end - start).div_ceil(MAX_BINS)).max(MIN_BIN_NS);
    let n = (end - start).div_ceil(width).max(1) as usize;
    let mut bins = Bins {
        start_ns: start,
        width_ns: width,
        points: (0..n)
            .map(|i| SeriesPoint {
                t: (start + i as u64 * width).saturating_sub(a.start_ns) as f64 / 1e9,
                ..SeriesPoint::default()
            })
            .collect(),
    };
    for k in cmds {
        bins.add_interval(k.start_ns, k.end_ns.unwrap_or(end));
    }
    for p in a.pdus.iter().filter(|p| p.conn == c.id) {
        match p.opcode {
            0x25 => bins.add_bytes(p.ts_ns, p.data_len as u64, true),
            0x01 | 0x05 => bins.add_bytes(p.ts_ns, p.data_len as u64, false),
            _ => {}
        }
    }
    for x in &c.rdma {
        match x.kind {
            RdmaKind::Write => bins.add_bytes(x.ts_ns, x.bytes, true),
            RdmaKind::ReadResponse => bins.add_bytes(x.ts_ns, x.bytes, false),
            RdmaKind::ReadRequest => {}
        }
    }
    ConnectionSeries {
        conn: c.id,
        bin_ms: width as f64 / 1e6,
        points: bins.points,
    }
}

/// One series per connection that carried a SCSI command.
pub fn connection_series(a: &Analysis, cmds: &[CommandPhases]) -> Vec<ConnectionSeries> {
    a.connections
        .iter()
        .filter_map(|c| {
            let mine: Vec<&CommandPhases> = cmds.iter().filter(|k| k.conn == c.id).collect();
            (!mine.is_empty()).then(|| one(a, c, &mine))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phases::command_phases;
    use crate::synthetic::{data_in, rw10, Synthetic};

    /// Two 4 KiB READs, each outstanding 2 ms of a 4 ms span, one after the other.
    #[test]
    fn outstanding_and_throughput_per_bin() {
        let four_k = vec![0u8; 4096];
        let a = Synthetic::new()
            .pdu(0, rw10(1, false, 0, 8, 0), &[])
            .pdu(2_000, data_in(1, 0, true), &four_k)
            .pdu(2_000, rw10(2, false, 8, 8, 0), &[])
            .pdu(4_000, data_in(2, 0, true), &four_k)
            .analysis();
        let series = connection_series(&a, &command_phases(&a));
        assert_eq!(series.len(), 1);
        let s = &series[0];
        assert_eq!(s.bin_ms, 1.0);
        let outstanding: Vec<f64> = s.points.iter().map(|p| p.outstanding).collect();
        assert_eq!(outstanding, [1.0, 1.0, 1.0, 1.0, 0.0]);
        let read: f64 = s.points.iter().map(|p| p.read_mbps).sum();
        // 8 KiB over bins of 1 ms: 4.096 MB/s in each of two bins.
        assert!((read - 8.192).abs() < 1e-9, "{read}");
    }
}
