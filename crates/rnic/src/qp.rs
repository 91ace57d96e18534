//! Queue pairs: the user-facing handle and the state shared with the progress engine.

use crate::cq::CqShared;
use crate::engine::{Cmd, EngineShared};
use crate::mem::{MrInner, StagTable};
use rdma::{
    Access, ConnInfo, ConnParams, QpCaps, QpState, QueuePair, RecvWr, Result, SendOp, SendWr, Sge,
    Wc, WcOpcode, WcStatus,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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

    fn resolve(&self, sges: &[Sge], need: Access) -> Result<(Vec<Piece>, usize)> {
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

    fn kick(&self) {
        if !self.kick.swap(true, Ordering::AcqRel) {
            self.engine.send(Cmd::Kick(self.num));
        }
    }
}

/// A reliable connected queue pair of the software RNIC.
pub struct Qp {
    pub(crate) shared: Arc<QpShared>,
}

impl Qp {
    /// The error that moved the QP to the error state, if any (e.g. a received Terminate).
    pub fn last_error(&self) -> Option<String> {
        self.shared.q.lock().unwrap().error.clone()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.shared.engine.send(Cmd::Abort(self.shared.num));
    }
}

impl QueuePair for Qp {
    fn qp_num(&self) -> u32 {
        self.shared.num
    }

    fn state(&self) -> QpState {
        self.shared.q.lock().unwrap().state
    }

    fn post_send(&self, wr: SendWr) -> Result<()> {
        let s = &self.shared;
        let (pieces, total, sink) = match wr.op {
            SendOp::RdmaRead { .. } => {
                if wr.sges.len() != 1 {
                    return Err(rdma::Error::Invalid(
                        "an RDMA Read takes exactly one SGE".into(),
                    ));
                }
                let (p, t) = s.resolve(&wr.sges, Access::LOCAL_WRITE)?;
                (p, t, Some((wr.sges[0].lkey, wr.sges[0].addr)))
            }
            _ => {
                let (p, t) = s.resolve(&wr.sges, Access::NONE)?;
                (p, t, None)
            }
        };
        if total > u32::MAX as usize {
            return Err(rdma::Error::Invalid("message longer than 4 GiB".into()));
        }
        let posted = PostedSend {
            wr_id: wr.wr_id,
            op: wr.op,
            pieces,
            total,
            signaled: wr.signaled,
            sink,
        };
        {
            let mut q = s.q.lock().unwrap();
            if q.sq.len() >= s.caps.max_send_wr as usize {
                return Err(rdma::Error::Invalid("send queue full".into()));
            }
            if q.state == QpState::Error {
                drop(q);
                let op = match wr.op {
                    SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
                    SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
                    _ => WcOpcode::Send,
                };
                s.send_cq.push(s.wc(wr.wr_id, WcStatus::Flushed, op, 0));
                return Ok(());
            }
            q.sq.push_back(posted);
            if !q.attached {
                return Ok(());
            }
        }
        s.kick();
        Ok(())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let s = &self.shared;
        let (pieces, total) = s.resolve(&wr.sges, Access::LOCAL_WRITE)?;
        let mut q = s.q.lock().unwrap();
        if q.rq.len() >= s.caps.max_recv_wr as usize {
            return Err(rdma::Error::Invalid("receive queue full".into()));
        }
        if q.state == QpState::Error {
            drop(q);
            s.recv_cq
                .push(s.wc(wr.wr_id, WcStatus::Flushed, WcOpcode::Recv, 0));
            return Ok(());
        }
        q.rq.push_back(PostedRecv {
            wr_id: wr.wr_id,
            pieces,
            total,
        });
        Ok(())
    }

    fn connect(&self, addr: SocketAddr, params: &ConnParams) -> Result<ConnInfo> {
        crate::cm::connect(&self.shared, addr, params)
    }

    fn disconnect(&self) {
        let attached = {
            let mut q = self.shared.q.lock().unwrap();
            if q.state == QpState::Rts {
                q.state = QpState::Closing;
            }
            q.attached
        };
        if attached {
            self.shared.engine.send(Cmd::Disconnect(self.shared.num));
        } else {
            self.shared.flush_all(None);
        }
    }

    fn abort(&self) {
        let attached = self.shared.q.lock().unwrap().attached;
        if attached {
            self.shared.engine.send(Cmd::Reset(self.shared.num));
        } else {
            self.shared.flush_all(Some("connection aborted".into()));
        }
    }

    fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.q.lock().unwrap();
        while q.state != QpState::Error {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self.shared.cv.wait_timeout(q, deadline - now).unwrap().0;
        }
        true
    }
}
