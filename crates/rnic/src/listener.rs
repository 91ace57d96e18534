//! The listening side of connection management: accepted connections wait for their MPA
//! Request side by side, without blocking on any one of them; an accepted request hands its
//! socket to the progress engine.

use crate::cm::{check_attachable, local_params, mark_attached, tune, MAX_PRIVATE_DATA};
use crate::qp::Qp;
use crate::shared::{Attach, Cmd};
use iwarp::mpa::{self, MpaFrame, MpaKind, PeerRequest};
use mio::unix::SourceFd;
use rdma::{ConnInfo, ConnParams, ConnectRequest, Error, Listener, Result};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// siw waits this long for the MPA Request after accepting TCP.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many accepted connections may wait for their MPA Request at once; a new connection
/// beyond this drops the one that has waited longest (with a log line).
pub const MAX_PENDING_REQUESTS: usize = 4096;
const LISTENER_TOKEN: mio::Token = mio::Token(usize::MAX);

/// A listening endpoint. Accepted connections wait for their MPA Request side by side: each is
/// read as its bytes arrive (nonblocking, one epoll set), so a client that sends nothing, half
/// a Request or one byte a second delays no other; each is dropped after [`REQUEST_TIMEOUT`]
/// (5 s, as siw) or when it sends something else, with one log line naming the peer and why.
/// The waiting goes on inside [`Listener::get_request`], so connections make progress while
/// someone asks for the next request.
pub struct RnicListener {
    pub(crate) sock: TcpListener,
    local: SocketAddr,
    pending: std::sync::Mutex<Pending>,
}

/// A connection accepted but whose MPA Request is not complete yet.
struct Incoming {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    deadline: Instant,
}

struct Pending {
    poll: mio::Poll,
    events: mio::Events,
    conns: HashMap<usize, Incoming>,
    /// Tokens in accept order (so deadlines ascend); stale entries are skipped.
    order: VecDeque<usize>,
    ready: VecDeque<Request>,
    next_token: usize,
    last_accept_error: Option<Instant>,
}

/// What reading a pending connection came to.
enum Progress {
    Waiting,
    Complete,
    Dropped(String),
}

impl RnicListener {
    pub(crate) fn new(sock: TcpListener) -> Result<RnicListener> {
        sock.set_nonblocking(true)?;
        let local = sock.local_addr()?;
        let poll = mio::Poll::new()?;
        poll.registry().register(
            &mut SourceFd(&sock.as_raw_fd()),
            LISTENER_TOKEN,
            mio::Interest::READABLE,
        )?;
        Ok(RnicListener {
            sock,
            local,
            pending: std::sync::Mutex::new(Pending {
                poll,
                events: mio::Events::with_capacity(256),
                conns: HashMap::new(),
                order: VecDeque::new(),
                ready: VecDeque::new(),
                next_token: 0,
                last_accept_error: None,
            }),
        })
    }

    /// Connections accepted whose MPA Request has not arrived yet (for tests and diagnostics).
    pub fn pending_requests(&self) -> usize {
        self.pending.lock().unwrap().conns.len()
    }

    fn dropped(&self, peer: SocketAddr, why: &str) {
        tracing::info!(listener = %self.local, %peer, "MPA connection dropped: {why}");
    }

    /// Accepts every connection waiting in the kernel's queue.
    fn accept_all(&self, p: &mut Pending) {
        loop {
            let (stream, peer) = match self.sock.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors and the like: the listener stays; say so once a second.
                    let now = Instant::now();
                    if p.last_accept_error
                        .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
                    {
                        tracing::warn!(listener = %self.local, "accept: {e}");
                        p.last_accept_error = Some(now);
                    }
                    return;
                }
            };
            while p.conns.len() >= MAX_PENDING_REQUESTS {
                let Some(oldest) = p.order.pop_front() else {
                    break;
                };
                if let Some(c) = p.remove(oldest) {
                    self.dropped(
                        c.peer,
                        &format!(
                            "{MAX_PENDING_REQUESTS} connections were waiting for their MPA Request; the oldest gives way"
                        ),
                    );
                }
            }
            let token = p.next_token;
            p.next_token = p.next_token.wrapping_add(1) % (usize::MAX - 1);
            if let Err(e) = stream.set_nonblocking(true).and_then(|_| {
                p.poll.registry().register(
                    &mut SourceFd(&stream.as_raw_fd()),
                    mio::Token(token),
                    mio::Interest::READABLE,
                )
            }) {
                self.dropped(peer, &format!("cannot watch the connection: {e}"));
                continue;
            }
            p.conns.insert(
                token,
                Incoming {
                    stream,
                    peer,
                    buf: Vec::with_capacity(mpa::HEADER_LEN),
                    deadline: Instant::now() + REQUEST_TIMEOUT,
                },
            );
            p.order.push_back(token);
            // Bytes that came with the connection are read now.
            self.advance(p, token);
        }
    }

    /// Reads what connection `token` has sent; a complete Request moves to `ready`.
    fn advance(&self, p: &mut Pending, token: usize) {
        let Some(c) = p.conns.get_mut(&token) else {
            return;
        };
        match read_some(c) {
            Progress::Waiting => {}
            Progress::Complete => {
                let c = p.remove(token).expect("present");
                let peer = c.peer;
                let done = c
                    .stream
                    .set_nonblocking(false)
                    .map_err(Error::from)
                    .and_then(|_| Request::from_frame(c.stream, peer, &c.buf));
                match done {
                    Ok(r) => p.ready.push_back(r),
                    Err(e) => self.dropped(peer, &e.to_string()),
                }
            }
            Progress::Dropped(why) => {
                if let Some(c) = p.remove(token) {
                    self.dropped(c.peer, &why);
                }
            }
        }
    }

    /// Drops the connections whose time is up.
    fn expire(&self, p: &mut Pending, now: Instant) {
        while let Some(&t) = p.order.front() {
            match p.conns.get(&t) {
                None => {
                    p.order.pop_front();
                }
                Some(c) if c.deadline <= now => {
                    p.order.pop_front();
                    let c = p.remove(t).expect("present");
                    self.dropped(
                        c.peer,
                        &format!(
                            "no complete MPA Request within {} s ({} bytes received)",
                            REQUEST_TIMEOUT.as_secs(),
                            c.buf.len()
                        ),
                    );
                }
                Some(_) => break,
            }
        }
    }
}

impl Pending {
    fn remove(&mut self, token: usize) -> Option<Incoming> {
        let c = self.conns.remove(&token)?;
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&c.stream.as_raw_fd()));
        Some(c)
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.order
            .iter()
            .find_map(|t| self.conns.get(t))
            .map(|c| c.deadline)
    }
}

/// Reads, without blocking, as much of the MPA Request as has arrived and no byte beyond it.
/// What it may be is judged by [`Request::frame_len`], the check every reader of a Request uses.
fn read_some(c: &mut Incoming) -> Progress {
    loop {
        let want = if c.buf.len() < mpa::HEADER_LEN {
            mpa::HEADER_LEN
        } else {
            match Request::frame_len(&c.buf) {
                Ok(total) => total,
                Err(e) => return Progress::Dropped(e.to_string()),
            }
        };
        if c.buf.len() >= want {
            return Progress::Complete;
        }
        let have = c.buf.len();
        c.buf.resize(want, 0);
        match c.stream.read(&mut c.buf[have..]) {
            Ok(0) => {
                c.buf.truncate(have);
                return Progress::Dropped(if have == 0 {
                    "closed without sending an MPA Request".into()
                } else {
                    format!("closed after {have} bytes of an MPA Request")
                });
            }
            Ok(n) => {
                c.buf.truncate(have + n);
                // A wrong key shows in its first bytes: drop it without waiting for a header.
                if let Err(e) = key_prefix(&c.buf) {
                    return Progress::Dropped(e.to_string());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                c.buf.truncate(have);
                return Progress::Waiting;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => c.buf.truncate(have),
            Err(e) => {
                c.buf.truncate(have);
                return Progress::Dropped(format!("reading the MPA Request: {e}"));
            }
        }
    }
}

/// Whether `bytes` (however few) can begin an MPA Request.
fn key_prefix(bytes: &[u8]) -> Result<()> {
    let k = bytes.len().min(mpa::KEY_REQUEST.len());
    if bytes[..k] == mpa::KEY_REQUEST[..k] {
        Ok(())
    } else {
        Err(Error::Connect(format!(
            "not an MPA Request (begins {:02x?})",
            &bytes[..k.min(8)]
        )))
    }
}

impl Listener for RnicListener {
    type Request = Request;

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next complete MPA Request, waiting at most `timeout`. Connections that fail (closed,
    /// silent, not MPA, a Request this RNIC refuses) are dropped with a log line, not returned
    /// as errors: one client never fails the listener's caller.
    fn get_request(&self, timeout: Duration) -> Result<Option<Request>> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.pending.lock().unwrap();
        let p = &mut *guard;
        loop {
            if let Some(r) = p.ready.pop_front() {
                return Ok(Some(r));
            }
            self.accept_all(p);
            let now = Instant::now();
            self.expire(p, now);
            if let Some(r) = p.ready.pop_front() {
                return Ok(Some(r));
            }
            let mut until = deadline;
            if let Some(d) = p.next_deadline() {
                until = until.min(d);
            }
            if p.last_accept_error
                .is_some_and(|t| now < t + Duration::from_secs(1))
            {
                // Accepting failed lately (descriptors): retry soon rather than on an edge.
                until = until.min(now + Duration::from_millis(100));
            }
            let wait = until.saturating_duration_since(now);
            let Pending { poll, events, .. } = p;
            if let Err(e) = poll.poll(events, Some(wait)) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e.into());
                }
            }
            let tokens: Vec<usize> = p
                .events
                .iter()
                .map(|e| e.token())
                .filter(|t| *t != LISTENER_TOKEN)
                .map(|t| t.0)
                .collect();
            for t in tokens {
                self.advance(p, t);
            }
            if Instant::now() >= deadline && p.ready.is_empty() {
                // One last look at the kernel's queue and what arrived.
                self.accept_all(p);
                return Ok(p.ready.pop_front());
            }
        }
    }
}

impl Request {
    /// The length of the MPA Request whose first [`mpa::HEADER_LEN`] bytes are `header`, or why
    /// it is not one this RNIC reads (a wrong key, too much private data). For callers that read
    /// the Request themselves (asynchronously) before [`Request::from_frame`].
    pub fn frame_len(header: &[u8]) -> Result<usize> {
        key_prefix(header)?;
        let total = MpaFrame::frame_len(header).map_err(|e| Error::Connect(e.to_string()))?;
        if total - mpa::HEADER_LEN > MAX_PRIVATE_DATA {
            return Err(Error::Connect(format!(
                "MPA Request announces {} bytes of private data",
                total - mpa::HEADER_LEN
            )));
        }
        Ok(total)
    }

    /// A Request from its bytes (`frame`: the whole MPA Request, read by the caller) and the
    /// connection it came on (blocking mode, nothing of it read beyond the Request). A Request
    /// this RNIC cannot serve is refused with a rejecting Reply.
    pub fn from_frame(s: TcpStream, peer: SocketAddr, frame: &[u8]) -> Result<Request> {
        let (f, _) = MpaFrame::decode(frame, MpaKind::Request, MAX_PRIVATE_DATA)
            .map_err(|e| Error::Connect(e.to_string()))?;
        Request::from_parsed(s, peer, f)
    }

    fn from_parsed(mut s: TcpStream, peer: SocketAddr, frame: MpaFrame) -> Result<Request> {
        tune(&s)?;
        match mpa::parse_request(frame.clone()) {
            Ok(req) => Ok(Request {
                stream: s,
                req,
                peer,
            }),
            Err(e) => {
                // Refuse markers / bad revisions with a rejecting Reply, as siw does.
                let fake = PeerRequest {
                    frame,
                    word: None,
                    private_data: Vec::new(),
                };
                let _ = s.write_all(&mpa::build_reject(&fake, &[]).encode());
                Err(Error::Connect(e.to_string()))
            }
        }
    }
}

/// A connection request waiting for accept or reject.
pub struct Request {
    stream: TcpStream,
    req: PeerRequest,
    peer: SocketAddr,
}

impl Request {
    /// Whether the initiator asked for MPA CRC.
    pub fn crc_requested(&self) -> bool {
        self.req.frame.crc()
    }
    pub fn mpa_revision(&self) -> u8 {
        self.req.frame.revision
    }
}

impl ConnectRequest for Request {
    type Qp = Qp;

    fn private_data(&self) -> &[u8] {
        &self.req.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    fn peer_ird_ord(&self) -> (u16, u16) {
        self.req.word.map(|w| (w.ird, w.ord)).unwrap_or((0, 0))
    }

    fn accept(self, qp: &Qp, params: &ConnParams) -> Result<ConnInfo> {
        let qp = &qp.shared;
        check_attachable(qp)?;
        let local = local_params(params)?;
        let (reply, neg) =
            mpa::build_reply(&self.req, &local).map_err(|e| Error::Connect(e.to_string()))?;
        let mut s = self.stream;
        s.set_read_timeout(None)?;
        s.write_all(&reply.encode())?;
        mark_attached(qp);
        let info = ConnInfo {
            peer_private_data: neg.peer_private_data.clone(),
            peer_addr: self.peer,
            ird: neg.ird,
            ord: neg.ord,
            crc: neg.crc,
        };
        qp.engine.send(Cmd::Attach(Box::new(Attach {
            qp: qp.clone(),
            stream: s,
            crc: neg.crc,
            ird: neg.ird,
            ord: neg.ord,
            send_rtr: None,
            hold_tx: true,
        })));
        Ok(info)
    }

    fn reject(self, private_data: &[u8]) -> Result<()> {
        let mut s = self.stream;
        s.write_all(&mpa::build_reject(&self.req, private_data).encode())?;
        let _ = s.shutdown(std::net::Shutdown::Both);
        Ok(())
    }
}
