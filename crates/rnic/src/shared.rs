//! What verbs callers' threads and the progress engine share: each QP's posted work and state
//! (`QpShared`) and the engine's inbox of commands (`EngineShared`, `Cmd`). They name each other
//! (a QP knows its engine; `Cmd::Attach` hands the engine a QP), so they live together here,
//! below the engine, the QP handle and connection management, which all use them.

use crate::cq::{CqShared, QpFailer};
use crate::mem::{MrInner, StagTable};
use iwarp::mpa::Rtr;
use mio::Waker;
use rdma::{Access, QpCaps, QpState, Result, SendOp, Sge, Wc, WcOpcode, WcStatus};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

/// A resolved local SGE: region, offset inside it, length.
#[derive(Clone)]
pub(crate) struct Piece {
    pub mr: Arc<MrInner>,
    pub off: usize,
    pub len: usize,
}

pub(crate) struct PostedSend {
    pub wr_id: u64,
    pub op: SendOp,
    pub pieces: Vec<Piece>,
    pub total: usize,
    pub signaled: bool,
    /// For RDMA Read: the sink STag and address named by the single SGE.
    pub sink: Option<(u32, u64)>,
}

pub(crate) struct PostedRecv {
    pub wr_id: u64,
    pub pieces: Vec<Piece>,
    pub total: usize,
}

pub(crate) struct QpQueues {
    pub sq: VecDeque<PostedSend>,
    pub rq: VecDeque<PostedRecv>,
    pub state: QpState,
    pub attached: bool,
    pub error: Option<String>,
}

pub(crate) struct QpShared {
    pub num: u32,
    pub pd: u32,
    pub stags: Arc<StagTable>,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    pub caps: QpCaps,
    pub q: Mutex<QpQueues>,
    pub cv: Condvar,
    pub kick: AtomicBool,
    pub engine: Arc<EngineShared>,
    /// The attached connection's transmit side, for posting in place (set by the engine when
    /// it attaches the QP; weak, as the engine owns the connection).
    pub in_place: OnceLock<Weak<dyn TransmitInPlace>>,
}

/// A connection's transmit side as a poster may run it on its own thread: what `post_send`
/// calls when it queued a work request on an empty send queue, so that the FPDUs are written
/// without a turn of the engine (no wake-up, no switch to the engine's thread or task).
pub(crate) trait TransmitInPlace: Send + Sync {
    /// Generates and writes what the QP has queued, unless the engine is serving the
    /// connection just now; true when nothing was left for the engine to write (all written,
    /// nothing queued), false when it must take it up (busy, the socket would block, work
    /// left, or the connection failed).
    fn transmit_in_place(&self) -> bool;
}

impl QpShared {
    pub(crate) fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: usize) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            byte_len: byte_len as u32,
            invalidated_rkey: None,
            solicited: false,
            qp_num: self.num,
        }
    }

    pub(crate) fn resolve(&self, sges: &[Sge], need: Access) -> Result<(Vec<Piece>, usize)> {
        if sges.len() > self.caps.max_sge as usize {
            return Err(rdma::Error::Invalid(format!(
                "{} SGEs exceed max_sge {}",
                sges.len(),
                self.caps.max_sge
            )));
        }
        let mut pieces = Vec::with_capacity(sges.len());
        let mut total = 0usize;
        for s in sges {
            let (mr, off) = self
                .stags
                .check(s.lkey, self.pd, need, s.addr, s.len as u64)
                .map_err(|e| {
                    rdma::Error::Invalid(format!("local SGE lkey {:#x}: {e:?}", s.lkey))
                })?;
            total += s.len as usize;
            pieces.push(Piece {
                mr,
                off,
                len: s.len as usize,
            });
        }
        Ok((pieces, total))
    }

    /// Moves the QP to Error and completes everything outstanding with `Flushed`.
    pub(crate) fn flush_all(&self, reason: Option<String>) {
        let (sq, rq) = {
            let mut q = self.q.lock().unwrap();
            q.state = QpState::Error;
            if q.error.is_none() {
                q.error = reason;
            }
            (std::mem::take(&mut q.sq), std::mem::take(&mut q.rq))
        };
        for s in sq {
            let op = match s.op {
                SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
                SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
                _ => WcOpcode::Send,
            };
            self.send_cq
                .push(self.wc(s.wr_id, WcStatus::Flushed, op, 0));
        }
        for r in rq {
            self.recv_cq
                .push(self.wc(r.wr_id, WcStatus::Flushed, WcOpcode::Recv, 0));
        }
        self.cv.notify_all();
    }

    pub(crate) fn set_state(&self, st: QpState) {
        self.q.lock().unwrap().state = st;
        self.cv.notify_all();
    }

    /// Writes the queued work on the caller's thread when the engine allows it (see
    /// [`TransmitInPlace`]); true when that left the engine nothing to write.
    pub(crate) fn transmit_in_place(&self) -> bool {
        if !self.engine.post_in_place.load(Ordering::Relaxed) {
            return false;
        }
        match self.in_place.get().and_then(Weak::upgrade) {
            Some(tx) => tx.transmit_in_place(),
            None => false,
        }
    }

    pub(crate) fn kick(&self) {
        if !self.kick.swap(true, Ordering::AcqRel) {
            self.engine.send(Cmd::Kick(self.num));
        }
    }
}

pub(crate) struct Attach {
    pub qp: Arc<QpShared>,
    pub stream: std::net::TcpStream,
    pub crc: bool,
    pub ird: u16,
    pub ord: u16,
    /// Initiator in peer-to-peer mode: send this RTR first.
    pub send_rtr: Option<Rtr>,
    /// Responder: send nothing until the initiator's first FPDU has arrived (RFC 5044).
    pub hold_tx: bool,
}

pub(crate) enum Cmd {
    Attach(Box<Attach>),
    Kick(u32),
    Disconnect(u32),
    Abort(u32),
    /// Tears a connection down at once: what is queued is dropped, everything outstanding
    /// flushed, the socket shut (see `QueuePair::abort`).
    Reset(u32),
    /// Moves a QP to the error state for a local reason (e.g. its CQ overflowed).
    Fail(u32, String),
    Stop,
}

pub(crate) struct EngineShared {
    wake: Wake,
    inbox: Mutex<Vec<Cmd>>,
    /// Align FPDUs with TCP segments on loopback connections too (see `Conn::align_fpdus`).
    pub(crate) align_on_loopback: AtomicBool,
    /// Posters write a send queue's work themselves when it was empty (see
    /// [`TransmitInPlace`]); off (the default): every post goes through the engine.
    pub(crate) post_in_place: AtomicBool,
}

impl EngineShared {
    pub(crate) fn new(wake: Wake) -> EngineShared {
        EngineShared {
            wake,
            inbox: Mutex::new(Vec::new()),
            align_on_loopback: AtomicBool::new(false),
            post_in_place: AtomicBool::new(false),
        }
    }

    /// Everything posted since the last call, oldest first.
    pub(crate) fn take_cmds(&self) -> Vec<Cmd> {
        std::mem::take(&mut *self.inbox.lock().unwrap())
    }

    pub(crate) fn send(&self, cmd: Cmd) {
        self.inbox.lock().unwrap().push(cmd);
        match &self.wake {
            Wake::Thread(waker) => {
                let _ = waker.wake();
            }
            Wake::Kick(kick) => kick(),
        }
    }
}

/// How a posted command reaches the engine.
pub(crate) enum Wake {
    /// Its own thread sleeps in epoll: an eventfd registered there.
    Thread(Waker),
    /// It is driven by its owner's event loop (see `Driver`): that loop's own wake-up, so
    /// that posting from it costs no system call.
    Kick(Box<dyn Fn() + Send + Sync>),
}

impl QpFailer for EngineShared {
    fn fail_qp(&self, qp_num: u32, reason: String) {
        self.send(Cmd::Fail(qp_num, reason));
    }
}
