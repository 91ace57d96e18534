//! The pipeline from frames to PDUs: finds iSCSI (and iSER) connections among the TCP
//! flows of a capture, reassembles both directions, frames the PDUs and numbers them.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use serde::Serialize;

use crate::capture::{tcp_segment, CaptureError, Frame, FrameReader, SynOptions, TcpSegment};
use iscsi_wire::{Bhs, Stage};

use crate::iscsi::{record, Dir, FramedPdu, FramerStats, PduFramer, PduRecord};
use crate::iser::{IserDecoder, RdmaXfer};
use crate::negotiated::Negotiated;
use crate::tcp::{Chunk, HalfStats, HalfStream, TcpEvent};

/// What to look for.
#[derive(Debug, Clone)]
pub struct Options {
    /// TCP ports iSCSI targets listen on.
    pub ports: Vec<u16>,
    /// Also take flows on other ports whose first bytes are a Login or an MPA request.
    pub detect_by_content: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ports: vec![3260],
            detect_by_content: true,
        }
    }
}

/// Bounds on what a capture can make the analysis hold, whatever the capture says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections (and undecided flows on other ports) one capture may open, each kept to
    /// the end; the segments of flows first seen past it are skipped and counted
    /// ([`Analysis::skipped_flows`]).
    pub max_flows: usize,
    /// Bytes held beyond holes across all connections: a segment that takes the total past
    /// it makes its stream give up its holes (reported as unrecovered) until the total is
    /// back within it.
    pub max_ahead_bytes: usize,
    /// Bytes one direction of one connection may hold beyond holes: past it the stream gives
    /// up its first hole (reported as unrecovered, and in [`Analysis::notes`]) and decoding
    /// goes on after it, so one peer's out-of-order data cannot take the whole of
    /// `max_ahead_bytes`.
    pub max_ahead_bytes_per_stream: usize,
}

impl Default for Limits {
    /// 65,536 flows; 256 MiB held ahead of holes, 64 MiB of it by one stream.
    fn default() -> Limits {
        Limits {
            max_flows: 1 << 16,
            max_ahead_bytes: 256 << 20,
            max_ahead_bytes_per_stream: crate::tcp::DEFAULT_AHEAD_LIMIT,
        }
    }
}

/// A payload-carrying packet, for idle-time and throughput arithmetic.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PacketMark {
    pub ts_ns: u64,
    pub dir: Dir,
    pub payload: u32,
    pub frame: u64,
    /// TCP sequence number of the first payload byte.
    pub seq: u32,
}

/// What a segment said about the other direction: how far it acknowledged and the window
/// it advertised (unscaled, as on the wire).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AckMark {
    pub ts_ns: u64,
    /// Direction of the segment carrying the acknowledgement.
    pub dir: Dir,
    pub ack: u32,
    pub window: u16,
}

/// One iSCSI or iSER connection.
#[derive(Debug, Clone, Serialize)]
pub struct Connection {
    pub id: usize,
    pub initiator: SocketAddr,
    pub target: SocketAddr,
    /// "tcp" or "iser".
    pub transport: &'static str,
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    pub to_target: HalfStats,
    pub to_initiator: HalfStats,
    pub framing_to_target: FramerStats,
    pub framing_to_initiator: FramerStats,
    pub header_digest: Option<bool>,
    pub data_digest: Option<bool>,
    pub pdus: usize,
    /// What the login in the capture settled (defaults apply to what it did not show).
    pub negotiated: Negotiated,
    #[serde(skip)]
    pub tcp_events: Vec<(Dir, TcpEvent)>,
    #[serde(skip)]
    pub packets: Vec<PacketMark>,
    #[serde(skip)]
    pub acks: Vec<AckMark>,
    /// The SYN of each direction (to the target, to the initiator), when captured with its
    /// options: the window scale each offered.
    #[serde(skip)]
    pub syn_options: [Option<SynOptions>; 2],
    /// iSER: the RDMA operations that moved command data, in capture order.
    #[serde(skip)]
    pub rdma: Vec<RdmaXfer>,
}

/// Everything found in one capture.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub frames: u64,
    pub tcp_segments: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub connections: Vec<Connection>,
    pub pdus: Vec<PduRecord>,
    /// Flows first seen after [`Limits::max_flows`] were tracked: their segments were
    /// skipped. Counted up to `max_flows` distinct flows (then [`Analysis::skipped_segments`]
    /// still counts).
    pub skipped_flows: u64,
    pub skipped_segments: u64,
    /// The most bytes held beyond holes at once, over all connections.
    pub ahead_peak_bytes: u64,
    /// What the analysis left out to stay within its [`Limits`], one line each.
    pub notes: Vec<String>,
}

enum Decoder {
    Iscsi(PduFramer),
    Iser(Box<IserDecoder>),
}

struct Half {
    stream: HalfStream,
    decoder: Option<Decoder>,
    saw_syn: bool,
}

struct ConnState {
    conn: Connection,
    halves: [Half; 2],
    records: Vec<PduRecord>,
}

fn idx(d: Dir) -> usize {
    match d {
        Dir::ToTarget => 0,
        Dir::ToInitiator => 1,
    }
}

fn flow_key(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

const MPA_REQ_KEY: &[u8] = b"MPA ID Req Frame";

/// Which end is the initiator, from the first segment of a flow; `None`: not iSCSI.
fn orient(seg: &TcpSegment, opts: &Options) -> Option<(SocketAddr, SocketAddr)> {
    let (s, d) = (seg.src, seg.dst);
    if opts.ports.contains(&d.port()) {
        return Some((s, d));
    }
    if opts.ports.contains(&s.port()) {
        return Some((d, s));
    }
    if seg.syn && !seg.has_ack {
        // Wait for content before deciding on a non-standard port.
        return None;
    }
    if !opts.detect_by_content {
        return None;
    }
    // An MPA Request is 20 bytes plus its private data (28 from Linux iSER): shorter than a BHS.
    if seg.payload.starts_with(MPA_REQ_KEY) {
        return Some((s, d));
    }
    if seg.payload.len() >= 48 {
        let op = seg.payload[0];
        if op == 0x43 && seg.payload[1] & 0x0c != 0x08 {
            return Some((s, d));
        }
        if op == 0x23 {
            return Some((d, s));
        }
    }
    None
}

/// Reads and analyzes a capture file, one frame at a time: the capture is never held whole
/// in memory.
pub fn analyze_file(path: &Path, opts: &Options) -> Result<Analysis, CaptureError> {
    analyze_file_within(path, opts, &Limits::default())
}

/// As [`analyze_file`], within `limits`.
pub fn analyze_file_within(
    path: &Path,
    opts: &Options,
    limits: &Limits,
) -> Result<Analysis, CaptureError> {
    let mut failed = None;
    let frames = FrameReader::open(path)?.map_while(|f| match f {
        Ok(frame) => Some(frame),
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    let analysis = analyze_each(frames, opts, limits);
    match failed {
        Some(e) => Err(e),
        None => Ok(analysis),
    }
}

/// Analyzes frames in capture order, within the default [`Limits`].
pub fn analyze_frames(frames: &[Frame], opts: &Options) -> Analysis {
    analyze_frames_within(frames, opts, &Limits::default())
}

/// Bytes held beyond holes over all connections, against [`Limits::max_ahead_bytes`].
struct AheadBudget {
    held: usize,
    peak: usize,
    max: usize,
}

/// As [`analyze_frames`], within `limits`.
pub fn analyze_frames_within(frames: &[Frame], opts: &Options, limits: &Limits) -> Analysis {
    analyze_each(frames.iter(), opts, limits)
}

/// Analyzes frames as they come, in capture order.
fn analyze_each<F: Borrow<Frame>>(
    frames: impl Iterator<Item = F>,
    opts: &Options,
    limits: &Limits,
) -> Analysis {
    let mut budget = AheadBudget {
        held: 0,
        peak: 0,
        max: limits.max_ahead_bytes,
    };
    let mut skipped: HashSet<(SocketAddr, SocketAddr)> = HashSet::new();
    let mut skipped_segments = 0u64;
    let mut conns: Vec<ConnState> = Vec::new();
    let mut by_flow: HashMap<(SocketAddr, SocketAddr), usize> = HashMap::new();
    // SYNs of flows on unknown ports, kept until content decides.
    let mut pending_syn: HashMap<(SocketAddr, SocketAddr), Vec<TcpSegment>> = HashMap::new();
    let mut rejected: HashSet<(SocketAddr, SocketAddr)> = HashSet::new();
    let mut tcp_segments = 0;
    let mut frame_count = 0u64;
    let mut times: Option<(u64, u64)> = None;
    for frame in frames {
        let frame = frame.borrow();
        frame_count += 1;
        times = Some(match times {
            None => (frame.ts_ns, frame.ts_ns),
            Some((first, last)) => (first.min(frame.ts_ns), last.max(frame.ts_ns)),
        });
        let Some(seg) = tcp_segment(frame) else {
            continue;
        };
        tcp_segments += 1;
        let key = flow_key(seg.src, seg.dst);
        // A new SYN on a known flow is a new connection reusing the ports.
        if seg.syn && !seg.has_ack {
            if let Some(i) = by_flow.remove(&key) {
                finish(&mut conns[i], &mut budget);
            }
            rejected.remove(&key);
        }
        let ci = match by_flow.get(&key) {
            Some(&i) => i,
            None => {
                if rejected.contains(&key) {
                    continue;
                }
                // Every new flow costs memory until the end (a connection's records, or
                // the undecided flow's segments): past the limit it is only counted.
                let tracked = conns.len() + pending_syn.len();
                if tracked >= limits.max_flows && !pending_syn.contains_key(&key) {
                    skipped_segments += 1;
                    if skipped.len() < limits.max_flows {
                        skipped.insert(key);
                    }
                    continue;
                }
                match orient(&seg, opts) {
                    Some((ini, tgt)) => {
                        let id = conns.len();
                        conns.push(new_conn(id, ini, tgt, seg.ts_ns, limits));
                        by_flow.insert(key, id);
                        for old in pending_syn.remove(&key).unwrap_or_default() {
                            feed(&mut conns[id], &old, &mut budget);
                        }
                        id
                    }
                    None => {
                        if seg.syn || seg.payload.is_empty() {
                            let held = pending_syn.entry(key).or_default();
                            // A handshake is three segments; a flow that sends nothing but
                            // empty ones has no more kept.
                            if held.len() < PENDING_SEGMENTS {
                                held.push(seg);
                            }
                        } else {
                            // Bounded like the flows: past the limit a rejected flow's
                            // segments are looked at again (orient is cheap).
                            if rejected.len() < limits.max_flows {
                                rejected.insert(key);
                            }
                            pending_syn.remove(&key);
                        }
                        continue;
                    }
                }
            }
        };
        feed(&mut conns[ci], &seg, &mut budget);
    }
    for c in conns.iter_mut() {
        finish(c, &mut budget);
    }
    let mut notes = Vec::new();
    if skipped_segments > 0 {
        let at_least = if skipped.len() >= limits.max_flows {
            "at least "
        } else {
            ""
        };
        notes.push(format!(
            "{at_least}{} flows ({skipped_segments} segments) skipped: more than {} flows in the capture",
            skipped.len(),
            limits.max_flows
        ));
    }
    let (start_ns, end_ns) = times.unwrap_or((0, 0));
    let mut pdus: Vec<PduRecord> = Vec::new();
    let mut connections = Vec::new();
    for mut c in conns {
        for (dir, h) in [
            (Dir::ToTarget, &c.halves[0]),
            (Dir::ToInitiator, &c.halves[1]),
        ] {
            let given_up = h.stream.holes_given_up_at_limit;
            if given_up > 0 {
                let towards = match dir {
                    Dir::ToTarget => "to the target",
                    Dir::ToInitiator => "to the initiator",
                };
                notes.push(format!(
                    "connection {} ({} -> {}), {towards}: {given_up} holes given up unfilled: \
                     more than {} bytes held beyond them (the per-stream limit)",
                    c.conn.id, c.conn.initiator, c.conn.target, limits.max_ahead_bytes_per_stream
                ));
            }
        }
        c.conn.pdus = c.records.len();
        pdus.append(&mut c.records);
        connections.push(c.conn);
    }
    pdus.sort_by_key(|p| (p.ts_ns, p.frame, p.conn, p.stream_offset));
    for (i, p) in pdus.iter_mut().enumerate() {
        p.index = i;
        p.time = p.ts_ns.saturating_sub(start_ns) as f64 / 1e9;
    }
    Analysis {
        frames: frame_count,
        tcp_segments,
        start_ns,
        end_ns,
        connections,
        pdus,
        skipped_flows: skipped.len() as u64,
        skipped_segments,
        ahead_peak_bytes: budget.peak as u64,
        notes,
    }
}

/// Segments kept of an undecided flow on another port (its handshake) before content
/// decides.
const PENDING_SEGMENTS: usize = 8;

fn new_conn(
    id: usize,
    initiator: SocketAddr,
    target: SocketAddr,
    ts: u64,
    limits: &Limits,
) -> ConnState {
    let half = || Half {
        stream: HalfStream::new(limits.max_ahead_bytes_per_stream),
        decoder: None,
        saw_syn: false,
    };
    ConnState {
        conn: Connection {
            id,
            initiator,
            target,
            transport: "tcp",
            first_ts_ns: ts,
            last_ts_ns: ts,
            to_target: HalfStats::default(),
            to_initiator: HalfStats::default(),
            framing_to_target: FramerStats::default(),
            framing_to_initiator: FramerStats::default(),
            header_digest: None,
            data_digest: None,
            pdus: 0,
            negotiated: Negotiated::default(),
            tcp_events: Vec::new(),
            packets: Vec::new(),
            acks: Vec::new(),
            syn_options: [None, None],
            rdma: Vec::new(),
        },
        halves: [half(), half()],
        records: Vec::new(),
    }
}

fn feed(c: &mut ConnState, seg: &TcpSegment, budget: &mut AheadBudget) {
    let dir = if seg.src == c.conn.initiator {
        Dir::ToTarget
    } else {
        Dir::ToInitiator
    };
    c.conn.last_ts_ns = c.conn.last_ts_ns.max(seg.ts_ns);
    c.conn.first_ts_ns = c.conn.first_ts_ns.min(seg.ts_ns);
    if !seg.payload.is_empty() {
        c.conn.packets.push(PacketMark {
            ts_ns: seg.ts_ns,
            dir,
            payload: seg.payload.len() as u32,
            frame: seg.frame,
            seq: seg.seq,
        });
    }
    if seg.has_ack {
        c.conn.acks.push(AckMark {
            ts_ns: seg.ts_ns,
            dir,
            ack: seg.ack,
            window: seg.window,
        });
    }
    if seg.syn_options.is_some() {
        c.conn.syn_options[idx(dir)] = seg.syn_options;
    }
    let h = &mut c.halves[idx(dir)];
    h.saw_syn |= seg.syn;
    let before = h.stream.ahead_bytes();
    let mut chunks = h
        .stream
        .push(seg.seq, seg.syn, &seg.payload, seg.ts_ns, seg.frame);
    budget.held = budget.held - before + h.stream.ahead_bytes();
    // The stream that takes the total past the limit lets go of its own holes: what it
    // held is bounded by the limit plus the one segment just taken.
    budget.peak = budget.peak.max(budget.held);
    while budget.held > budget.max && h.stream.ahead_bytes() > 0 {
        let before = h.stream.ahead_bytes();
        chunks.extend(h.stream.give_up_first_hole(seg.ts_ns, seg.frame));
        budget.held = budget.held - before + h.stream.ahead_bytes();
    }
    deliver(c, dir, chunks);
}

fn deliver(c: &mut ConnState, dir: Dir, chunks: Vec<Chunk>) {
    for chunk in chunks {
        let h = &mut c.halves[idx(dir)];
        if h.decoder.is_none() {
            let iser = chunk.offset == 0 && chunk.data.starts_with(b"MPA ID R");
            h.decoder = Some(if iser {
                c.conn.transport = "iser";
                Decoder::Iser(Box::new(IserDecoder::new(dir)))
            } else {
                let mut framer = PduFramer::new(h.saw_syn);
                if let Some((header, data)) = c.conn.negotiated.digests() {
                    framer.learn_digests(header, data);
                }
                Decoder::Iscsi(framer)
            });
        }
        let framed: Vec<FramedPdu> = match h.decoder.as_mut().expect("set above") {
            Decoder::Iscsi(f) => f.push(&chunk),
            Decoder::Iser(d) => {
                let framed = d.push(&chunk);
                c.conn.rdma.append(&mut d.xfers);
                framed
            }
        };
        take_records(c, dir, framed);
    }
}

/// Numbers nothing yet (the caller sorts and numbers all connections' PDUs); learns the
/// login's settled keys on the way, handing the digests to both framers once it completes.
fn take_records(c: &mut ConnState, dir: Dir, framed: Vec<FramedPdu>) {
    let transport = c.conn.transport;
    for p in framed {
        let mut r = record(c.conn.id, dir, &p);
        r.transport = transport;
        if let Some(pairs) = &r.text {
            if matches!(p.bhs, Bhs::LoginRequest(_) | Bhs::LoginResponse(_)) {
                c.conn.negotiated.login_seen = true;
                c.conn.negotiated.apply(dir, pairs);
            }
        }
        if let Bhs::LoginResponse(l) = &p.bhs {
            if l.transit && l.nsg == Stage::FullFeature && l.status_class == 0 {
                c.conn.negotiated.login_complete = true;
                learn_digests(c);
            }
        }
        c.records.push(r);
    }
}

fn learn_digests(c: &mut ConnState) {
    let Some((header, data)) = c.conn.negotiated.digests() else {
        return;
    };
    for h in &mut c.halves {
        if let Some(Decoder::Iscsi(f)) = &mut h.decoder {
            f.learn_digests(header, data);
        }
    }
}

fn finish(c: &mut ConnState, budget: &mut AheadBudget) {
    for dir in [Dir::ToTarget, Dir::ToInitiator] {
        let h = &mut c.halves[idx(dir)];
        budget.held -= h.stream.ahead_bytes();
        let chunks = h.stream.finish(c.conn.last_ts_ns, 0);
        deliver(c, dir, chunks);
        if let Some(Decoder::Iscsi(f)) = &mut c.halves[idx(dir)].decoder {
            let framed = f.finish();
            take_records(c, dir, framed);
        }
    }
    let [t, i] = &c.halves;
    c.conn.to_target = t.stream.stats;
    c.conn.to_initiator = i.stream.stats;
    c.conn.tcp_events = t
        .stream
        .events
        .iter()
        .map(|e| (Dir::ToTarget, *e))
        .chain(i.stream.events.iter().map(|e| (Dir::ToInitiator, *e)))
        .collect();
    c.conn.tcp_events.sort_by_key(|(_, e)| e.ts_ns);
    for (dir, h) in [(Dir::ToTarget, t), (Dir::ToInitiator, i)] {
        if let Some(Decoder::Iscsi(f)) = &h.decoder {
            match dir {
                Dir::ToTarget => c.conn.framing_to_target = f.stats,
                Dir::ToInitiator => c.conn.framing_to_initiator = f.stats,
            }
            let (hd, dd) = f.digests();
            c.conn.header_digest = c.conn.header_digest.or(hd);
            c.conn.data_digest = c.conn.data_digest.or(dd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::TcpEventKind;

    fn segment(payload: &[u8]) -> TcpSegment {
        TcpSegment {
            frame: 1,
            ts_ns: 0,
            src: "10.0.2.15:40000".parse().unwrap(),
            dst: "10.0.2.2:21093".parse().unwrap(),
            seq: 1,
            ack: 1,
            syn: false,
            fin: false,
            rst: false,
            has_ack: true,
            window: 100,
            syn_options: None,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn flows_on_other_ports_are_taken_by_their_first_bytes() {
        let opts = Options::default();
        // Linux iSER's MPA Request: 20 bytes and 8 of private data, shorter than a BHS.
        let mut mpa = MPA_REQ_KEY.to_vec();
        mpa.extend_from_slice(&[
            0x10, 0x02, 0x00, 0x08, 0x00, 0x80, 0x00, 0x01, 0x80, 0, 0, 0,
        ]);
        let seg = segment(&mpa);
        assert_eq!(orient(&seg, &opts), Some((seg.src, seg.dst)));
        let mut login = vec![0u8; 48];
        login[0] = 0x43;
        login[1] = 0x87;
        assert_eq!(orient(&segment(&login), &opts), Some((seg.src, seg.dst)));
        assert_eq!(orient(&segment(b"GET / HTTP/1.1"), &opts), None);
    }

    use iscsi_wire::{encode_pdu, Bhs, Pdu, ScsiCommand, ScsiResponse};
    use iwarp::ddp::{DdpHeader, Opcode, TaggedHeader, UntaggedHeader};

    fn fpdu(h: DdpHeader, payload: &[u8]) -> Vec<u8> {
        iwarp::fpdu::encode(&h.to_bytes(), payload, false)
    }

    /// One iSCSI PDU in an RDMA Send behind its iSER header.
    fn iser_send(msn: u32, header: iser::IserHeader, bhs: Bhs) -> Vec<u8> {
        let pdu = Pdu::new(bhs, bytes::Bytes::new());
        let mut msg = header.encode().to_vec();
        msg.extend(encode_pdu(&pdu, None, None));
        let h = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::Send,
            inv_stag: 0,
            qn: 0,
            msn,
            mo: 0,
        });
        fpdu(h, &msg)
    }

    fn mpa(key: &[u8]) -> Vec<u8> {
        let mut f = key.to_vec();
        f.extend_from_slice(&[0x00, 0x01, 0x00, 0x00]);
        f
    }

    fn iser_ends() -> (SocketAddr, SocketAddr) {
        (
            "10.0.2.15:40000".parse().unwrap(),
            "10.0.2.2:21093".parse().unwrap(),
        )
    }

    /// A 4 KiB READ (opcode 0x28) or WRITE (0x2a), the same opcode filling its CDB.
    fn command_4k(itt: u32, op: u8) -> Bhs {
        Bhs::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: true,
            read: op == 0x28,
            write: op == 0x2a,
            attr: 1,
            lun: 0,
            itt,
            expected_data_len: 4096,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: [op; 16],
        })
    }

    /// Frame `number`, captured at `number` µs.
    fn tcp_frame(number: u64, src: SocketAddr, dst: SocketAddr, seq: u32, payload: &[u8]) -> Frame {
        Frame {
            number,
            ts_ns: number * 1000,
            linktype: 1,
            data: pcap_trace::build_frame(src, dst, seq, 1, 0x18, payload),
        }
    }

    /// 3,000 flows to port 3260, each with 48 bytes and then 1,000 bytes beyond a 100-byte
    /// hole never filled. Within 2,000 flows and 256 KiB held beyond holes: 2,000 are
    /// tracked, the other 1,000 counted and skipped with one note, and the bytes held never
    /// pass the limit by more than one segment (the flows that would have passed it gave
    /// their holes up at once). Without limits all 3,000 hold their 1,000 bytes to the end.
    #[test]
    fn many_flows_with_holes_stay_within_the_limits() {
        let target: SocketAddr = "10.0.0.2:3260".parse().unwrap();
        let mut frames = Vec::new();
        for i in 0..3000u32 {
            let ini = SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 40000));
            let n = frames.len() as u64 + 1;
            frames.push(tcp_frame(n, ini, target, 1000, &[0; 48]));
            frames.push(tcp_frame(n + 1, ini, target, 1148, &[0x55; 1000]));
        }
        let limits = Limits {
            max_flows: 2000,
            max_ahead_bytes: 256 << 10,
            ..Limits::default()
        };
        let a = analyze_frames_within(&frames, &Options::default(), &limits);
        assert_eq!(a.connections.len(), 2000);
        assert_eq!((a.skipped_flows, a.skipped_segments), (1000, 2000));
        assert!(
            (256 << 10..=(256 << 10) + 1000).contains(&a.ahead_peak_bytes),
            "peak {}",
            a.ahead_peak_bytes
        );
        assert_eq!(a.notes.len(), 1, "{:?}", a.notes);
        assert_eq!(
            a.notes[0],
            "1000 flows (2000 segments) skipped: more than 2000 flows in the capture"
        );
        let listing = crate::listing::text(&a);
        assert!(listing
            .lines()
            .any(|l| l == format!("note: {}", a.notes[0])));
        // Holes given up before the end are reported at the segment that did it (those
        // left to the end carry frame 0).
        let early = a
            .connections
            .iter()
            .filter(|c| {
                c.tcp_events
                    .iter()
                    .any(|(_, e)| e.kind == TcpEventKind::Unrecovered && e.frame != 0)
            })
            .count();
        let fit = (256 << 10) / 1000;
        assert!((2000 - fit - 1..=2000 - fit).contains(&early), "{early}");
        assert!(a
            .connections
            .iter()
            .all(|c| c.to_target.unrecovered_bytes == 100));

        let unbounded = analyze_frames(&frames, &Options::default());
        assert_eq!(unbounded.connections.len(), 3000);
        assert_eq!(unbounded.ahead_peak_bytes, 3_000_000);
        assert!(unbounded.notes.is_empty() && unbounded.skipped_flows == 0);
    }

    /// SYNs of flows on other ports wait for content; past the flow limit they are skipped
    /// and counted too, so a capture of port scans holds at most `max_flows` of them (and
    /// counts distinct skipped flows up to as many).
    #[test]
    fn undecided_flows_count_against_the_flow_limit() {
        let target: SocketAddr = "10.0.0.2:5000".parse().unwrap();
        let frames: Vec<Frame> = (0..5000u32)
            .map(|i| Frame {
                number: i as u64 + 1,
                ts_ns: i as u64 * 1000,
                linktype: 1,
                data: pcap_trace::build_frame(
                    SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 40000)),
                    target,
                    7,
                    0,
                    0x02,
                    &[],
                ),
            })
            .collect();
        let limits = Limits {
            max_flows: 1000,
            max_ahead_bytes: 256 << 10,
            ..Limits::default()
        };
        let a = analyze_frames_within(&frames, &Options::default(), &limits);
        assert!(a.connections.is_empty());
        assert_eq!((a.skipped_flows, a.skipped_segments), (1000, 4000));
        assert_eq!(
            a.notes,
            ["at least 1000 flows (4000 segments) skipped: more than 1000 flows in the capture"]
        );
    }

    /// An iSER WRITE as Linux does it: the target RDMA-Reads the data from the command's Write
    /// STag into its own sink STag; the Read Request is the burst's R2T, the Read Response
    /// its data.
    #[test]
    fn an_iser_write_has_its_rdma_read_as_its_burst() {
        let command = command_4k(9, 0x2a);
        let header = iser::IserHeader {
            write: Some((0x88, 0x2000)),
            ..iser::IserHeader::CONTROL
        };
        let request = iwarp::rdmap::ReadRequest {
            sink_stag: 0x99,
            sink_to: 0,
            size: 4096,
            src_stag: 0x88,
            src_to: 0x2000,
        };
        let read_request = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::ReadRequest,
            inv_stag: 0,
            qn: iwarp::ddp::QN_READ_REQUEST,
            msn: 1,
            mo: 0,
        });
        let read_response = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag: 0x99,
            to: 0,
        });
        let status = Bhs::ScsiResponse(ScsiResponse {
            itt: 9,
            ..Default::default()
        });
        let (ini, tgt) = iser_ends();
        let mut cmd = mpa(b"MPA ID Req Frame");
        cmd.extend(iser_send(1, header, command));
        let mut rr = mpa(b"MPA ID Rep Frame");
        rr.extend(fpdu(read_request, &request.encode()));
        let data = fpdu(read_response, &[7u8; 4096]);
        let rsp = iser_send(1, iser::IserHeader::CONTROL, status);
        let frames = [
            tcp_frame(1, ini, tgt, 1, &cmd),
            tcp_frame(2, tgt, ini, 1, &rr),
            tcp_frame(3, ini, tgt, 1 + cmd.len() as u32, &data),
            tcp_frame(4, tgt, ini, 1 + rr.len() as u32, &rsp),
        ];
        let a = analyze_frames(&frames, &Options::default());
        let phases = crate::phases::command_phases(&a);
        assert_eq!(phases.len(), 1, "{:?}", a.pdus);
        let w = &phases[0];
        assert_eq!(w.dir, crate::phases::IoDir::Write);
        assert_eq!(w.r2t_wait_us, Some(1.0));
        assert_eq!(w.bursts.len(), 1);
        assert_eq!((w.bursts[0].desired_bytes, w.bursts[0].bytes), (4096, 4096));
        assert_eq!(w.transfer_us, Some(1.0));
        assert_eq!(w.status_us, Some(1.0));
        // The listing keeps one line for the Read Request, none for its response.
        let text = crate::listing::text(&a);
        assert_eq!(text.matches("RDMA Read Request").count(), 1, "{text}");
    }

    /// An iSER READ as Linux does it: the command's iSER header names the Read STag, the
    /// target RDMA-Writes the data there and answers with Send with Invalidate; the command's
    /// row counts the written bytes as its read data.
    #[test]
    fn an_iser_read_counts_the_rdma_write_to_its_read_stag() {
        let command = command_4k(7, 0x28);
        let header = iser::IserHeader {
            read: Some((0x77, 0x1000)),
            ..iser::IserHeader::CONTROL
        };
        let mut to_target = mpa(b"MPA ID Req Frame");
        to_target.extend(iser_send(1, header, command));
        let mut to_initiator = mpa(b"MPA ID Rep Frame");
        for (k, piece) in [0u64, 2048].into_iter().enumerate() {
            let h = DdpHeader::Tagged(TaggedHeader {
                last: k == 1,
                opcode: Opcode::RdmaWrite,
                stag: 0x77,
                to: 0x1000 + piece,
            });
            to_initiator.extend(fpdu(h, &[5u8; 2048]));
        }
        let rsp = Bhs::ScsiResponse(ScsiResponse {
            itt: 7,
            ..Default::default()
        });
        to_initiator.extend(iser_send(1, iser::IserHeader::CONTROL, rsp));
        let (ini, tgt) = iser_ends();
        let frames = [
            tcp_frame(1, ini, tgt, 1, &to_target),
            tcp_frame(2, tgt, ini, 1, &to_initiator),
        ];
        let a = analyze_frames(&frames, &Options::default());
        assert_eq!(a.connections.len(), 1);
        assert_eq!(a.connections[0].transport, "iser");
        let cmds = crate::stats::commands(&a, &crate::stats::StatsOptions::default());
        assert_eq!(cmds.len(), 1, "{:?}", a.pdus);
        assert_eq!(cmds[0].data_in_bytes, 4096);
        assert_eq!(cmds[0].status, Some(0));
        // The RDMA Writes are the READ's data phase: both in frame 2, 1 µs after the command.
        let phases = crate::phases::command_phases(&a);
        assert_eq!(phases[0].read_bytes, 4096);
        assert_eq!(phases[0].service_us, Some(1.0));
        assert_eq!(phases[0].transfer_us, Some(0.0));
        assert_eq!(a.pdus[0].read_stag, Some(0x77));
        // The listing names the buffer and puts the RDMA Write, tied to its command, between
        // the command and its response.
        let text = crate::listing::text(&a);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].contains("iSER read STag 0x00000077 VA 0x1000"),
            "{text}"
        );
        assert!(lines[1].contains("RDMA Write"), "{text}");
        assert!(
            lines[1].contains("4096 bytes in 2 segments | for ITT 0x00000007"),
            "{text}"
        );
        assert!(lines[2].contains("SCSI Response"), "{text}");
    }

    /// A capture file with two connections, one of which sends 200 segments of 1,000 bytes,
    /// each past a 100-byte hole of its own, while the other runs a READ. Read from the
    /// file with 64 KiB allowed per stream: the flooding direction gives up holes as it goes
    /// (one note says so) and never holds more than its limit and a segment; the other
    /// connection is decoded whole. Without the per-stream limit all 200,000 bytes are held
    /// to the end.
    #[test]
    fn one_stream_past_its_own_ahead_limit_gives_up_holes_and_the_rest_is_analyzed() {
        use crate::synthetic::{data_in, rw10, Synthetic};
        let flooder: SocketAddr = "10.9.9.9:50000".parse().unwrap();
        let target: SocketAddr = "10.0.0.2:3260".parse().unwrap();
        // Handshakes, so that each stream is framed from its first byte.
        let handshake = |ini: SocketAddr| {
            [(ini, target, 0x02), (target, ini, 0x12)].map(|(src, dst, flags)| Frame {
                number: 0,
                ts_ns: 0,
                linktype: 1,
                data: pcap_trace::build_frame(src, dst, 0, 0, flags, &[]),
            })
        };
        let mut reader = Synthetic::new();
        reader.pdu(0, rw10(1, false, 0, 8, 0), &[]);
        let mut frames = handshake("10.0.0.1:40000".parse().unwrap()).to_vec();
        frames.extend_from_slice(reader.frames());
        frames.extend(handshake(flooder));
        let first = iscsi_wire::encode_pdu(
            &iscsi_wire::Pdu::new(rw10(7, false, 0, 8, 0), bytes::Bytes::new()),
            None,
            None,
        );
        let n = frames.len() as u64 + 1;
        frames.push(tcp_frame(n, flooder, target, 1, &first));
        let mut seq = 1 + first.len() as u32;
        for _ in 0..200 {
            seq += 100;
            let n = frames.len() as u64 + 1;
            frames.push(tcp_frame(n, flooder, target, seq, &[0x55; 1000]));
            seq += 1000;
        }
        reader.pdu(frames.len() as u64 + 1, data_in(1, 0, true), &[0; 4096]);
        let answer = reader.frames().last().unwrap().clone();
        frames.push(answer);

        let path =
            std::env::temp_dir().join(format!("analyze-ahead-limit-{}.pcapng", std::process::id()));
        let mut w = pcap_trace::PcapngWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
        for f in &frames {
            w.write_frame(f.ts_ns, &f.data).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        let limits = Limits {
            max_ahead_bytes_per_stream: 64 << 10,
            ..Limits::default()
        };
        let a = analyze_file_within(&path, &Options::default(), &limits).expect("reads");
        let unbounded = analyze_file(&path, &Options::default()).expect("reads");
        let _ = std::fs::remove_file(&path);

        assert_eq!(a.frames, frames.len() as u64);
        assert_eq!(a.connections.len(), 2);
        assert_eq!(
            a.notes,
            [format!(
                "connection 1 ({flooder} -> {target}), to the target: {} holes given up \
                 unfilled: more than 65536 bytes held beyond them (the per-stream limit)",
                200 - (64 << 10) / 1000
            )]
        );
        assert!(
            a.ahead_peak_bytes <= (64 << 10) + 1000,
            "peak {}",
            a.ahead_peak_bytes
        );
        let pdus_of = |a: &Analysis, conn: usize| a.pdus.iter().filter(|p| p.conn == conn).count();
        assert_eq!(pdus_of(&a, 0), 2, "the READ and its Data-In");
        assert_eq!(a.connections[0].to_target.unrecovered_bytes, 0);
        assert_eq!(a.connections[1].to_target.unrecovered_bytes, 200 * 100);

        assert!(unbounded.notes.is_empty(), "{:?}", unbounded.notes);
        assert_eq!(unbounded.ahead_peak_bytes, 200 * 1000);
        assert_eq!(pdus_of(&unbounded, 0), 2);
    }
}
