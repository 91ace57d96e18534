//! Per-LUN counters: commands, bytes and latency by direction, and the commands running
//! now. Plain relaxed atomics, a few adds per command; an exporter reads them whole with
//! [`crate::Device::lun_stats`] (nothing here knows any metrics format).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cdb::op;

/// Upper bounds of the latency histogram's buckets, in microseconds (a last, unbounded
/// bucket follows): from a RAM LUN's tens of microseconds to a stalled disk's seconds.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// Which way a command moved data, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// READ(6/10/12/16).
    Read,
    /// WRITE(6/10/12/16) and WRITE AND VERIFY(10/12/16).
    Write,
    /// Everything else (INQUIRY, READ CAPACITY, SYNCHRONIZE CACHE, UNMAP, ...).
    Other,
}

impl Direction {
    /// The direction of a command with operation code `opcode`.
    pub fn of(opcode: u8) -> Direction {
        match opcode {
            op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => Direction::Read,
            op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_VERIFY_10
            | op::WRITE_VERIFY_12
            | op::WRITE_VERIFY_16 => Direction::Write,
            _ => Direction::Other,
        }
    }

    /// Every direction, in the order snapshots list them.
    pub const ALL: [Direction; 3] = [Direction::Read, Direction::Write, Direction::Other];

    /// Its name as a label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
            Direction::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A latency histogram of fixed buckets ([`LATENCY_BOUNDS_US`]), counts per bucket (not
/// cumulative) and the sum in nanoseconds.
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// One direction's counters.
#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
    latency: Histogram,
}

/// The counters of one LUN.
#[derive(Default)]
pub(crate) struct LunStats {
    by_direction: [Counters; 3],
    in_flight: AtomicU64,
}

impl LunStats {
    /// A command starts: it counts as in flight until the returned guard is finished or
    /// dropped (an `execute` future dropped midway counts no operation).
    pub fn start(&self) -> Running<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Running {
            stats: self,
            started: Instant::now(),
        }
    }

    pub fn snapshot(&self) -> LunStatsSnapshot {
        LunStatsSnapshot {
            directions: std::array::from_fn(|i| {
                let c = &self.by_direction[i];
                DirectionSnapshot {
                    direction: Direction::ALL[i],
                    ops: c.ops.load(Ordering::Relaxed),
                    bytes: c.bytes.load(Ordering::Relaxed),
                    latency: c.latency.snapshot(),
                }
            }),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }
}

/// A command in flight on a LUN (see [`LunStats::start`]).
pub(crate) struct Running<'a> {
    stats: &'a LunStats,
    started: Instant,
}

impl Running<'_> {
    /// The command ended, having moved `bytes` bytes `direction`.
    pub fn finish(self, direction: Direction, bytes: u64) {
        let c = &self.stats.by_direction[direction.index()];
        c.ops.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.latency.observe(self.started.elapsed());
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A latency histogram as read: counts per bucket of [`LATENCY_BOUNDS_US`] (the last one
/// unbounded; not cumulative) and the sum of all latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    pub sum_ns: u64,
}

impl LatencySnapshot {
    /// How many latencies were observed.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// One direction's counters as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectionSnapshot {
    pub direction: Direction,
    /// Commands that ended (whatever their status; aborted ones too).
    pub ops: u64,
    /// Bytes of data-in (reads, other) or data-out (writes) they carried.
    pub bytes: u64,
    /// Time from reaching the LUN to the response, queueing behind other tasks included.
    pub latency: LatencySnapshot,
}

/// A LUN's counters as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LunStatsSnapshot {
    /// Read, write, other (the order of [`Direction::ALL`]).
    pub directions: [DirectionSnapshot; 3],
    /// Commands on the LUN now: executing, or waiting for the task set or the backend.
    pub in_flight: u64,
}

impl LunStatsSnapshot {
    /// The counters of `direction`.
    pub fn of(&self, direction: Direction) -> &DirectionSnapshot {
        &self.directions[direction.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_follow_the_opcode() {
        assert_eq!(Direction::of(op::READ_10), Direction::Read);
        assert_eq!(Direction::of(op::READ_16), Direction::Read);
        assert_eq!(Direction::of(op::WRITE_6), Direction::Write);
        assert_eq!(Direction::of(op::WRITE_VERIFY_16), Direction::Write);
        assert_eq!(Direction::of(op::INQUIRY), Direction::Other);
        assert_eq!(Direction::of(op::SYNC_CACHE_10), Direction::Other);
    }

    #[test]
    fn latencies_fall_in_their_buckets_and_sum() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10)); // <= 50 us
        h.observe(Duration::from_micros(50)); // <= 50 us (bounds are inclusive)
        h.observe(Duration::from_micros(51)); // <= 100 us
        h.observe(Duration::from_millis(3)); // <= 5 ms
        h.observe(Duration::from_secs(7)); // past the last bound
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 2);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[6], 1);
        assert_eq!(s.buckets[LATENCY_BOUNDS_US.len()], 1);
        assert_eq!(s.count(), 5);
        assert_eq!(s.sum_ns, 7_003_111_000);
    }

    #[test]
    fn a_finished_command_counts_and_leaves_the_in_flight_gauge() {
        let stats = LunStats::default();
        let a = stats.start();
        let b = stats.start();
        assert_eq!(stats.snapshot().in_flight, 2);
        a.finish(Direction::Write, 4096);
        drop(b); // dropped midway: in flight no more, but no operation counted
        let s = stats.snapshot();
        assert_eq!(s.in_flight, 0);
        assert_eq!(s.of(Direction::Write).ops, 1);
        assert_eq!(s.of(Direction::Write).bytes, 4096);
        assert_eq!(s.of(Direction::Write).latency.count(), 1);
        assert_eq!(s.of(Direction::Read).ops, 0);
        assert_eq!(s.of(Direction::Other).ops, 0);
    }
}
