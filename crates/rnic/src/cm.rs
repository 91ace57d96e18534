//! Connection management: TCP connect plus the MPA Request/Reply exchange, done blocking in
//! the caller's thread (bounded by timeouts), and the steps both sides share (the listener's
//! side is `listener.rs`). The established socket is then handed to the progress engine.

use crate::shared::{Attach, Cmd, QpShared};
use iwarp::mpa::{self, LocalParams, MpaError, MpaFrame, MpaKind};
use rdma::{ConnInfo, ConnParams, Error, QpState, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Linux accepts at most 256 bytes of MPA private data (RDMA_MAX_PRIVATE_DATA).
pub const MAX_PRIVATE_DATA: usize = 256;

pub(crate) fn local_params(p: &ConnParams) -> Result<LocalParams> {
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

pub(crate) fn read_frame(s: &mut TcpStream, kind: MpaKind) -> Result<MpaFrame> {
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

pub(crate) fn tune(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true)?;
    let _ = s.as_raw_fd();
    Ok(())
}

/// Rts and owned by the engine from now on: later posts and disconnects go through it.
pub(crate) fn mark_attached(qp: &QpShared) {
    let mut q = qp.q.lock().unwrap();
    q.state = QpState::Rts;
    q.attached = true;
}

pub(crate) fn check_attachable(qp: &QpShared) -> Result<()> {
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
