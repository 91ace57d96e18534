//! Connection management: TCP connect/accept plus the MPA Request/Reply exchange, done blocking
//! in the caller's thread (bounded by timeouts); the established socket is then handed to the
//! progress engine.

use crate::engine::{Attach, Cmd};
use crate::qp::{Qp, QpShared};
use iwarp::mpa::{self, LocalParams, MpaError, MpaFrame, MpaKind, PeerRequest};
use rdma::{ConnInfo, ConnParams, ConnectRequest, Error, Listener, QpState, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// Linux accepts at most 256 bytes of MPA private data (RDMA_MAX_PRIVATE_DATA).
pub const MAX_PRIVATE_DATA: usize = 256;
/// siw waits this long for the MPA Request after accepting TCP.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn local_params(p: &ConnParams) -> Result<LocalParams> {
    let word = if p.mpa_revision >= 2 {
        mpa::Rfc6581::LEN
    } else {
        0
    };
    if p.private_data.len() + word > MAX_PRIVATE_DATA {
        return Err(Error::Invalid(format!(
            "private data longer than {} bytes",
            MAX_PRIVATE_DATA - word
        )));
    }
    Ok(LocalParams {
        revision: p.mpa_revision.clamp(1, 2),
        crc: p.crc,
        ird: p.ird,
        ord: p.ord,
        p2p: p.p2p,
        private_data: p.private_data.clone(),
    })
}

fn read_frame(s: &mut TcpStream, kind: MpaKind) -> Result<MpaFrame> {
    let mut head = [0u8; mpa::HEADER_LEN];
    s.read_exact(&mut head)
        .map_err(|e| Error::Connect(format!("reading MPA {kind:?}: {e}")))?;
    let total = MpaFrame::frame_len(&head).map_err(|e| Error::Connect(e.to_string()))?;
    if total - mpa::HEADER_LEN > MAX_PRIVATE_DATA {
        return Err(Error::Connect(format!(
            "MPA {kind:?} announces {} bytes of private data",
            total - mpa::HEADER_LEN
        )));
    }
    let mut buf = head.to_vec();
    buf.resize(total, 0);
    s.read_exact(&mut buf[mpa::HEADER_LEN..])
        .map_err(|e| Error::Connect(format!("reading MPA private data: {e}")))?;
    let (f, _) = MpaFrame::decode(&buf, kind, MAX_PRIVATE_DATA)
        .map_err(|e| Error::Connect(e.to_string()))?;
    Ok(f)
}

fn tune(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true)?;
    let _ = s.as_raw_fd();
    Ok(())
}

/// Rts and owned by the engine from now on: later posts and disconnects go through it.
fn mark_attached(qp: &QpShared) {
    let mut q = qp.q.lock().unwrap();
    q.state = QpState::Rts;
    q.attached = true;
}

fn check_attachable(qp: &QpShared) -> Result<()> {
    let q = qp.q.lock().unwrap();
    if q.state != QpState::Init || q.attached {
        return Err(Error::Invalid(format!(
            "QP {} is not in the Init state",
            qp.num
        )));
    }
    Ok(())
}

pub(crate) fn connect(
    qp: &Arc<QpShared>,
    addr: SocketAddr,
    params: &ConnParams,
) -> Result<ConnInfo> {
    check_attachable(qp)?;
    let local = local_params(params)?;
    let mut s = TcpStream::connect_timeout(&addr, params.timeout)
        .map_err(|e| Error::Connect(format!("TCP connect to {addr}: {e}")))?;
    tune(&s)?;
    s.set_read_timeout(Some(params.timeout))?;
    s.write_all(&mpa::build_request(&local).encode())?;
    let reply = read_frame(&mut s, MpaKind::Reply)?;
    let neg = match mpa::process_reply(&local, &reply) {
        Ok(n) => n,
        Err(MpaError::Rejected(pd)) => return Err(Error::Rejected(pd)),
        Err(e) => return Err(Error::Connect(e.to_string())),
    };
    s.set_read_timeout(None)?;
    if neg.rtr.is_none() && !params.first_fpdu_delay.is_zero() {
        // Without an RTR handshake, give a Linux siw responder time to start reading its socket.
        std::thread::sleep(params.first_fpdu_delay);
    }
    let info = ConnInfo {
        peer_private_data: neg.peer_private_data.clone(),
        peer_addr: addr,
        ird: neg.ird,
        ord: neg.ord,
        crc: neg.crc,
    };
    mark_attached(qp);
    qp.engine.send(Cmd::Attach(Box::new(Attach {
        qp: qp.clone(),
        stream: s,
        crc: neg.crc,
        ird: neg.ird,
        ord: neg.ord,
        send_rtr: neg.rtr,
        hold_tx: false,
    })));
    Ok(info)
}

/// A listening endpoint.
pub struct RnicListener {
    pub(crate) sock: TcpListener,
}

impl Listener for RnicListener {
    type Request = Request;

    fn local_addr(&self) -> SocketAddr {
        self.sock
            .local_addr()
            .expect("bound listener has an address")
    }

    fn get_request(&self, timeout: Duration) -> Result<Option<Request>> {
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            return Ok(None);
        }
        let (s, peer) = match self.sock.accept() {
            Ok(v) => v,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        s.set_nonblocking(false)?;
        Request::read_from(s, peer, REQUEST_TIMEOUT).map(Some)
    }
}

impl Request {
    /// Reads the MPA Request from a TCP connection someone else accepted (a listener that
    /// serves iSCSI/TCP and iWARP on one port, telling them apart by the first bytes),
    /// waiting at most `timeout` for it. The stream must be in blocking mode. A Request this
    /// RNIC cannot serve (markers, a bad revision) is refused with a rejecting Reply.
    pub fn read_from(mut s: TcpStream, peer: SocketAddr, timeout: Duration) -> Result<Request> {
        tune(&s)?;
        s.set_read_timeout(Some(timeout))?;
        let frame = read_frame(&mut s, MpaKind::Request)?;
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
