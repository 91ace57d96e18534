//! TCP reassembly, sans-IO: segments of one direction of a connection in capture order in,
//! contiguous byte chunks out, with the anomalies a capture shows: retransmissions (bytes
//! seen before), segments that arrive ahead of a hole (out of order), holes later filled
//! (a segment lost before the capture point and retransmitted), and holes never filled.

use std::collections::BTreeMap;

use serde::Serialize;

/// A run of contiguous stream bytes handed to the PDU framer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Stream offset of the first byte (0 = first byte after the SYN, or the first byte seen).
    pub offset: u64,
    pub data: Vec<u8>,
    /// Time the bytes became contiguous (the capture time of the segment that completed them).
    pub ts_ns: u64,
    /// Capture frame number of that segment.
    pub frame: u64,
    /// Bytes missing before this chunk (a hole that was given up on); the framer resyncs.
    pub gap_before: u64,
}

/// An anomaly found while reassembling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpEventKind {
    /// Payload bytes that had already been seen.
    Retransmission,
    /// A segment beyond a hole in the sequence space.
    OutOfOrder,
    /// A segment that filled a hole: the original was lost before the capture point.
    LostRetransmitted,
    /// A hole that was never filled (given up at the end or when the buffer limit was hit).
    Unrecovered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TcpEvent {
    pub kind: TcpEventKind,
    pub ts_ns: u64,
    pub frame: u64,
    pub offset: u64,
    pub len: u64,
}

/// Counters for one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HalfStats {
    pub segments: u64,
    pub payload_segments: u64,
    pub payload_bytes: u64,
    pub retransmissions: u64,
    pub retransmitted_bytes: u64,
    pub out_of_order: u64,
    pub lost_retransmitted: u64,
    pub unrecovered_bytes: u64,
}

/// Reassembler for one direction of a connection.
#[derive(Debug)]
pub struct HalfStream {
    /// Sequence number of stream offset 0.
    base_seq: Option<u32>,
    /// Next offset expected in order.
    next: u64,
    /// Segments held beyond a hole: offset -> (bytes, capture ts, frame).
    ahead: BTreeMap<u64, (Vec<u8>, u64, u64)>,
    /// What `ahead` costs, in bytes ([`held_cost`]).
    ahead_bytes: usize,
    limit: usize,
    /// Holes given up before the end because `ahead_bytes` passed `limit`.
    pub holes_given_up_at_limit: u64,
    pub stats: HalfStats,
    pub events: Vec<TcpEvent>,
}

/// Bytes held beyond a hole before the hole is declared unrecoverable.
pub const DEFAULT_AHEAD_LIMIT: usize = 64 << 20;

/// What holding a segment beyond a hole counts as at least: its map entry, timestamps and
/// allocation cost about this much, so that a stream of one-byte segments, each past a hole
/// of its own, cannot hold many times its limit in memory.
pub const MIN_HELD_COST: usize = 128;

/// What holding a segment of `len` payload bytes counts as.
fn held_cost(len: usize) -> usize {
    len.max(MIN_HELD_COST)
}

impl Default for HalfStream {
    fn default() -> Self {
        HalfStream::new(DEFAULT_AHEAD_LIMIT)
    }
}

impl HalfStream {
    pub fn new(limit: usize) -> HalfStream {
        HalfStream {
            base_seq: None,
            next: 0,
            ahead: BTreeMap::new(),
            ahead_bytes: 0,
            limit,
            holes_given_up_at_limit: 0,
            stats: HalfStats::default(),
            events: Vec::new(),
        }
    }

    /// The stream offset a sequence number stands for, relative to the expected one (so
    /// wrap-around of the 32-bit space is handled).
    fn offset_of(&self, seq: u32) -> Option<u64> {
        let base = self.base_seq?;
        let expected_seq = base.wrapping_add(self.next as u32);
        let delta = seq.wrapping_sub(expected_seq) as i32 as i64;
        let off = self.next as i64 + delta;
        (off >= 0).then_some(off as u64)
    }

    /// Feeds one segment of this direction; returns the chunks that became contiguous.
    pub fn push(
        &mut self,
        seq: u32,
        syn: bool,
        payload: &[u8],
        ts_ns: u64,
        frame: u64,
    ) -> Vec<Chunk> {
        self.stats.segments += 1;
        if syn {
            if self.base_seq.is_none() {
                self.base_seq = Some(seq.wrapping_add(1));
            }
            return Vec::new();
        }
        if payload.is_empty() {
            return Vec::new();
        }
        if self.base_seq.is_none() {
            // Capture started mid-stream: the first payload seen is offset 0.
            self.base_seq = Some(seq);
        }
        self.stats.payload_segments += 1;
        self.stats.payload_bytes += payload.len() as u64;
        let Some(off) = self.offset_of(seq) else {
            // Far behind offset 0: a retransmission of bytes from before the capture.
            self.retransmission(ts_ns, frame, 0, payload.len() as u64);
            return Vec::new();
        };
        let end = off + payload.len() as u64;
        let mut out = Vec::new();
        if end <= self.next {
            self.retransmission(ts_ns, frame, off, payload.len() as u64);
        } else if off > self.next && self.holds_ahead(off, payload.len()) {
            // A second copy of bytes already held past a hole: sent again, as tshark says.
            self.retransmission(ts_ns, frame, off, payload.len() as u64);
        } else if off > self.next {
            self.stats.out_of_order += 1;
            self.events.push(TcpEvent {
                kind: TcpEventKind::OutOfOrder,
                ts_ns,
                frame,
                offset: off,
                len: payload.len() as u64,
            });
            if !self.ahead.contains_key(&off) {
                self.ahead_bytes += held_cost(payload.len());
                self.ahead.insert(off, (payload.to_vec(), ts_ns, frame));
            }
            // One hole per segment taken: what is held stays within the limit and a segment.
            if self.ahead_bytes > self.limit {
                self.holes_given_up_at_limit += 1;
                out.extend(self.give_up_hole(ts_ns, frame));
            }
        } else {
            let filled_hole = !self.ahead.is_empty();
            if off < self.next {
                // Partly old bytes: count the overlap as retransmitted.
                self.retransmission(ts_ns, frame, off, self.next - off);
            }
            if filled_hole {
                self.stats.lost_retransmitted += 1;
                self.events.push(TcpEvent {
                    kind: TcpEventKind::LostRetransmitted,
                    ts_ns,
                    frame,
                    offset: self.next,
                    len: end - self.next,
                });
            }
            let skip = (self.next - off) as usize;
            out.push(Chunk {
                offset: self.next,
                data: payload[skip..].to_vec(),
                ts_ns,
                frame,
                gap_before: 0,
            });
            self.next = end;
            out.extend(self.drain_ahead(ts_ns, frame));
        }
        out
    }

    /// Whether a segment held past a hole starts at `off` and covers `len` bytes.
    fn holds_ahead(&self, off: u64, len: usize) -> bool {
        self.ahead
            .get(&off)
            .is_some_and(|(held, _, _)| held.len() >= len)
    }

    fn retransmission(&mut self, ts_ns: u64, frame: u64, offset: u64, len: u64) {
        self.stats.retransmissions += 1;
        self.stats.retransmitted_bytes += len;
        self.events.push(TcpEvent {
            kind: TcpEventKind::Retransmission,
            ts_ns,
            frame,
            offset,
            len,
        });
    }

    /// Moves held segments that are now contiguous into chunks.
    fn drain_ahead(&mut self, ts_ns: u64, frame: u64) -> Vec<Chunk> {
        let mut out = Vec::new();
        while let Some((&off, _)) = self.ahead.first_key_value() {
            if off > self.next {
                break;
            }
            let (data, _, _) = self.ahead.remove(&off).expect("key just seen");
            self.ahead_bytes -= held_cost(data.len());
            let end = off + data.len() as u64;
            if end <= self.next {
                continue;
            }
            let skip = (self.next - off) as usize;
            out.push(Chunk {
                offset: self.next,
                data: data[skip..].to_vec(),
                ts_ns,
                frame,
                gap_before: 0,
            });
            self.next = end;
        }
        out
    }

    /// Declares the first hole lost for good and continues after it.
    fn give_up_hole(&mut self, ts_ns: u64, frame: u64) -> Vec<Chunk> {
        let Some((&off, _)) = self.ahead.first_key_value() else {
            return Vec::new();
        };
        let gap = off - self.next;
        self.stats.unrecovered_bytes += gap;
        self.events.push(TcpEvent {
            kind: TcpEventKind::Unrecovered,
            ts_ns,
            frame,
            offset: self.next,
            len: gap,
        });
        self.next = off;
        let mut out = self.drain_ahead(ts_ns, frame);
        if let Some(first) = out.first_mut() {
            first.gap_before = gap;
        }
        out
    }

    /// End of capture: every hole left is unrecoverable; returns the bytes after them.
    pub fn finish(&mut self, ts_ns: u64, frame: u64) -> Vec<Chunk> {
        let mut out = Vec::new();
        // Each round removes at least one held segment.
        while !self.ahead.is_empty() {
            out.extend(self.give_up_hole(ts_ns, frame));
        }
        out
    }

    /// Next in-order stream offset.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// Bytes held beyond holes, waiting for them to fill (a segment shorter than
    /// [`MIN_HELD_COST`] counted as that many).
    pub fn ahead_bytes(&self) -> usize {
        self.ahead_bytes
    }

    /// Gives up the first hole (an [`TcpEventKind::Unrecovered`] event) before it is
    /// filled, as when this stream's own limit is hit: for a caller that bounds the bytes
    /// held across many streams. Returns the bytes after the hole that became contiguous.
    pub fn give_up_first_hole(&mut self, ts_ns: u64, frame: u64) -> Vec<Chunk> {
        self.give_up_hole(ts_ns, frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn collect(chunks: &[Chunk]) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.data.clone()).collect()
    }

    #[test]
    fn in_order_after_syn() {
        let mut h = HalfStream::default();
        assert!(h.push(999, true, &[], 0, 1).is_empty());
        let c = h.push(1000, false, b"abc", 1, 2);
        assert_eq!(c[0].offset, 0);
        let c2 = h.push(1003, false, b"de", 2, 3);
        assert_eq!(c2[0].offset, 3);
        assert_eq!(h.stats.retransmissions, 0);
    }

    #[test]
    fn lost_segment_then_retransmission() {
        let mut h = HalfStream::default();
        h.push(0, true, &[], 0, 1);
        let a = h.push(1, false, b"aaaa", 1, 2);
        // "bbbb" lost before the capture point; "cccc" arrives ahead of the hole.
        let c = h.push(9, false, b"cccc", 2, 3);
        assert!(c.is_empty());
        let b = h.push(5, false, b"bbbb", 9, 4);
        assert_eq!(collect(&[a, b.clone()].concat()), b"aaaabbbbcccc");
        assert_eq!(b.last().unwrap().ts_ns, 9);
        assert_eq!(h.stats.out_of_order, 1);
        assert_eq!(h.stats.lost_retransmitted, 1);
        assert_eq!(h.stats.retransmissions, 0);
        // A duplicate of already-delivered bytes is a retransmission.
        assert!(h.push(5, false, b"bbbb", 10, 5).is_empty());
        assert_eq!(h.stats.retransmissions, 1);
    }

    #[test]
    fn a_second_copy_of_bytes_held_past_a_hole_is_a_retransmission() {
        let mut h = HalfStream::default();
        h.push(0, true, &[], 0, 1);
        h.push(1, false, b"aaaa", 1, 2);
        // "bbbb" lost; "cccc" arrives ahead of the hole, then again (sent twice).
        assert!(h.push(9, false, b"cccc", 2, 3).is_empty());
        assert!(h.push(9, false, b"cccc", 3, 4).is_empty());
        assert_eq!(h.stats.out_of_order, 1);
        assert_eq!(h.stats.retransmissions, 1);
        let b = h.push(5, false, b"bbbb", 9, 5);
        assert_eq!(collect(&b), b"bbbbcccc");
    }

    #[test]
    fn sequence_wraps_around() {
        let mut h = HalfStream::default();
        h.push(u32::MAX - 1, true, &[], 0, 1);
        let a = h.push(u32::MAX, false, b"xy", 1, 2);
        let b = h.push(1, false, b"z", 2, 3);
        assert_eq!(collect(&[a, b].concat()), b"xyz");
    }

    #[test]
    fn unfilled_hole_is_reported_at_the_end() {
        let mut h = HalfStream::default();
        h.push(0, true, &[], 0, 1);
        h.push(1, false, b"aa", 1, 2);
        h.push(10, false, b"zz", 2, 3);
        let tail = h.finish(3, 4);
        assert_eq!(tail[0].gap_before, 7);
        assert_eq!(tail[0].offset, 9);
        assert_eq!(h.stats.unrecovered_bytes, 7);
    }

    proptest! {
        /// Any delivery order with duplicates reassembles to the original bytes.
        #[test]
        fn any_order_reassembles(len in 1usize..2000, cuts in proptest::collection::vec(1usize..300, 1..20),
                                 order in proptest::collection::vec(any::<u16>(), 0..40)) {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut segs = Vec::new();
            let mut at = 0;
            let mut ci = 0;
            while at < len {
                let n = cuts[ci % cuts.len()].min(len - at);
                segs.push((at, n));
                at += n;
                ci += 1;
            }
            // Shuffle deterministically from `order`, and add some duplicates.
            let mut sent = segs.clone();
            for (i, o) in order.iter().enumerate() {
                let a = *o as usize % sent.len();
                let b = i % sent.len();
                sent.swap(a, b);
                if o % 3 == 0 { sent.push(segs[a % segs.len()]); }
            }
            let mut h = HalfStream::default();
            h.push(4999, true, &[], 0, 0);
            let mut out = Vec::new();
            for (i, (off, n)) in sent.iter().enumerate() {
                for c in h.push(5000 + *off as u32, false, &data[*off..off + n], i as u64, i as u64) {
                    prop_assert_eq!(c.offset as usize, out.len());
                    out.extend(c.data);
                }
            }
            prop_assert_eq!(out, data);
        }
    }

    /// One-byte segments, each past a hole of its own: each is counted as
    /// [`MIN_HELD_COST`] bytes, so the segments held stay as few as the limit allows.
    #[test]
    fn tiny_segments_past_holes_count_at_their_cost() {
        let limit = 64 << 10;
        let mut h = HalfStream::new(limit);
        h.push(0, false, b"x", 0, 1);
        for i in 0..10_000u32 {
            h.push(2 + 2 * i, false, b"y", 0, 2 + u64::from(i));
            assert!(h.ahead_bytes() <= limit + MIN_HELD_COST);
        }
        assert!(
            h.ahead.len() <= limit / MIN_HELD_COST + 1,
            "{}",
            h.ahead.len()
        );
        assert!(h.holes_given_up_at_limit > 0);
    }
}
