//! The progress engine: one per RNIC drives every connection (QP) with epoll through mio, on a
//! thread of its own or from its owner's event loop (`Driver`).
//! Per connection it runs the transmit side (work requests and Read Responses cut into FPDUs and
//! written with vectored writes straight from registered memory, or from a copy made with the
//! CRC when MPA CRC is on) and the receive side (bytes read ahead into a stage, FPDU headers
//! parsed with `iwarp` and checked, then short payloads copied from the stage and long ones
//! read from the socket directly into the target region). Each connection sits behind a lock
//! the engine serves it under; a poster may take it to run the transmit side on its own
//! thread (`TransmitInPlace`, see the crate's threading model).

use crate::mem::{AccessError, MrInner};
use crate::shared::{
    Attach, Cmd, EngineShared, Piece, PostedRecv, PostedSend, QpShared, TransmitInPlace, Wake,
};
use iwarp::crc::Crc32c;
use iwarp::ddp::{self, DdpHeader, Opcode, TaggedHeader, UntaggedHeader};
use iwarp::fpdu::{self, FpduLayout};
use iwarp::mpa::Rtr;
use iwarp::{ReadRequest, Terminate, TerminateCode};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use rdma::{Access, QpState, SendOp, Wc, WcOpcode, WcStatus};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

const WAKER: Token = Token(usize::MAX);
/// Keep about this much generated output queued ahead of the socket.
const OUT_HIGH_WATER: usize = 4 << 20;
/// Read at most this much per connection per turn, so one busy QP cannot starve the others.
const RX_TURN_BYTES: usize = 8 << 20;
const MAX_IOVECS: usize = 512;
/// Bytes a connection reads ahead of its receive state (see `Conn::stage`).
const STAGE_LEN: usize = 64 << 10;
/// Payloads at least this long, when nothing is staged, are read from the socket straight
/// into their destination; shorter ones are copied from the stage. Above the largest Send
/// iSER carries (8 KiB of data and its headers), so such a Send costs no read of its own;
/// below 16 KiB, so 16 KiB RDMA Read Responses are not staged. Measurements:
/// docs/performance-notes.md.
const DIRECT_MIN: usize = 12 << 10;
/// After a long FPDU, read ahead only this much: enough for the next FPDU's header (or a
/// small Send whole), not so much that a long payload after it lands in the stage, to be
/// copied from there instead of being read into its place.
const SHORT_LOOKAHEAD: usize = 256;
/// After our FIN, how long to wait for the peer's before closing anyway.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Starts an engine on its own progress thread, which goes on turning for `poll` after a turn
/// that found work before it sleeps in epoll (zero: it sleeps at once).
pub(crate) fn start(
    poll: Duration,
) -> std::io::Result<(Arc<EngineShared>, std::thread::JoinHandle<()>)> {
    let engine = Engine::new(None)?;
    let shared = engine.shared.clone();
    let handle = std::thread::Builder::new()
        .name("rnic-progress".into())
        .spawn(move || run(engine, poll))?;
    Ok((shared, handle))
}

fn run(mut engine: Engine, poll: Duration) {
    let mut busy_at = Instant::now();
    loop {
        let timeout = if !engine.again.is_empty() || busy_at.elapsed() < poll {
            Duration::ZERO
        } else {
            Driver::TICK
        };
        match engine.turn(timeout) {
            Turn::Stopped => return,
            Turn::More | Turn::Done => busy_at = Instant::now(),
            Turn::Idle => {}
        }
    }
}

/// What one engine turn left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The turn found nothing to do; nothing is left until a connection's socket is ready, a
    /// verb is posted or [`Driver::TICK`] has passed (closing connections wait for deadlines).
    Idle,
    /// The turn did what it found (events or posted verbs), and nothing is left for now.
    Done,
    /// Some connection has more to do now (a turn takes a bounded share of each).
    More,
    /// The RNIC was dropped (or its poller failed): the engine has ended every connection.
    Stopped,
}

/// A connection as the engine and posters share it: the engine serves it under this lock, a
/// poster may transmit in place under it (see [`TransmitInPlace`]).
type SharedConn = Arc<Mutex<Conn>>;

/// Locks a connection; a poster that panicked while transmitting left it as consistent as a
/// failed write would.
fn lock(c: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The engine's state: every attached connection and the poller they are registered with.
pub(crate) struct Engine {
    poll: Poll,
    events: Events,
    conns: HashMap<u32, SharedConn>,
    again: Vec<u32>,
    pub(crate) shared: Arc<EngineShared>,
}

/// Readiness events taken per turn.
const EVENTS_PER_TURN: usize = 256;

impl Engine {
    pub(crate) fn new(kick: Option<Box<dyn Fn() + Send + Sync>>) -> std::io::Result<Engine> {
        let poll = Poll::new()?;
        let wake = match kick {
            Some(kick) => Wake::Kick(kick),
            None => Wake::Thread(Waker::new(poll.registry(), WAKER)?),
        };
        let shared = Arc::new(EngineShared::new(wake));
        Ok(Engine {
            poll,
            events: Events::with_capacity(EVENTS_PER_TURN),
            conns: HashMap::new(),
            again: Vec::new(),
            shared,
        })
    }

    pub(crate) fn poll_fd(&self) -> RawFd {
        self.poll.as_raw_fd()
    }

    /// Waits up to `timeout` for readiness, then takes posted commands and serves every
    /// connection that is ready or had more to do.
    pub(crate) fn turn(&mut self, timeout: Duration) -> Turn {
        if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!("RNIC progress engine: polling failed: {e}");
                self.stop("RNIC poller failed");
                return Turn::Stopped;
            }
        }
        let mut ready: Vec<u32> = std::mem::take(&mut self.again);
        let mut events = 0;
        for ev in self.events.iter() {
            events += 1;
            if ev.token() != WAKER {
                ready.push(ev.token().0 as u32);
            }
        }
        // A full batch of events may have left some behind.
        let events_left = events == EVENTS_PER_TURN;
        let cmds = self.shared.take_cmds();
        let worked = events > 0 || !cmds.is_empty();
        for cmd in cmds {
            if !self.command(cmd, &mut ready) {
                return Turn::Stopped;
            }
        }
        ready.sort_unstable();
        ready.dedup();
        let now = Instant::now();
        for (n, c) in self.conns.iter() {
            // A connection a poster holds is looked at next turn (a deadline is not urgent).
            let due = c
                .try_lock()
                .is_ok_and(|c| c.close_deadline.is_some_and(|d| now >= d));
            if due && !ready.contains(n) {
                ready.push(*n);
            }
        }
        for n in ready {
            let Some(shared) = self.conns.get(&n) else {
                continue;
            };
            let mut c = lock(shared);
            let more = c.service();
            if c.finished() {
                let _ = self.poll.registry().deregister(&mut c.sock);
                drop(c);
                self.conns.remove(&n);
            } else if more {
                self.again.push(n);
            }
        }
        if !self.again.is_empty() || events_left {
            Turn::More
        } else if worked {
            Turn::Done
        } else {
            Turn::Idle
        }
    }

    fn stop(&mut self, why: &str) {
        for (_, c) in self.conns.drain() {
            lock(&c).fail(None, Some(why.into()));
        }
    }

    /// Carries out one posted command; false once it stopped the engine.
    fn command(&mut self, cmd: Cmd, ready: &mut Vec<u32>) -> bool {
        match cmd {
            Cmd::Stop => {
                self.stop("RNIC stopped");
                return false;
            }
            Cmd::Attach(a) => {
                let num = a.qp.num;
                let align_on_loopback = self.shared.align_on_loopback.load(Ordering::Relaxed);
                match Conn::new(*a, &self.poll, align_on_loopback) {
                    Ok(c) => {
                        let qp = c.qp.clone();
                        let c = Arc::new(Mutex::new(c));
                        let tx: Weak<dyn TransmitInPlace> = Arc::downgrade(&c) as _;
                        let _ = qp.in_place.set(tx);
                        self.conns.insert(num, c);
                        ready.push(num);
                    }
                    Err((qp, e)) => qp.flush_all(Some(format!("attach failed: {e}"))),
                }
            }
            Cmd::Kick(n) => {
                if let Some(c) = self.conns.get(&n) {
                    lock(c).qp.kick.store(false, Ordering::Release);
                    ready.push(n);
                }
            }
            Cmd::Disconnect(n) => {
                if let Some(c) = self.conns.get(&n) {
                    lock(c).closing = true;
                    ready.push(n);
                }
            }
            Cmd::Reset(n) => {
                if let Some(c) = self.conns.get(&n) {
                    let mut c = lock(c);
                    c.fail(None, Some("connection aborted".into()));
                    // Not waiting for the output queue to drain: the peer may never take it.
                    c.finish();
                    ready.push(n);
                }
            }
            Cmd::Fail(n, why) => {
                if let Some(c) = self.conns.get(&n) {
                    lock(c).fail(None, Some(why));
                    ready.push(n);
                }
            }
            Cmd::Abort(n) => {
                if let Some(c) = self.conns.remove(&n) {
                    let mut c = lock(&c);
                    c.fail(None, Some("QP destroyed".into()));
                    let _ = self.poll.registry().deregister(&mut c.sock);
                }
            }
        }
        true
    }
}

/// Runs an RNIC's engine from its owner's event loop instead of a thread of its own (see
/// [`crate::Rnic::new_driven`]): the owner calls [`Driver::turn`] when [`Driver::fd`] is
/// readable, when the RNIC's kick is called, after a turn that returned [`Turn::More`], and at
/// least every [`Driver::TICK`]. Verbs posted from that loop then reach the engine, and the
/// engine's completions reach their pollers, without a thread switch.
pub struct Driver {
    engine: Engine,
}

impl Driver {
    /// The longest a driven engine may go without a turn (closing connections keep
    /// deadlines).
    pub const TICK: Duration = Duration::from_millis(100);

    pub(crate) fn new(engine: Engine) -> Driver {
        Driver { engine }
    }

    /// A descriptor (the engine's epoll) that becomes readable when a connection has I/O.
    pub fn fd(&self) -> RawFd {
        self.engine.poll_fd()
    }

    /// One pass over whatever is ready; never blocks.
    pub fn turn(&mut self) -> Turn {
        self.engine.turn(Duration::ZERO)
    }
}

enum Chunk {
    Bytes(Vec<u8>),
    Mem(Arc<MrInner>, usize, usize),
    /// An FPDU's last bytes (pad and CRC): the FPDU ends here.
    Tail(Vec<u8>),
    Done(Wc),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Bytes(b) | Chunk::Tail(b) => b.len(),
            Chunk::Mem(_, _, l) => *l,
            Chunk::Done(_) => 0,
        }
    }
}

/// One outbound message being cut into FPDUs.
struct TxMsg {
    opcode: Opcode,
    /// Tagged: (STag, TO of byte 0). Untagged: (RsvdULP, QN, MSN).
    tagged: Option<(u32, u64)>,
    untagged: Option<(u32, u32, u32)>,
    /// Bytes after the DDP header that are part of the header (Read Request / Terminate body).
    body: Vec<u8>,
    pieces: Vec<Piece>,
    total: usize,
    sent: usize,
    piece_idx: usize,
    piece_off: usize,
    done: Option<Wc>,
    started: bool,
}

struct OrqEntry {
    wr_id: u64,
    sink_stag: u32,
    sink_to: u64,
    len: usize,
    placed: usize,
    signaled: bool,
}

/// Where the current segment's payload goes.
enum Dst {
    None,
    Region { mr: Arc<MrInner>, off: usize },
    Recv,
    Scratch(Vec<u8>),
}

/// What to do once the segment's trailer (CRC) checks out.
enum OnDone {
    Nothing,
    RecvSegment {
        last: bool,
        inv: Option<u32>,
        solicited: bool,
    },
    ReadResponseSegment {
        last: bool,
        bytes: usize,
    },
    ReadRequest(ReadRequest),
    Terminate,
}

enum Rx {
    Header { need: usize },
    Payload { left: usize },
    Trailer { need: usize },
}

struct RecvInProgress {
    posted: PostedRecv,
    placed: usize,
    msn: u32,
}

struct Conn {
    qp: Arc<QpShared>,
    sock: TcpStream,
    fd: RawFd,
    crc: bool,
    ird: usize,
    ord: usize,
    budget: usize,
    /// Each FPDU ends its own TCP segment (MSG_EOR). Off on loopback unless asked for: there
    /// segments are only the kernel's buffers, and packing FPDUs into them is faster (fewer,
    /// larger buffers). Captures of a loopback hop (a local proxy such as qemu's user-mode
    /// network) want it on, for dissectors that expect an FPDU at each segment's start.
    align_fpdus: bool,
    // transmit
    out: VecDeque<Chunk>,
    out_bytes: usize,
    front_pos: usize,
    cur: Option<TxMsg>,
    irq: VecDeque<TxMsg>,
    orq: VecDeque<OrqEntry>,
    send_msn: u32,
    rreq_msn: u32,
    hold_tx: bool,
    // receive
    rx: Rx,
    ctl: [u8; 96],
    ctl_have: usize,
    /// Bytes read from the socket ahead of the receive state: one read takes whatever has
    /// arrived (many small FPDUs at once), and headers, trailers and small payloads are
    /// taken from here. `stage[stage_pos..stage_len]` is unconsumed.
    stage: Box<[u8]>,
    stage_pos: usize,
    stage_len: usize,
    /// How much one read into the stage asks for: all of it while FPDUs are short,
    /// [`SHORT_LOOKAHEAD`] after a long one.
    lookahead: usize,
    hdr_len: usize,
    dst: Dst,
    recv_cur: Option<RecvInProgress>,
    rx_crc: Crc32c,
    seg_len: usize,
    on_done: OnDone,
    rx_send_msn: u32,
    rx_rreq_msn: u32,
    // lifecycle
    closing: bool,
    fin_sent: bool,
    close_deadline: Option<Instant>,
    errored: bool,
    done: bool,
}

impl Conn {
    fn new(
        a: Attach,
        poll: &Poll,
        align_on_loopback: bool,
    ) -> Result<Conn, (Arc<QpShared>, std::io::Error)> {
        let Attach {
            qp,
            stream,
            crc,
            ird,
            ord,
            send_rtr,
            hold_tx,
        } = a;
        let setup = || -> std::io::Result<(TcpStream, usize, bool)> {
            stream.set_nonblocking(true)?;
            stream.set_nodelay(true)?;
            let mss = tcp_mss(stream.as_raw_fd()).unwrap_or(1460);
            let peer_is_loopback = stream.peer_addr()?.ip().is_loopback();
            let mut sock = TcpStream::from_std(stream);
            poll.registry().register(
                &mut sock,
                Token(qp.num as usize),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            Ok((sock, mss, peer_is_loopback))
        };
        let (sock, mss, peer_is_loopback) = match setup() {
            Ok(v) => v,
            Err(e) => return Err((qp, e)),
        };
        let fd = sock.as_raw_fd();
        let mut c = Conn {
            qp,
            sock,
            fd,
            crc,
            ird: ird as usize,
            ord: ord.max(1) as usize,
            // siw sizes FPDUs to the MSS rounded down to a multiple of 8.
            budget: (mss & !7).max(64),
            align_fpdus: align_on_loopback || !peer_is_loopback,
            out: VecDeque::new(),
            out_bytes: 0,
            front_pos: 0,
            cur: None,
            irq: VecDeque::new(),
            orq: VecDeque::new(),
            send_msn: 0,
            rreq_msn: 0,
            hold_tx,
            rx: Rx::Header { need: 16 },
            ctl: [0; 96],
            ctl_have: 0,
            stage: vec![0; STAGE_LEN].into_boxed_slice(),
            stage_pos: 0,
            stage_len: 0,
            lookahead: STAGE_LEN,
            hdr_len: 0,
            dst: Dst::None,
            recv_cur: None,
            rx_crc: Crc32c::new(),
            seg_len: 0,
            on_done: OnDone::Nothing,
            rx_send_msn: 1,
            rx_rreq_msn: 1,
            closing: false,
            fin_sent: false,
            close_deadline: None,
            errored: false,
            done: false,
        };
        if let Some(rtr) = send_rtr {
            let msg = match rtr {
                Rtr::Read => {
                    c.rreq_msn += 1;
                    let body = ReadRequest {
                        sink_stag: 1,
                        sink_to: 0,
                        size: 0,
                        src_stag: 1,
                        src_to: 0,
                    }
                    .encode()
                    .to_vec();
                    TxMsg::control(
                        Opcode::ReadRequest,
                        None,
                        Some((0, ddp::QN_READ_REQUEST, c.rreq_msn)),
                        body,
                    )
                }
                _ => TxMsg::control(Opcode::RdmaWrite, Some((1, 0)), None, Vec::new()),
            };
            c.push_msg_fpdus(msg);
        }
        c.qp.q.lock().unwrap().attached = true;
        Ok(c)
    }

    fn finished(&self) -> bool {
        self.done
    }

    /// Runs both directions; returns true if there is more to do right away.
    fn service(&mut self) -> bool {
        if self.done {
            return false;
        }
        let more_rx = self.receive();
        if !self.done {
            self.transmit();
        }
        if let Some(d) = self.close_deadline {
            if Instant::now() >= d && !self.done {
                self.fail(None, Some("peer did not close in time".into()));
                self.finish();
            }
        }
        more_rx && !self.done
    }

    // ---------------------------------------------------------------- transmit

    fn transmit(&mut self) {
        loop {
            if !self.errored {
                self.refill();
            }
            match self.write_out() {
                WriteResult::Drained => {
                    if self.errored {
                        self.finish();
                        return;
                    }
                    if self.cur.is_none() && self.irq.is_empty() && !self.sq_has_work() {
                        if self.closing && !self.fin_sent && self.orq.is_empty() {
                            let _ = self.sock.shutdown(std::net::Shutdown::Write);
                            self.fin_sent = true;
                            self.close_deadline = Some(Instant::now() + CLOSE_GRACE);
                        }
                        return;
                    }
                    if self.out.is_empty() && !self.can_make_progress() {
                        return;
                    }
                }
                WriteResult::Blocked => return,
                WriteResult::Failed(e) => {
                    // A peer that sent a Terminate closes right after it: read what it sent
                    // first, so the QP reports the Terminate rather than the broken pipe.
                    if !self.errored {
                        let _ = self.receive();
                    }
                    self.fail(None, Some(format!("send failed: {e}")));
                    self.finish();
                    return;
                }
            }
        }
    }

    /// Nothing left to write and nothing to generate: the engine need not be woken for the
    /// transmit side.
    fn tx_idle(&self) -> bool {
        !self.done
            && !self.errored
            && self.out.is_empty()
            && self.cur.is_none()
            && self.irq.is_empty()
            && !self.sq_has_work()
    }

    fn sq_has_work(&self) -> bool {
        !self.hold_tx && !self.qp.q.lock().unwrap().sq.is_empty()
    }

    fn can_make_progress(&self) -> bool {
        if self.cur.is_some() || !self.irq.is_empty() {
            return true;
        }
        if self.hold_tx {
            return false;
        }
        let q = self.qp.q.lock().unwrap();
        match q.sq.front() {
            Some(s) if matches!(s.op, SendOp::RdmaRead { .. }) => self.orq.len() < self.ord,
            Some(_) => true,
            None => false,
        }
    }

    /// Generates FPDUs until the output queue is comfortably full or nothing is ready.
    fn refill(&mut self) {
        while self.out_bytes < OUT_HIGH_WATER {
            if self.cur.is_none() {
                if let Some(m) = self.irq.pop_front() {
                    self.cur = Some(m);
                } else if !self.hold_tx {
                    match self.next_from_sq() {
                        Some(m) => self.cur = Some(m),
                        None => return,
                    }
                } else {
                    return;
                }
            }
            let mut m = self.cur.take().unwrap();
            let finished = self.push_fpdu(&mut m);
            if !finished {
                self.cur = Some(m);
            }
        }
    }

    fn next_from_sq(&mut self) -> Option<TxMsg> {
        let p: PostedSend = {
            let mut q = self.qp.q.lock().unwrap();
            let front = q.sq.front()?;
            if matches!(front.op, SendOp::RdmaRead { .. }) && self.orq.len() >= self.ord {
                return None;
            }
            q.sq.pop_front()?
        };
        let wc = |op| self.qp.wc(p.wr_id, WcStatus::Success, op, p.total);
        let msg = match p.op {
            SendOp::Send
            | SendOp::SendSe
            | SendOp::SendInvalidate { .. }
            | SendOp::SendSeInvalidate { .. } => {
                let (opcode, inv) = match p.op {
                    SendOp::Send => (Opcode::Send, 0),
                    SendOp::SendSe => (Opcode::SendSe, 0),
                    SendOp::SendInvalidate { rkey } => (Opcode::SendInvalidate, rkey),
                    SendOp::SendSeInvalidate { rkey } => (Opcode::SendSeInvalidate, rkey),
                    _ => unreachable!(),
                };
                self.send_msn = self.send_msn.wrapping_add(1);
                let done = p.signaled.then(|| wc(WcOpcode::Send));
                TxMsg::data(
                    opcode,
                    None,
                    Some((inv, ddp::QN_SEND, self.send_msn)),
                    p.pieces,
                    p.total,
                    done,
                )
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                let done = p.signaled.then(|| wc(WcOpcode::RdmaWrite));
                TxMsg::data(
                    Opcode::RdmaWrite,
                    Some((rkey, remote_addr)),
                    None,
                    p.pieces,
                    p.total,
                    done,
                )
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                let (sink_stag, sink_to) = p.sink.unwrap_or((0, 0));
                self.orq.push_back(OrqEntry {
                    wr_id: p.wr_id,
                    sink_stag,
                    sink_to,
                    len: p.total,
                    placed: 0,
                    signaled: p.signaled,
                });
                self.rreq_msn = self.rreq_msn.wrapping_add(1);
                let body = ReadRequest {
                    sink_stag,
                    sink_to,
                    size: p.total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                }
                .encode()
                .to_vec();
                TxMsg::control(
                    Opcode::ReadRequest,
                    None,
                    Some((0, ddp::QN_READ_REQUEST, self.rreq_msn)),
                    body,
                )
            }
        };
        Some(msg)
    }

    fn push_msg_fpdus(&mut self, mut m: TxMsg) {
        while !self.push_fpdu(&mut m) {}
    }

    /// Appends the next FPDU of `m` to the output queue; true when the message is complete.
    fn push_fpdu(&mut self, m: &mut TxMsg) -> bool {
        let hdr_len = if m.tagged.is_some() {
            ddp::TAGGED_LEN
        } else {
            ddp::UNTAGGED_LEN
        } + m.body.len();
        let room = fpdu::max_payload(self.budget, hdr_len).max(4);
        let n = (m.total - m.sent).min(room);
        let last = m.sent + n == m.total;
        let header = match (m.tagged, m.untagged) {
            (Some((stag, to)), _) => DdpHeader::Tagged(TaggedHeader {
                last,
                opcode: m.opcode,
                stag,
                to: to.wrapping_add(m.sent as u64),
            }),
            (None, Some((inv, qn, msn))) => DdpHeader::Untagged(UntaggedHeader {
                last,
                opcode: m.opcode,
                inv_stag: inv,
                qn,
                msn,
                mo: m.sent as u32,
            }),
            _ => unreachable!("a message is tagged or untagged"),
        };
        let layout = FpduLayout::new(hdr_len + n);
        let mut head = vec![0u8; fpdu::LEN_FIELD + hdr_len];
        head[..2].copy_from_slice(&(layout.ulpdu_len as u16).to_be_bytes());
        let h = header.encode_into(&mut head[2..]);
        head[2 + h..].copy_from_slice(&m.body);
        let mut crc = self.crc.then(Crc32c::new);
        if let Some(c) = crc.as_mut() {
            c.update(&head);
        }
        // With MPA CRC a payload that could change is copied as its CRC is computed (one
        // fused pass), so the bytes sent are the bytes the CRC covers even if the region
        // changes meanwhile (a WRITE landing in a LUN image an overlapping READ is sent from):
        // as a hardware RNIC reads memory once. Immutable bytes (a caller's registered
        // `Bytes`) and, without CRC, any payload leave from the region itself. `copied` holds
        // the FPDU's bytes not yet queued: its header, then copied payload.
        let mut copied = head;
        let mut left = n;
        while left > 0 {
            let p = &m.pieces[m.piece_idx];
            let take = (p.len - m.piece_off).min(left);
            if take > 0 {
                let at = p.off + m.piece_off;
                let in_place = match crc.as_mut() {
                    None => true,
                    Some(c) => {
                        // SAFETY: the piece was bounds-checked against its region when posted
                        // and the region stays allocated while `p.mr` is held.
                        let src = unsafe { std::slice::from_raw_parts(p.mr.ptr_at(at), take) };
                        if p.mr.immutable() {
                            // The CRC taken here covers the bytes later sent from them.
                            c.update(src);
                            true
                        } else if p.mr.crc_by_blocks(c, at, take) {
                            // The owner's block CRCs (bytes it keeps unchanged until sent):
                            // only the partial blocks at the ends were read.
                            true
                        } else {
                            copied.reserve(left);
                            c.update_append(&mut copied, src);
                            false
                        }
                    }
                };
                if in_place {
                    if !copied.is_empty() {
                        self.push_chunk(Chunk::Bytes(std::mem::take(&mut copied)));
                    }
                    self.push_chunk(Chunk::Mem(p.mr.clone(), at, take));
                }
            }
            m.piece_off += take;
            left -= take;
            if m.piece_off == p.len {
                m.piece_idx += 1;
                m.piece_off = 0;
            }
        }
        // Skip zero-length pieces so the index stays on data.
        while m.piece_idx < m.pieces.len() && m.pieces[m.piece_idx].len == 0 {
            m.piece_idx += 1;
        }
        if !copied.is_empty() {
            self.push_chunk(Chunk::Bytes(copied));
        }
        let (trailer, tl) = fpdu::trailer(&layout, crc.as_mut());
        self.push_chunk(Chunk::Tail(trailer[..tl].to_vec()));
        m.sent += n;
        m.started = true;
        if last {
            if let Some(wc) = m.done.take() {
                self.out.push_back(Chunk::Done(wc));
            }
        }
        last
    }

    fn push_chunk(&mut self, c: Chunk) {
        self.out_bytes += c.len();
        self.out.push_back(c);
    }

    fn complete_done_markers(&mut self) {
        while self.front_pos == 0 {
            match self.out.front() {
                Some(Chunk::Done(_)) => {
                    let Some(Chunk::Done(mut wc)) = self.out.pop_front() else {
                        unreachable!()
                    };
                    if self.errored {
                        wc.status = WcStatus::Flushed;
                    }
                    self.qp.send_cq.push(wc);
                }
                _ => return,
            }
        }
    }

    fn write_out(&mut self) -> WriteResult {
        loop {
            self.complete_done_markers();
            if self.out.is_empty() {
                return WriteResult::Drained;
            }
            // With `align_fpdus`, each FPDU is one message of a sendmmsg, ended with MSG_EOR so
            // that TCP starts the next FPDU in a new segment: FPDUs (sized to the MSS) stay
            // aligned with segments, as siw sends them and as RFC 5044 asks of a sender, so
            // that a receiver or a dissector finds each FPDU at the start of a segment. One
            // call still sends many. Without it, everything queued is one message.
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(MAX_IOVECS.min(self.out.len()));
            // (first iovec, iovec count, ends an FPDU) per message
            let mut msgs: Vec<(usize, usize, bool)> = Vec::new();
            let mut first = 0;
            for (i, c) in self.out.iter().enumerate() {
                if iov.len() == MAX_IOVECS {
                    break;
                }
                let skip = if i == 0 { self.front_pos } else { 0 };
                let (base, len) = match c {
                    Chunk::Bytes(b) | Chunk::Tail(b) => (b.as_ptr(), b.len()),
                    Chunk::Mem(mr, off, len) => (mr.ptr_at(*off) as *const u8, *len),
                    Chunk::Done(_) => continue,
                };
                if len > skip {
                    // SAFETY: base..base+len is a live buffer (a Vec we own or a region kept
                    // alive by the Arc in the chunk); skip < len.
                    iov.push(libc::iovec {
                        iov_base: unsafe { base.add(skip) } as *mut libc::c_void,
                        iov_len: len - skip,
                    });
                }
                if self.align_fpdus && matches!(c, Chunk::Tail(_)) && iov.len() > first {
                    msgs.push((first, iov.len() - first, true));
                    first = iov.len();
                }
            }
            if iov.len() > first {
                msgs.push((first, iov.len() - first, false));
            }
            let n = send_fpdus(self.fd, &mut iov, &msgs);
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => WriteResult::Blocked,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => WriteResult::Failed(e),
                };
            }
            let mut n = n as usize;
            self.out_bytes -= n;
            while n > 0 {
                let front_len = self.out.front().map(Chunk::len).unwrap_or(0);
                let rest = front_len - self.front_pos;
                if n >= rest {
                    n -= rest;
                    self.out.pop_front();
                    self.front_pos = 0;
                    self.complete_done_markers();
                } else {
                    self.front_pos += n;
                    n = 0;
                }
            }
            if !self.errored
                && self.out_bytes < OUT_HIGH_WATER / 2
                && (self.cur.is_some() || !self.irq.is_empty())
            {
                return WriteResult::Drained;
            }
        }
    }

    // ---------------------------------------------------------------- receive

    /// Reads and processes as much as is available (bounded per turn); true if it stopped early.
    fn receive(&mut self) -> bool {
        let mut budget = RX_TURN_BYTES;
        loop {
            if self.done || self.errored {
                return false;
            }
            if budget == 0 {
                return true;
            }
            let step = match self.rx {
                Rx::Header { need } => self.rx_header(need),
                Rx::Payload { left } => self.rx_payload(left),
                Rx::Trailer { need } => self.rx_trailer(need),
            };
            match step {
                Step::Progress(n) => budget = budget.saturating_sub(n.max(1)),
                Step::Blocked => return false,
                Step::Eof => {
                    self.peer_closed();
                    return false;
                }
                Step::Fail(term, why) => {
                    tracing::info!("queue pair in error: {why}");
                    self.fail(term, Some(why));
                    return false;
                }
            }
        }
    }

    /// Unconsumed staged bytes.
    fn staged(&self) -> &[u8] {
        &self.stage[self.stage_pos..self.stage_len]
    }

    fn consume_staged(&mut self, n: usize) {
        self.stage_pos += n;
        if self.stage_pos == self.stage_len {
            self.stage_pos = 0;
            self.stage_len = 0;
        }
    }

    /// Reads what the socket has (up to the stage's size) into the empty stage.
    fn fill_stage(&mut self) -> Result<usize, Step> {
        debug_assert_eq!(self.stage_len, 0);
        // SAFETY: reads into our own stage buffer, within its length.
        let n = unsafe {
            libc::read(
                self.fd,
                self.stage.as_mut_ptr() as *mut libc::c_void,
                self.lookahead.min(self.stage.len()),
            )
        };
        read_result(n).inspect(|&n| self.stage_len = n)
    }

    /// Fills the control buffer up to `upto` bytes from the stage (reading the socket when
    /// the stage is empty); returns the bytes taken.
    fn read_ctl(&mut self, upto: usize) -> Result<usize, Step> {
        let upto = upto.min(self.ctl.len());
        if self.ctl_have >= upto {
            return Ok(0);
        }
        if self.staged().is_empty() {
            self.fill_stage()?;
        }
        let take = (upto - self.ctl_have).min(self.staged().len());
        let at = self.stage_pos;
        self.ctl[self.ctl_have..self.ctl_have + take].copy_from_slice(&self.stage[at..at + take]);
        self.ctl_have += take;
        self.consume_staged(take);
        Ok(take)
    }

    fn rx_header(&mut self, need: usize) -> Step {
        if self.ctl_have < need {
            match self.read_ctl(need) {
                Ok(n) if self.ctl_have < need => return Step::Progress(n),
                Ok(_) => {}
                Err(s) => return s,
            }
        }
        let ulpdu = u16::from_be_bytes([self.ctl[0], self.ctl[1]]) as usize;
        let full = fpdu::LEN_FIELD + DdpHeader::len_from_control(self.ctl[2]);
        if need < full {
            self.rx = Rx::Header { need: full };
            return Step::Progress(0);
        }
        let header = match DdpHeader::decode(&self.ctl[2..full]) {
            Ok(h) => h,
            Err(code) => return self.term_about(code, ulpdu, None),
        };
        let body_len = match header.opcode() {
            Opcode::ReadRequest => ReadRequest::LEN,
            _ => 0,
        };
        if need < full + body_len {
            self.rx = Rx::Header {
                need: full + body_len,
            };
            return Step::Progress(0);
        }
        let hdr_total = full + body_len;
        if ulpdu + fpdu::LEN_FIELD < hdr_total {
            return Step::Fail(
                Some(Terminate::plain(TerminateCode::LLP_FPDU_START)),
                "ULPDU shorter than its header".into(),
            );
        }
        self.hdr_len = hdr_total;
        let payload = ulpdu + fpdu::LEN_FIELD - hdr_total;
        self.seg_len = ulpdu;
        if self.crc {
            self.rx_crc = Crc32c::new();
            self.rx_crc.update(&self.ctl[..hdr_total]);
        }
        if self.hold_tx {
            // The initiator's first FPDU (or its RTR) has arrived: we may now send.
            self.hold_tx = false;
        }
        let setup = match header {
            DdpHeader::Tagged(h) => self.setup_tagged(h, payload),
            DdpHeader::Untagged(h) => self.setup_untagged(h, payload, hdr_total),
        };
        if let Err(code) = setup {
            return self.term_about(code, ulpdu, None);
        }
        // The header bytes are consumed; the control buffer now only ever holds lookahead.
        debug_assert_eq!(self.ctl_have, hdr_total);
        self.ctl_have = 0;
        self.rx = if payload > 0 {
            Rx::Payload { left: payload }
        } else {
            self.trailer_state()
        };
        Step::Progress(0)
    }

    fn trailer_state(&self) -> Rx {
        Rx::Trailer {
            need: FpduLayout::new(self.seg_len).trailer_len(),
        }
    }

    fn setup_tagged(&mut self, h: TaggedHeader, payload: usize) -> Result<(), TerminateCode> {
        let qp = self.qp.clone();
        match h.opcode {
            Opcode::RdmaWrite => {
                self.on_done = OnDone::Nothing;
                if payload == 0 {
                    self.dst = Dst::None;
                    return Ok(());
                }
                let (mr, off) = qp
                    .stags
                    .check(h.stag, qp.pd, Access::REMOTE_WRITE, h.to, payload as u64)
                    .map_err(AccessError::ddp_code)?;
                self.dst = Dst::Region { mr, off };
            }
            Opcode::ReadResponse => {
                let Some(e) = self.orq.front() else {
                    return Err(TerminateCode::RDMAP_OPCODE);
                };
                if e.len == 0 && payload == 0 {
                    self.dst = Dst::None;
                    self.on_done = OnDone::ReadResponseSegment {
                        last: h.last,
                        bytes: 0,
                    };
                    return Ok(());
                }
                let start_ok =
                    h.stag == e.sink_stag && h.to == e.sink_to.wrapping_add(e.placed as u64);
                if !start_ok || e.placed + payload > e.len {
                    return Err(TerminateCode::DDP_TAGGED_BASE_BOUNDS);
                }
                let (mr, off) = qp
                    .stags
                    .check(h.stag, qp.pd, Access::LOCAL_WRITE, h.to, payload as u64)
                    .map_err(AccessError::ddp_code)?;
                self.dst = Dst::Region { mr, off };
                self.on_done = OnDone::ReadResponseSegment {
                    last: h.last,
                    bytes: payload,
                };
            }
            _ => return Err(TerminateCode::RDMAP_OPCODE),
        }
        Ok(())
    }

    fn setup_untagged(
        &mut self,
        h: UntaggedHeader,
        payload: usize,
        hdr_total: usize,
    ) -> Result<(), TerminateCode> {
        match h.opcode {
            op if op.is_send() => {
                match &self.recv_cur {
                    Some(r) => {
                        if h.msn != r.msn {
                            return Err(TerminateCode::DDP_UNTAGGED_MSN_RANGE);
                        }
                        if h.mo as usize != r.placed {
                            return Err(TerminateCode::DDP_UNTAGGED_MO);
                        }
                    }
                    None => {
                        if h.msn != self.rx_send_msn {
                            return Err(TerminateCode::DDP_UNTAGGED_MSN_RANGE);
                        }
                        if h.mo != 0 {
                            return Err(TerminateCode::DDP_UNTAGGED_MO);
                        }
                        let posted = self.qp.q.lock().unwrap().rq.pop_front();
                        let Some(posted) = posted else {
                            return Err(TerminateCode::DDP_UNTAGGED_NO_BUFFER);
                        };
                        self.recv_cur = Some(RecvInProgress {
                            posted,
                            placed: 0,
                            msn: h.msn,
                        });
                    }
                }
                let r = self.recv_cur.as_ref().unwrap();
                if r.placed + payload > r.posted.total {
                    return Err(TerminateCode::DDP_UNTAGGED_TOO_LONG);
                }
                self.dst = if payload > 0 { Dst::Recv } else { Dst::None };
                self.on_done = OnDone::RecvSegment {
                    last: h.last,
                    inv: op.invalidates().then_some(h.inv_stag),
                    solicited: op.solicited(),
                };
            }
            Opcode::ReadRequest => {
                if h.msn != self.rx_rreq_msn || !h.last || payload != 0 {
                    return Err(TerminateCode::DDP_UNTAGGED_MSN_RANGE);
                }
                let rr = ReadRequest::decode(&self.ctl[hdr_total - ReadRequest::LEN..hdr_total])
                    .map_err(|_| TerminateCode::LLP_FPDU_START)?;
                self.dst = Dst::None;
                self.on_done = OnDone::ReadRequest(rr);
            }
            Opcode::Terminate => {
                self.dst = Dst::Scratch(Vec::with_capacity(payload));
                self.on_done = OnDone::Terminate;
            }
            _ => return Err(TerminateCode::RDMAP_OPCODE),
        }
        Ok(())
    }

    fn rx_payload(&mut self, left: usize) -> Step {
        let (ptr, room): (*mut u8, usize) = match &mut self.dst {
            Dst::Region { mr, off } => (mr.ptr_at(*off), left),
            Dst::Recv => {
                let r = self.recv_cur.as_ref().expect("a receive is in progress");
                let (mut idx, mut at) = (0, r.placed);
                while idx < r.posted.pieces.len() && at >= r.posted.pieces[idx].len {
                    at -= r.posted.pieces[idx].len;
                    idx += 1;
                }
                let p = &r.posted.pieces[idx];
                (p.mr.ptr_at(p.off + at), (p.len - at).min(left))
            }
            Dst::Scratch(v) => {
                let have = v.len();
                v.resize(have + left, 0);
                // SAFETY: `have..have+left` is inside the just-resized vector.
                (unsafe { v.as_mut_ptr().add(have) }, left)
            }
            Dst::None => (std::ptr::null_mut(), 0),
        };
        if room == 0 {
            return Step::Fail(
                Some(Terminate::plain(TerminateCode::DDP_UNTAGGED_TOO_LONG)),
                "no room for payload".into(),
            );
        }
        let n = match self.read_payload(ptr, room) {
            Ok(n) => n,
            Err(s) => {
                if let Dst::Scratch(v) = &mut self.dst {
                    v.truncate(v.len() - left);
                }
                return s;
            }
        };
        if let Dst::Scratch(v) = &mut self.dst {
            v.truncate(v.len() - (left - n));
        }
        match &mut self.dst {
            Dst::Region { off, .. } => *off += n,
            Dst::Recv => self.recv_cur.as_mut().unwrap().placed += n,
            _ => {}
        }
        let left = left - n;
        self.rx = if left == 0 {
            self.lookahead = if self.seg_len >= DIRECT_MIN {
                SHORT_LOOKAHEAD
            } else {
                STAGE_LEN
            };
            self.trailer_state()
        } else {
            Rx::Payload { left }
        };
        Step::Progress(n)
    }

    /// Puts up to `room` payload bytes at `ptr`, with MPA CRC taken over them: from the
    /// stage (the CRC fused with that copy), or, when nothing is staged and the payload is
    /// long, straight from the socket with whatever follows it going to the stage in the
    /// same call (the one copy into the region). Returns the bytes placed.
    fn read_payload(&mut self, ptr: *mut u8, room: usize) -> Result<usize, Step> {
        if self.staged().is_empty() && room < DIRECT_MIN {
            self.fill_stage()?;
        }
        if !self.staged().is_empty() {
            let n = room.min(self.staged().len());
            let src = &self.stage[self.stage_pos..self.stage_pos + n];
            if self.crc {
                // SAFETY: the caller's ptr..ptr+room is writable (see `rx_payload`), n <= room,
                // and nothing else in this process writes there while the FPDU is placed; the
                // stage is our own buffer, so the two do not overlap.
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr, n) };
                self.rx_crc.update_copy(dst, src);
            } else {
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, n) };
            }
            self.consume_staged(n);
            return Ok(n);
        }
        let iov = [
            libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: room,
            },
            libc::iovec {
                iov_base: self.stage.as_mut_ptr() as *mut libc::c_void,
                iov_len: SHORT_LOOKAHEAD,
            },
        ];
        // SAFETY: ptr..ptr+room is writable (see `rx_payload`); the second iovec is our own
        // empty stage.
        let n = read_result(unsafe { libc::readv(self.fd, iov.as_ptr(), 2) })?;
        self.stage_len = n.saturating_sub(room);
        let placed = n - self.stage_len;
        if self.crc {
            // SAFETY: these bytes were just placed in the checked range.
            self.rx_crc
                .update(unsafe { std::slice::from_raw_parts(ptr, placed) });
        }
        Ok(placed)
    }

    fn rx_trailer(&mut self, need: usize) -> Step {
        if self.ctl_have < need {
            match self.read_ctl(need) {
                Ok(n) if self.ctl_have < need => return Step::Progress(n),
                Ok(_) => {}
                Err(s) => return s,
            }
        }
        if self.crc {
            let pad = need - fpdu::CRC_LEN;
            self.rx_crc.update(&self.ctl[..pad]);
            if self.ctl[pad..need] != self.rx_crc.wire_bytes() {
                let code = TerminateCode::LLP_CRC;
                return Step::Fail(
                    Some(Terminate::plain(code)),
                    format!("MPA CRC error, sent Terminate: {code}"),
                );
            }
        }
        self.ctl.copy_within(need..self.ctl_have, 0);
        self.ctl_have -= need;
        self.rx = Rx::Header { need: 16 };
        let on_done = std::mem::replace(&mut self.on_done, OnDone::Nothing);
        let dst = std::mem::replace(&mut self.dst, Dst::None);
        match self.segment_done(on_done, dst) {
            Ok(()) => Step::Progress(0),
            Err(term) => {
                let why = format!("sent Terminate: {}", term.code);
                Step::Fail(Some(term), why)
            }
        }
    }

    fn segment_done(&mut self, on_done: OnDone, dst: Dst) -> Result<(), Terminate> {
        match on_done {
            OnDone::Nothing => {}
            OnDone::RecvSegment {
                last,
                inv,
                solicited,
            } => {
                if last {
                    let r = self.recv_cur.take().unwrap();
                    self.rx_send_msn = self.rx_send_msn.wrapping_add(1);
                    let mut wc =
                        self.qp
                            .wc(r.posted.wr_id, WcStatus::Success, WcOpcode::Recv, r.placed);
                    wc.solicited = solicited;
                    if let Some(stag) = inv {
                        if !self.qp.stags.remote_invalidate(stag, self.qp.pd) {
                            self.qp.recv_cq.push(WcStatus::LocalProtection.on(wc));
                            return Err(Terminate::plain(TerminateCode::RDMAP_CANNOT_INVALIDATE));
                        }
                        wc.invalidated_rkey = Some(stag);
                    }
                    self.qp.recv_cq.push(wc);
                }
            }
            OnDone::ReadResponseSegment { last, bytes } => {
                let e = self.orq.front_mut().unwrap();
                e.placed += bytes;
                if last {
                    let e = self.orq.pop_front().unwrap();
                    if e.placed != e.len {
                        return Err(Terminate::plain(TerminateCode::DDP_TAGGED_BASE_BOUNDS));
                    }
                    if e.signaled {
                        self.qp.send_cq.push(self.qp.wc(
                            e.wr_id,
                            WcStatus::Success,
                            WcOpcode::RdmaRead,
                            e.len,
                        ));
                    }
                }
            }
            OnDone::ReadRequest(rr) => {
                self.rx_rreq_msn = self.rx_rreq_msn.wrapping_add(1);
                let pending = self.irq.len()
                    + usize::from(
                        self.cur
                            .as_ref()
                            .is_some_and(|m| m.opcode == Opcode::ReadResponse),
                    );
                if pending >= self.ird.max(1) {
                    return Err(Terminate::plain(TerminateCode::RDMAP_CATASTROPHIC_STREAM));
                }
                let pieces = if rr.size == 0 {
                    Vec::new()
                } else {
                    let (mr, off) = self
                        .qp
                        .stags
                        .check(
                            rr.src_stag,
                            self.qp.pd,
                            Access::REMOTE_READ,
                            rr.src_to,
                            rr.size as u64,
                        )
                        .map_err(|e| Terminate {
                            rdmap_header: Some(rr.encode().to_vec()),
                            ..Terminate::plain(e.rdmap_code())
                        })?;
                    vec![Piece {
                        mr,
                        off,
                        len: rr.size as usize,
                    }]
                };
                let msg = TxMsg::data(
                    Opcode::ReadResponse,
                    Some((rr.sink_stag, rr.sink_to)),
                    None,
                    pieces,
                    rr.size as usize,
                    None,
                );
                self.irq.push_back(msg);
            }
            OnDone::Terminate => {
                let body = match dst {
                    Dst::Scratch(v) => v,
                    _ => Vec::new(),
                };
                let why = match Terminate::decode(&body) {
                    Ok(t) => format!("peer sent Terminate: {}", t.code),
                    Err(_) => "peer sent a malformed Terminate".to_string(),
                };
                self.remote_failure(why);
            }
        }
        Ok(())
    }

    fn term_about(&mut self, code: TerminateCode, ulpdu: usize, rr: Option<&[u8]>) -> Step {
        let hdr_end =
            (fpdu::LEN_FIELD + DdpHeader::len_from_control(self.ctl[2])).min(self.ctl_have);
        let t = Terminate::about(code, ulpdu as u16, &self.ctl[2..hdr_end], rr);
        Step::Fail(Some(t), format!("sent Terminate: {code}"))
    }

    // ---------------------------------------------------------------- lifecycle

    fn peer_closed(&mut self) {
        let why = if self.closing {
            None
        } else {
            Some("connection closed by peer".to_string())
        };
        self.fail(None, why);
        self.finish();
    }

    fn remote_failure(&mut self, why: String) {
        tracing::info!("queue pair in error: {why}");
        // Outstanding RDMA Reads and sends fail as remote errors; the rest are flushed.
        for e in self.orq.drain(..) {
            self.qp.send_cq.push(self.qp.wc(
                e.wr_id,
                WcStatus::RemoteAccess,
                WcOpcode::RdmaRead,
                0,
            ));
        }
        self.fail(None, Some(why));
        self.finish();
    }

    /// Moves the QP to Error: optionally sends a Terminate first, flushes all work requests.
    fn fail(&mut self, term: Option<Terminate>, why: Option<String>) {
        if self.errored {
            return;
        }
        self.errored = true;
        if let Some(m) = self.cur.take() {
            if let Some(wc) = m.done {
                self.qp.send_cq.push(WcStatus::Flushed.on(wc));
            }
        }
        self.irq.clear();
        for e in self.orq.drain(..) {
            self.qp.send_cq.push(
                self.qp
                    .wc(e.wr_id, WcStatus::Flushed, WcOpcode::RdmaRead, 0),
            );
        }
        if let Some(r) = self.recv_cur.take() {
            self.qp.recv_cq.push(
                self.qp
                    .wc(r.posted.wr_id, WcStatus::Flushed, WcOpcode::Recv, 0),
            );
        }
        if let Some(t) = term {
            let msg = TxMsg::control(
                Opcode::Terminate,
                None,
                Some((0, ddp::QN_TERMINATE, 1)),
                t.encode(),
            );
            self.push_msg_fpdus(msg);
        }
        self.qp.flush_all(why);
        if self.out.iter().all(|c| matches!(c, Chunk::Done(_))) {
            self.finish();
        }
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.complete_done_markers();
        for c in self.out.drain(..) {
            if let Chunk::Done(wc) = c {
                self.qp.send_cq.push(WcStatus::Flushed.on(wc));
            }
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.done = true;
        self.qp.q.lock().unwrap().attached = false;
        self.qp.set_state(QpState::Error);
    }
}

impl TransmitInPlace for Mutex<Conn> {
    /// Runs the connection's transmit side on the poster's thread if the engine is not
    /// serving it (the lock is free), exactly as the engine would: FPDUs from what is queued
    /// (Read Responses and a partly sent message first, then the send queue in order) and
    /// completions in that order. A connection closing or failed is left to the engine.
    fn transmit_in_place(&self) -> bool {
        let Ok(mut c) = self.try_lock() else {
            return false;
        };
        if c.done || c.errored || c.closing {
            return false;
        }
        c.transmit();
        c.tx_idle()
    }
}

trait WithStatus {
    fn on(self, wc: Wc) -> Wc;
}

impl WithStatus for WcStatus {
    fn on(self, wc: Wc) -> Wc {
        Wc { status: self, ..wc }
    }
}

impl TxMsg {
    fn data(
        opcode: Opcode,
        tagged: Option<(u32, u64)>,
        untagged: Option<(u32, u32, u32)>,
        pieces: Vec<Piece>,
        total: usize,
        done: Option<Wc>,
    ) -> TxMsg {
        let mut m = TxMsg {
            opcode,
            tagged,
            untagged,
            body: Vec::new(),
            pieces,
            total,
            sent: 0,
            piece_idx: 0,
            piece_off: 0,
            done,
            started: false,
        };
        while m.piece_idx < m.pieces.len() && m.pieces[m.piece_idx].len == 0 {
            m.piece_idx += 1;
        }
        m
    }

    fn control(
        opcode: Opcode,
        tagged: Option<(u32, u64)>,
        untagged: Option<(u32, u32, u32)>,
        body: Vec<u8>,
    ) -> TxMsg {
        TxMsg {
            body,
            ..TxMsg::data(opcode, tagged, untagged, Vec::new(), 0, None)
        }
    }
}

enum WriteResult {
    Drained,
    Blocked,
    Failed(std::io::Error),
}

enum Step {
    Progress(usize),
    Blocked,
    Eof,
    Fail(Option<Terminate>, String),
}

fn read_result(n: isize) -> Result<usize, Step> {
    if n > 0 {
        return Ok(n as usize);
    }
    if n == 0 {
        return Err(Step::Eof);
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock => Err(Step::Blocked),
        std::io::ErrorKind::Interrupted => Ok(0),
        _ => Err(Step::Fail(None, format!("receive failed: {e}"))),
    }
}

/// Sends `msgs` (ranges of `iov`, each flagged if it ends an FPDU) in one sendmmsg; the ends
/// of FPDUs carry MSG_EOR (TCP appends no later data to the segment holding them). The kernel
/// stops at a message it could send only in part. Returns the bytes sent, or -1 (errno set).
fn send_fpdus(fd: RawFd, iov: &mut [libc::iovec], msgs: &[(usize, usize, bool)]) -> isize {
    let base = iov.as_mut_ptr();
    let mut hdrs: Vec<libc::mmsghdr> = msgs
        .iter()
        .map(|&(first, count, eor)| {
            // SAFETY: a zeroed mmsghdr is valid (no name, no control data).
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            // SAFETY: first + count <= iov.len(), so the pointer stays inside iov.
            h.msg_hdr.msg_iov = unsafe { base.add(first) };
            h.msg_hdr.msg_iovlen = count as _;
            h.msg_hdr.msg_flags = if eor { libc::MSG_EOR } else { 0 };
            h
        })
        .collect();
    // SAFETY: every header points at iovecs inside `iov`, whose (pointer, length) pairs are
    // live buffers that outlive the call; hdrs.len() is the count passed.
    let sent = unsafe {
        libc::sendmmsg(
            fd,
            hdrs.as_mut_ptr(),
            hdrs.len() as libc::c_uint,
            libc::MSG_NOSIGNAL,
        )
    };
    if sent < 0 {
        return -1;
    }
    hdrs[..sent as usize]
        .iter()
        .map(|h| h.msg_len as isize)
        .sum()
}

fn tcp_mss(fd: RawFd) -> Option<usize> {
    let mut v: libc::c_int = 0;
    let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the right size for TCP_MAXSEG.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            &mut v as *mut _ as *mut libc::c_void,
            &mut l,
        )
    };
    (r == 0 && v > 0).then_some(v as usize)
}
