//! TCP flow control as a capture shows it, for connections whose SYNs were captured with
//! their options (so the window scale is known): per direction of data, the window the
//! receiver advertised, the bytes in flight when each data segment left, and the round trip
//! from a data segment to the acknowledgement that covers it. ironsan's `--trace` files
//! carry no real acknowledgements or windows (their SYNs have no options) and are skipped.

use std::collections::VecDeque;

use serde::Serialize;

use crate::analysis::{AckMark, Connection, PacketMark};
use crate::iscsi::Dir;

/// A data segment counts as window-limited when the bytes in flight reach this part of the
/// advertised window, or when what is left of the window cannot take another segment as large
/// as the largest the sender has sent (with a large MSS a window fills in coarse steps).
const FULL_WINDOW: f64 = 0.9;

/// Flow control of one direction of data.
#[derive(Debug, Clone, Serialize)]
pub struct WindowStats {
    pub conn: usize,
    /// Direction of the data.
    pub dir: Dir,
    /// Data segments with an acknowledgement from the receiver before them.
    pub segments: usize,
    /// Of those, the ones sent with the receiver's window (nearly) full.
    pub window_limited: usize,
    /// The receiver's advertised window (scaled) at the data segments, mean, bytes.
    pub mean_window: f64,
    pub max_in_flight: u64,
    /// Smallest time from a data segment to the acknowledgement covering it.
    pub rtt_us: Option<f64>,
    /// Part of the time from the first data segment to the last that the sender spent
    /// after a segment that filled the window, waiting for the receiver to open it.
    pub limited_time_share: f64,
}

fn other(d: Dir) -> Dir {
    match d {
        Dir::ToTarget => Dir::ToInitiator,
        Dir::ToInitiator => Dir::ToTarget,
    }
}

/// The receiver's window scale: the shift it offered when both SYNs offered one (RFC 7323),
/// else 0; None when a SYN with options is missing.
fn receiver_scale(c: &Connection, data_dir: Dir) -> Option<u8> {
    let [to_target, to_initiator] = c.syn_options;
    let (to_target, to_initiator) = (to_target?, to_initiator?);
    let both = to_target.window_scale.is_some() && to_initiator.window_scale.is_some();
    let receiver = match data_dir {
        Dir::ToTarget => to_initiator,
        Dir::ToInitiator => to_target,
    };
    Some(if both {
        receiver.window_scale.unwrap_or(0).min(14)
    } else {
        0
    })
}

/// Flow control of both directions that carried data.
pub fn window_stats(c: &Connection) -> Vec<WindowStats> {
    [Dir::ToTarget, Dir::ToInitiator]
        .into_iter()
        .filter_map(|dir| {
            let s = walk(c, dir, None)?;
            (s.segments > 0).then_some(s)
        })
        .collect()
}

/// Bytes in flight and the receiver's advertised window at one data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FlightPoint {
    pub ts_ns: u64,
    pub in_flight: u64,
    /// Scaled to bytes.
    pub window: u64,
}

/// Flow control over time of one direction of data, for plots (the timeline's lanes).
#[derive(Debug, Clone, Serialize)]
pub struct FlightSeries {
    /// Direction of the data.
    pub dir: Dir,
    /// One point per data segment sent after the receiver's first acknowledgement.
    pub points: Vec<FlightPoint>,
}

/// [`window_stats`]' walk, keeping every segment's point: both directions that carried data,
/// on connections whose SYNs were captured with their options (none otherwise).
pub fn flight_series(c: &Connection) -> Vec<FlightSeries> {
    [Dir::ToTarget, Dir::ToInitiator]
        .into_iter()
        .filter_map(|dir| {
            let mut points = Vec::new();
            walk(c, dir, Some(&mut points))?;
            (!points.is_empty()).then_some(FlightSeries { dir, points })
        })
        .collect()
}

/// One direction of data on `c` with the receiver's acknowledgements (None: the SYNs with
/// their options were not captured).
fn walk(c: &Connection, dir: Dir, points: Option<&mut Vec<FlightPoint>>) -> Option<WindowStats> {
    let scale = receiver_scale(c, dir)?;
    let data: Vec<&PacketMark> = c.packets.iter().filter(|p| p.dir == dir).collect();
    let acks: Vec<&AckMark> = c.acks.iter().filter(|a| a.dir == other(dir)).collect();
    Some(follow(c.id, dir, &data, &acks, scale, points))
}

/// Walks data segments and the receiver's acknowledgements in time order.
fn follow(
    conn: usize,
    dir: Dir,
    data: &[&PacketMark],
    acks: &[&AckMark],
    scale: u8,
    mut points: Option<&mut Vec<FlightPoint>>,
) -> WindowStats {
    let mut s = WindowStats {
        conn,
        dir,
        segments: 0,
        window_limited: 0,
        mean_window: 0.0,
        max_in_flight: 0,
        rtt_us: None,
        limited_time_share: 0.0,
    };
    // The previous data segment: its time, and whether it filled the window.
    let mut prev: Option<(u64, bool)> = None;
    let mut limited_ns = 0u64;
    let mut next_ack = 0;
    let mut last: Option<&AckMark> = None;
    // Data not yet acknowledged: (sequence number after it, time sent).
    let mut unacked: VecDeque<(u32, u64)> = VecDeque::new();
    let mut window_sum = 0.0;
    let mut largest = 0u64;
    for p in data {
        largest = largest.max(u64::from(p.payload));
        while let Some(&a) = acks.get(next_ack).filter(|a| a.ts_ns <= p.ts_ns) {
            take_ack(a, &mut unacked, &mut s.rtt_us);
            last = Some(a);
            next_ack += 1;
        }
        let end = p.seq.wrapping_add(p.payload);
        unacked.push_back((end, p.ts_ns));
        let Some(a) = last else { continue };
        let in_flight = end.wrapping_sub(a.ack) as i32;
        let in_flight = in_flight.max(0) as u64;
        let window = (a.window as u64) << scale;
        s.segments += 1;
        window_sum += window as f64;
        s.max_in_flight = s.max_in_flight.max(in_flight);
        if let Some(v) = points.as_deref_mut() {
            v.push(FlightPoint {
                ts_ns: p.ts_ns,
                in_flight,
                window,
            });
        }
        let full = window > 0
            && (in_flight as f64 >= FULL_WINDOW * window as f64
                || window.saturating_sub(in_flight) < largest);
        if full {
            s.window_limited += 1;
        }
        if let Some((t, true)) = prev {
            limited_ns += p.ts_ns.saturating_sub(t);
        }
        prev = Some((p.ts_ns, full));
    }
    if let (Some(first), Some(last)) = (data.first(), data.last()) {
        let span = last.ts_ns.saturating_sub(first.ts_ns);
        if span > 0 {
            s.limited_time_share = limited_ns as f64 / span as f64;
        }
    }
    for a in &acks[next_ack..] {
        take_ack(a, &mut unacked, &mut s.rtt_us);
    }
    s.mean_window = window_sum / s.segments.max(1) as f64;
    s
}

/// An acknowledgement covers the oldest unacknowledged data it reaches: a round trip sample
/// for the newest of them (the segment that made the receiver answer).
fn take_ack(a: &AckMark, unacked: &mut VecDeque<(u32, u64)>, rtt_us: &mut Option<f64>) {
    let mut newest = None;
    while let Some(&(end, ts)) = unacked.front() {
        if (a.ack.wrapping_sub(end) as i32) < 0 {
            break;
        }
        newest = Some(ts);
        unacked.pop_front();
    }
    if let Some(ts) = newest {
        let sample = a.ts_ns.saturating_sub(ts) as f64 / 1e3;
        *rtt_us = Some(rtt_us.map_or(sample, |r: f64| r.min(sample)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{analyze_frames, Options};
    use crate::capture::Frame;
    use etherparse::{PacketBuilder, TcpOptionElement};

    /// One TCP segment of the test connection (10.0.0.1:40000 → 10.0.0.2:3260 or back).
    #[derive(Clone, Copy)]
    struct Segment {
        ts_us: u64,
        to_target: bool,
        seq: u32,
        /// 0: no ACK flag.
        ack: u32,
        window: u16,
        /// A SYN with MSS and window scale 2.
        syn: bool,
        len: usize,
    }

    fn push(frames: &mut Vec<Frame>, s: Segment) {
        let (ini, tgt) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let (src, dst, sport, dport) = if s.to_target {
            (ini, tgt, 40000, 3260)
        } else {
            (tgt, ini, 3260, 40000)
        };
        let mut b = PacketBuilder::ethernet2([0; 6], [0; 6])
            .ipv4(src, dst, 64)
            .tcp(sport, dport, s.seq, s.window);
        if s.ack != 0 {
            b = b.ack(s.ack);
        }
        if s.syn {
            b = b
                .syn()
                .options(&[
                    TcpOptionElement::MaximumSegmentSize(1460),
                    TcpOptionElement::WindowScale(2),
                ])
                .expect("options fit");
        }
        let payload = vec![0u8; s.len];
        let mut data = Vec::new();
        b.write(&mut data, &payload).expect("frame");
        frames.push(Frame {
            number: frames.len() as u64 + 1,
            ts_ns: s.ts_us * 1000,
            linktype: 1,
            data,
        });
    }

    /// The target sends 8 KiB segments into a 16 KiB window (4096 << 2) that the initiator
    /// opens again 10 ms later, twenty times.
    #[test]
    fn a_full_receive_window_is_seen_with_its_round_trip() {
        let seg = |ts_us, to_target, seq, ack, window, syn, len| Segment {
            ts_us,
            to_target,
            seq,
            ack,
            window,
            syn,
            len,
        };
        let mut frames = Vec::new();
        push(&mut frames, seg(0, true, 999, 0, 65535, true, 0));
        push(&mut frames, seg(10, false, 4999, 1000, 65535, true, 0));
        push(&mut frames, seg(20, true, 1000, 5000, 4096, false, 0));
        let (mut seq, mut t) = (5000u32, 100u64);
        for _ in 0..10 {
            for _ in 0..2 {
                push(&mut frames, seg(t, false, seq, 1000, 4096, false, 8192));
                seq += 8192;
            }
            t += 10_000;
            push(&mut frames, seg(t, true, 1000, seq, 4096, false, 0));
        }
        let a = analyze_frames(&frames, &Options::default());
        let stats = window_stats(&a.connections[0]);
        assert_eq!(stats.len(), 1, "{stats:?}");
        let s = &stats[0];
        assert_eq!(s.dir, Dir::ToInitiator);
        assert_eq!(s.segments, 20);
        assert_eq!(s.mean_window, 16384.0);
        assert_eq!(s.max_in_flight, 16384);
        assert_eq!(
            s.window_limited, 10,
            "the second segment of each pair fills it"
        );
        assert_eq!(s.rtt_us, Some(10_000.0));
        assert_eq!(
            s.limited_time_share, 1.0,
            "after every full window the sender waits for the next acknowledgement"
        );
        let series = flight_series(&a.connections[0]);
        assert_eq!(series.len(), 1);
        let pts = &series[0].points;
        assert_eq!(
            pts.len(),
            20,
            "one point per segment the window stats counted"
        );
        assert!(pts.iter().all(|p| p.window == 16384));
        // The pair's first segment leaves 8 KiB in flight, the second fills the window.
        assert_eq!(pts[0].in_flight, 8192);
        assert_eq!(pts[1].in_flight, 16384);
    }
}
