//! Writes a pcapng trace of the bytes an ironsan runtime sends and receives on its TCP
//! connections, as synthetic Ethernet/IPv4-or-IPv6/TCP frames with consistent sequence and
//! acknowledgement numbers, so that tshark and `ironsan analyze` decode them as if they had
//! been captured on the wire (iSCSI on port 3260), without capture privileges. Each traced
//! connection starts with a SYN/SYN-ACK/ACK handshake and ends with FINs, payloads longer
//! than one IP packet are split into several segments, and every frame carries correct IP and
//! TCP checksums.
//!
//! # Use from a runtime
//! ```no_run
//! use pcap_trace::{PduTrace, Side};
//! let trace = PduTrace::create("/tmp/target.pcapng").unwrap();
//! // one per accepted or connected socket: local and peer address as the socket reports them
//! let conn = trace.connection(
//!     "127.0.0.1:3260".parse().unwrap(),
//!     "127.0.0.1:40000".parse().unwrap(),
//!     Side::Accepted,
//! );
//! conn.sent(&[0u8; 48]); // bytes written to the socket (whole PDUs or parts, in order)
//! conn.received(&[0u8; 48]); // bytes read from the socket, in order
//! drop(conn); // writes the closing FINs
//! trace.flush().unwrap();
//! ```
//! `PduTrace` is cheap to clone and can be shared between threads; frames are written under
//! a mutex in the order the calls happen, stamped with the wall-clock time of the call.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

pub mod snap;
use snap::{Negotiated, PduSnap, Run};

/// Largest TCP payload put in one synthetic frame (keeps the IPv4 total length below 65535).
pub const MAX_SEGMENT_PAYLOAD: usize = 65_000;

const LINKTYPE_ETHERNET: u16 = 1;
const BT_SHB: u32 = 0x0A0D_0D0A;
const BT_IDB: u32 = 1;
const BT_EPB: u32 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;

/// Which end of the connection the tracing process is: it sets who sends the SYN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The process connected (an initiator): the local address sends the SYN.
    Connected,
    /// The process accepted (a target): the peer address sends the SYN.
    Accepted,
}

/// Serialises pcapng blocks to any writer. Most callers want [`PduTrace`] instead.
pub struct PcapngWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapngWriter<W> {
    /// Writes the Section Header Block and one Ethernet interface with nanosecond timestamps.
    pub fn new(mut out: W) -> io::Result<PcapngWriter<W>> {
        // Section Header Block: byte-order magic, version 1.0, section length unknown (-1).
        let mut shb = Vec::with_capacity(16);
        shb.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&(-1i64).to_le_bytes());
        write_block(&mut out, BT_SHB, &shb)?;
        // Interface Description Block: Ethernet, no snap limit, if_tsresol = 9 (ns).
        let mut idb = Vec::with_capacity(20);
        idb.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&0u32.to_le_bytes());
        idb.extend_from_slice(&9u16.to_le_bytes()); // option code if_tsresol
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&[9, 0, 0, 0]);
        idb.extend_from_slice(&[0, 0, 0, 0]); // opt_endofopt
        write_block(&mut out, BT_IDB, &idb)?;
        Ok(PcapngWriter { out })
    }

    /// Writes one Enhanced Packet Block holding `frame`, stamped `ts_ns` after the epoch.
    pub fn write_frame(&mut self, ts_ns: u64, frame: &[u8]) -> io::Result<()> {
        self.write_cut_frame(ts_ns, frame, frame.len())
    }

    /// Writes the first bytes of a frame of `original_len` bytes, as a snap length does.
    pub fn write_cut_frame(
        &mut self,
        ts_ns: u64,
        frame: &[u8],
        original_len: usize,
    ) -> io::Result<()> {
        let mut head = Vec::with_capacity(20);
        head.extend_from_slice(&0u32.to_le_bytes()); // interface 0
        head.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        head.extend_from_slice(&(ts_ns as u32).to_le_bytes());
        head.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        head.extend_from_slice(&(original_len as u32).to_le_bytes());
        let pad = (4 - frame.len() % 4) % 4;
        let total = 12 + head.len() + frame.len() + pad;
        self.out.write_all(&BT_EPB.to_le_bytes())?;
        self.out.write_all(&(total as u32).to_le_bytes())?;
        self.out.write_all(&head)?;
        self.out.write_all(frame)?;
        self.out.write_all(&[0u8; 3][..pad])?;
        self.out.write_all(&(total as u32).to_le_bytes())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

fn write_block<W: Write>(out: &mut W, block_type: u32, body: &[u8]) -> io::Result<()> {
    let total = (12 + body.len()) as u32;
    out.write_all(&block_type.to_le_bytes())?;
    out.write_all(&total.to_le_bytes())?;
    out.write_all(body)?;
    out.write_all(&total.to_le_bytes())
}

/// A pcapng trace file shared by all traced connections of a process.
#[derive(Clone)]
pub struct PduTrace {
    inner: Arc<Mutex<PcapngWriter<Box<dyn Write + Send>>>>,
    /// Bytes kept of each bulk data segment (None: everything); see [`snap`].
    snap: Option<usize>,
}

impl PduTrace {
    /// Creates (truncates) `path` and writes the pcapng headers.
    pub fn create(path: impl AsRef<Path>) -> io::Result<PduTrace> {
        let file = File::create(path)?;
        PduTrace::to_writer(Box::new(BufWriter::with_capacity(1 << 20, file)))
    }

    /// A trace written to any writer (tests use a `Vec<u8>` behind a shared handle).
    pub fn to_writer(out: Box<dyn Write + Send>) -> io::Result<PduTrace> {
        Ok(PduTrace {
            inner: Arc::new(Mutex::new(PcapngWriter::new(out)?)),
            snap: None,
        })
    }

    /// The same trace keeping only the first `bytes` of each SCSI Command's, Data-Out's and
    /// Data-In's data segment (0: headers only) on connections started from now on.
    pub fn with_snap(mut self, bytes: usize) -> PduTrace {
        self.snap = Some(bytes);
        self
    }

    fn lock(&self) -> MutexGuard<'_, PcapngWriter<Box<dyn Write + Send>>> {
        // A panic while holding the lock leaves a half-written block at worst; keep tracing.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts tracing one TCP connection; writes its three-way handshake.
    pub fn connection(&self, local: SocketAddr, peer: SocketAddr, side: Side) -> TraceConnection {
        let conn = TraceConnection {
            trace: self.clone(),
            state: Mutex::new(ConnState {
                local,
                peer,
                // Fixed initial sequence numbers keep traces reproducible.
                local_next: 1_000_000,
                peer_next: 2_000_000,
                closed: false,
                snap: self.snap.map(|n| SnapState {
                    sent: PduSnap::new(n),
                    received: PduSnap::new(n),
                    negotiated: Negotiated::default(),
                }),
            }),
        };
        conn.handshake(side);
        conn
    }

    /// Flushes buffered frames to the file.
    pub fn flush(&self) -> io::Result<()> {
        self.lock().flush()
    }
}

struct ConnState {
    local: SocketAddr,
    peer: SocketAddr,
    local_next: u32,
    peer_next: u32,
    closed: bool,
    snap: Option<SnapState>,
}

/// Both directions' PDU framing of a snapped connection.
struct SnapState {
    sent: PduSnap,
    received: PduSnap,
    negotiated: Negotiated,
}

/// One traced TCP connection. Dropping it writes the closing FIN exchange.
pub struct TraceConnection {
    trace: PduTrace,
    state: Mutex<ConnState>,
}

impl TraceConnection {
    fn state(&self) -> MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handshake(&self, side: Side) {
        let mut st = self.state();
        let from_local = side == Side::Connected;
        // SYN consumes one sequence number on each side.
        emit(&self.trace, &mut st, from_local, TCP_SYN, &[]);
        emit(&self.trace, &mut st, !from_local, TCP_SYN | TCP_ACK, &[]);
        emit(&self.trace, &mut st, from_local, TCP_ACK, &[]);
    }

    /// Records bytes this process wrote to the socket.
    pub fn sent(&self, bytes: &[u8]) {
        self.record(bytes, true);
    }

    /// Records bytes this process read from the socket.
    pub fn received(&self, bytes: &[u8]) {
        self.record(bytes, false);
    }

    /// Holds the connection's trace while the caller writes to its socket: bytes the peer
    /// sends in answer, read and recorded on another thread, then land after the bytes they
    /// answer (recording after the write alone would let them overtake).
    pub fn sending(&self) -> Sending<'_> {
        Sending {
            conn: self,
            st: self.state(),
        }
    }

    fn record(&self, bytes: &[u8], from_local: bool) {
        let mut st = self.state();
        self.record_locked(&mut st, bytes, from_local);
    }

    fn record_locked(&self, st: &mut ConnState, bytes: &[u8], from_local: bool) {
        let runs = match st.snap.as_mut() {
            Some(s) => {
                let dir = if from_local {
                    &mut s.sent
                } else {
                    &mut s.received
                };
                dir.split(bytes, &mut s.negotiated)
            }
            None => vec![Run {
                len: bytes.len(),
                kept: true,
            }],
        };
        for (kept, left_out) in frames(bytes, &runs) {
            emit_cut(&self.trace, st, from_local, kept, left_out);
        }
    }

    /// Writes the closing FINs now (also done on drop).
    pub fn close(&self) {
        let mut st = self.state();
        if st.closed {
            return;
        }
        st.closed = true;
        emit(&self.trace, &mut st, true, TCP_FIN | TCP_ACK, &[]);
        emit(&self.trace, &mut st, false, TCP_FIN | TCP_ACK, &[]);
        emit(&self.trace, &mut st, true, TCP_ACK, &[]);
    }
}

/// A write to a traced socket in progress (see [`TraceConnection::sending`]).
pub struct Sending<'a> {
    conn: &'a TraceConnection,
    st: MutexGuard<'a, ConnState>,
}

impl Sending<'_> {
    /// Records the bytes the write took.
    pub fn sent(mut self, bytes: &[u8]) {
        self.conn.record_locked(&mut self.st, bytes, true);
    }
}

impl Drop for TraceConnection {
    fn drop(&mut self) {
        self.close();
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Cuts recorded bytes into frames of at most [`MAX_SEGMENT_PAYLOAD`]: each frame's kept
/// bytes, then how many left-out bytes follow them in it (a frame can only lose its end).
fn frames<'a>(bytes: &'a [u8], runs: &[Run]) -> Vec<(&'a [u8], usize)> {
    let mut out = Vec::new();
    let (mut start, mut kept, mut left) = (0usize, 0usize, 0usize);
    for run in runs {
        let mut n = run.len;
        while n > 0 {
            if run.kept && left > 0 {
                out.push((&bytes[start..start + kept], left));
                (start, kept, left) = (start + kept + left, 0, 0);
            }
            let t = n.min(MAX_SEGMENT_PAYLOAD - kept - left);
            if run.kept {
                kept += t;
            } else {
                left += t;
            }
            n -= t;
            if kept + left == MAX_SEGMENT_PAYLOAD {
                out.push((&bytes[start..start + kept], left));
                (start, kept, left) = (start + kept + left, 0, 0);
            }
        }
    }
    if kept + left > 0 {
        out.push((&bytes[start..start + kept], left));
    }
    out
}

/// One data frame whose last `left_out` payload bytes are not in the trace (checksums as if
/// they were zero, which is how a reader fills them).
fn emit_cut(trace: &PduTrace, st: &mut ConnState, from_local: bool, kept: &[u8], left_out: usize) {
    let frame = frame_and_advance(st, from_local, TCP_ACK | TCP_PSH, kept, left_out);
    let _ = trace
        .lock()
        .write_cut_frame(now_ns(), &frame, frame.len() + left_out);
}

/// Builds and writes one frame; advances the sender's sequence number. Write errors are
/// dropped on purpose: tracing must never fail the I/O it observes.
fn emit(trace: &PduTrace, st: &mut ConnState, from_local: bool, flags: u8, payload: &[u8]) {
    let frame = frame_and_advance(st, from_local, flags, payload, 0);
    let _ = trace.lock().write_frame(now_ns(), &frame);
}

fn frame_and_advance(
    st: &mut ConnState,
    from_local: bool,
    flags: u8,
    payload: &[u8],
    left_out: usize,
) -> Vec<u8> {
    let (src, dst, seq, ack) = if from_local {
        (st.local, st.peer, st.local_next, st.peer_next)
    } else {
        (st.peer, st.local, st.peer_next, st.local_next)
    };
    let ack = if flags & TCP_ACK != 0 { ack } else { 0 };
    let frame = cut_frame(src, dst, seq, ack, flags, payload, left_out);
    let advance = (payload.len() + left_out) as u32 + u32::from(flags & (TCP_SYN | TCP_FIN) != 0);
    if from_local {
        st.local_next = st.local_next.wrapping_add(advance);
    } else {
        st.peer_next = st.peer_next.wrapping_add(advance);
    }
    frame
}

/// Internet checksum (RFC 1071) over `parts` concatenated.
fn inet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        let mut p: &[u8] = part;
        if let Some(hi) = odd.take() {
            if let Some((&lo, rest)) = p.split_first() {
                sum += u64::from(u16::from_be_bytes([hi, lo]));
                p = rest;
            } else {
                odd = Some(hi);
                continue;
            }
        }
        let mut words = p.chunks_exact(2);
        for w in &mut words {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = words.remainder() {
            odd = Some(*last);
        }
    }
    if let Some(hi) = odd {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Ethernet + IP + TCP frame for one segment. Mixed address families (which a real socket
/// never has) are traced as IPv6 with IPv4-mapped addresses.
pub fn build_frame(
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    cut_frame(src, dst, seq, ack, flags, payload, 0)
}

/// [`build_frame`] for a segment whose payload is `payload` followed by `left_out` bytes the
/// frame leaves out (a snap length): the headers count them, the checksum reads them as zeros
/// (which add nothing to it), the frame ends with `payload`.
fn cut_frame(
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
    left_out: usize,
) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20 + payload.len());
    tcp.extend_from_slice(&src.port().to_be_bytes());
    tcp.extend_from_slice(&dst.port().to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.push(5 << 4); // data offset: 5 words, no options
    tcp.push(flags);
    tcp.extend_from_slice(&0xffffu16.to_be_bytes()); // window
    tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    tcp.extend_from_slice(payload);
    let tcp_len = (tcp.len() + left_out) as u32;

    let mut frame = Vec::with_capacity(14 + 40 + tcp.len());
    // Locally administered MACs derived from nothing: both ends look alike, which is fine.
    frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01]);
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            frame.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = 64;
            ip[9] = 6;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = inet_checksum(&[&ip]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            let pseudo = [
                &s.octets()[..],
                &d.octets()[..],
                &[0, 6],
                &(tcp_len as u16).to_be_bytes(),
            ]
            .concat();
            let c = inet_checksum(&[&pseudo, &tcp]);
            tcp[16..18].copy_from_slice(&c.to_be_bytes());
            frame.extend_from_slice(&ip);
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            let (s, d) = (to6(s), to6(d));
            frame.extend_from_slice(&0x86DDu16.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            ip[6] = 6;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            let pseudo = [
                &s.octets()[..],
                &d.octets()[..],
                &tcp_len.to_be_bytes(),
                &[0, 0, 0, 6],
            ]
            .concat();
            let c = inet_checksum(&[&pseudo, &tcp]);
            tcp[16..18].copy_from_slice(&c.to_be_bytes());
            frame.extend_from_slice(&ip);
        }
    }
    frame.extend_from_slice(&tcp);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A `Write` whose bytes stay readable after the trace is done.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 section 3 example: sum of these words is 0xddf2, checksum its complement.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(inet_checksum(&[&data]), !0xddf2);
        // Split at an odd boundary gives the same result.
        assert_eq!(inet_checksum(&[&data[..3], &data[3..]]), !0xddf2);
    }

    #[test]
    fn ipv4_frame_checksums_verify() {
        let f = build_frame(
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:3260".parse().unwrap(),
            7,
            9,
            TCP_ACK,
            b"hello",
        );
        assert_eq!(f.len(), 14 + 20 + 20 + 5);
        // A correct IPv4 header sums to zero including its checksum.
        assert_eq!(inet_checksum(&[&f[14..34]]), 0);
        let pseudo = [&f[26..34], &[0, 6], &25u16.to_be_bytes()[..]].concat();
        assert_eq!(inet_checksum(&[&pseudo, &f[34..]]), 0);
    }

    #[test]
    fn sequence_numbers_follow_the_bytes() {
        let buf = Shared::default();
        let trace = PduTrace::to_writer(Box::new(buf.clone())).unwrap();
        let conn = trace.connection(
            "127.0.0.1:3260".parse().unwrap(),
            "127.0.0.1:40000".parse().unwrap(),
            Side::Accepted,
        );
        conn.received(&[1u8; 48]);
        conn.sent(&vec![2u8; MAX_SEGMENT_PAYLOAD + 10]);
        drop(conn);
        trace.flush().unwrap();
        let bytes = buf.0.lock().unwrap().clone();
        // Walk the blocks: SHB, IDB, then EPBs; collect (src port, seq, payload len).
        let mut at = 0;
        let mut segs = Vec::new();
        while at < bytes.len() {
            let bt = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            if bt == BT_EPB {
                let cap = u32::from_le_bytes(bytes[at + 20..at + 24].try_into().unwrap()) as usize;
                let f = &bytes[at + 28..at + 28 + cap];
                let sport = u16::from_be_bytes([f[34], f[35]]);
                let seq = u32::from_be_bytes(f[38..42].try_into().unwrap());
                segs.push((sport, seq, cap - 54, f[47]));
            }
            at += len;
        }
        // 3 handshake + 1 received + 2 sent + 3 closing frames.
        assert_eq!(segs.len(), 9);
        assert_eq!(segs[0], (40000, 2_000_000, 0, TCP_SYN)); // peer connects
        assert_eq!(segs[3], (40000, 2_000_001, 48, TCP_ACK | TCP_PSH));
        assert_eq!(
            segs[4],
            (3260, 1_000_001, MAX_SEGMENT_PAYLOAD, TCP_ACK | TCP_PSH)
        );
        assert_eq!(
            segs[5],
            (
                3260,
                1_000_001 + MAX_SEGMENT_PAYLOAD as u32,
                10,
                TCP_ACK | TCP_PSH
            )
        );
        assert_eq!(
            segs[6],
            (
                3260,
                1_000_011 + MAX_SEGMENT_PAYLOAD as u32,
                0,
                TCP_FIN | TCP_ACK
            )
        );
    }

    #[test]
    fn a_cut_frame_is_the_whole_frame_of_zeros_cut_short() {
        for (src, dst) in [
            ("10.0.0.1:40000", "10.0.0.2:3260"),
            ("[::1]:40000", "127.0.0.1:3260"),
        ] {
            let (src, dst) = (src.parse().unwrap(), dst.parse().unwrap());
            for kept in [&b"abc"[..], &b"abcd"[..]] {
                let whole = [kept, &[0u8; 1001][..]].concat();
                let full = build_frame(src, dst, 7, 9, TCP_ACK | TCP_PSH, &whole);
                let cut = cut_frame(src, dst, 7, 9, TCP_ACK | TCP_PSH, kept, 1001);
                assert_eq!(cut[..], full[..full.len() - 1001]);
            }
        }
    }
}
