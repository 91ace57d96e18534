//! The controller (target) side of one NVMe/TCP connection, sans IO.
//!
//! [`ControllerQueue::receive`] takes the bytes the host sent and returns [`Action`]s: bytes
//! to send (the ICResp, R2Ts, response capsules the transport itself decides, a TermReq),
//! commands to execute with all their host-to-controller data, and the end of the
//! connection. The caller executes each command and answers with
//! [`ControllerQueue::respond`] or, for read data, [`ControllerQueue::respond_with_data`],
//! which return the PDUs to send, the data borrowed from the caller.
//!
//! The sequence: an ICReq first (PFV 0, HPDA at most 31), answered by an ICResp enabling
//! the digests the host asked for and this side allows; then command capsules. A write's
//! data comes in the capsule (an SGL Data Block descriptor with the Offset sub type, at
//! offset 0, of exactly the capsule's data) or is asked for by R2Ts (a Transport Data Block
//! descriptor): one R2T outstanding per command, each for at most `max_r2t_len` bytes, so
//! the host's MAXR2T is never exceeded; every H2CData must carry the R2T's CID and TTAG,
//! continue at the next offset within the R2T, and set LAST_PDU exactly on the PDU that
//! ends it. Read data is cut into C2HData PDUs of at most `c2h_cut` bytes; with SQ flow
//! control disabled a successful read with no command-specific result ends with SUCCESS
//! on its last C2HData instead of a response capsule.
//!
//! A data digest error fails only its command (Transient Transport Error); every other
//! error ends the connection with a C2HTermReq. Commands are passed through one by one:
//! fusing a Compare with its Write, and the Fabrics and admin semantics, are the caller's.

use crate::cqe::{Cqe, Status};
use crate::decoder::{DecodeError, Decoder, DecoderConfig, Role};
use crate::pdu::{encode, offset, Encoded, Framing, IcReq, IcResp, Pdu, PduHeader, R2t, TermReq};
use crate::sqe::{DataDirection, Sqe, SGL_INCAPSULE, SGL_TRANSPORT};
use crate::status::StatusCode;
use crate::{Fes, PduError, MIN_MAXH2CDATA};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;

/// What the controller offers and allows on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Header digests are enabled when the host asks for them.
    pub allow_hdgst: bool,
    /// Data digests are enabled when the host asks for them.
    pub allow_ddgst: bool,
    /// CPDA announced: the alignment of data in the PDUs the host sends.
    pub cpda: u8,
    /// MAXH2CDATA announced (at least 4096, a multiple of 4).
    pub maxh2cdata: u32,
    /// Most in-capsule data one command capsule may carry.
    pub max_in_capsule: u32,
    /// Most data of one command.
    pub max_transfer: u32,
    /// Most data one R2T asks for.
    pub max_r2t_len: u32,
    /// Most data of one C2HData PDU.
    pub c2h_cut: u32,
    /// Commands outstanding at once (the submission queue's entries) until
    /// [`ControllerQueue::set_sq`] says otherwise.
    pub sq_entries: u16,
}

impl Default for QueueConfig {
    fn default() -> QueueConfig {
        QueueConfig {
            allow_hdgst: true,
            allow_ddgst: true,
            cpda: 0,
            maxh2cdata: 128 * 1024,
            max_in_capsule: 8192,
            max_transfer: 1024 * 1024,
            max_r2t_len: 1024 * 1024,
            c2h_cut: 128 * 1024,
            sq_entries: 128,
        }
    }
}

/// A command ready to execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The submission entry.
    pub sqe: Sqe,
    /// Its host-to-controller data (in-capsule or gathered from H2CData); empty otherwise.
    /// A read returns at most `sqe.sgl().length` bytes.
    pub data: Bytes,
}

/// Why the connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// This side found a fatal error; the C2HTermReq was the last bytes to send.
    Fatal(PduError),
    /// The host sent an H2CTermReq.
    HostTerminated(TermReq),
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send these bytes (whole PDUs).
    Send(Bytes),
    /// Execute this command, then call `respond` or `respond_with_data` with its CID.
    Execute(Command),
    /// Close the connection after sending what came before.
    Close(CloseReason),
}

/// The caller's mistakes in answering commands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// No command with this CID is being executed.
    #[error("no command {0} is being executed")]
    UnknownCommand(u16),
    /// More read data than the command's SGL length.
    #[error("{got} bytes of read data for a command of {max}")]
    DataTooLong {
        /// Bytes given.
        got: usize,
        /// The command's length.
        max: u32,
    },
}

#[derive(Debug)]
struct Receiving {
    sqe: Sqe,
    ttag: u16,
    r2t_end: u32,
    r2t_start: u32,
    next: u32,
    total: u32,
    buf: BytesMut,
    failed: bool,
}

#[derive(Debug)]
enum CmdState {
    Receiving(Box<Receiving>),
    Executing { len: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcReq,
    Ready,
    Closed,
}

/// The controller side of one connection.
#[derive(Debug)]
pub struct ControllerQueue {
    config: QueueConfig,
    decoder: Decoder,
    phase: Phase,
    tx: Framing,
    host_maxr2t: u32,
    commands: HashMap<u16, CmdState>,
    sq_entries: u16,
    sq_flow_control_disabled: bool,
    sqhd: u16,
    next_ttag: u16,
}

fn fatal(fes: Fes, fei: u32, what: &'static str) -> PduError {
    PduError::new(fes, fei, what)
}

impl ControllerQueue {
    /// A connection waiting for the host's ICReq.
    pub fn new(config: QueueConfig) -> ControllerQueue {
        let dc = DecoderConfig {
            role: Role::Controller,
            framing: Framing::default(),
            max_data: config.maxh2cdata,
            max_in_capsule: config.max_in_capsule,
        };
        ControllerQueue {
            config,
            decoder: Decoder::new(dc),
            phase: Phase::AwaitIcReq,
            tx: Framing::default(),
            host_maxr2t: 0,
            commands: HashMap::new(),
            sq_entries: config.sq_entries.max(1),
            sq_flow_control_disabled: false,
            sqhd: 0,
            next_ttag: 0,
        }
    }

    /// What the connection sends with: digests and the host's alignment (after the IC
    /// exchange).
    pub fn tx_framing(&self) -> Framing {
        self.tx
    }

    /// The host's MAXR2T (0's based), from its ICReq.
    pub fn host_maxr2t(&self) -> u32 {
        self.host_maxr2t
    }

    /// True once the IC exchange is done and the connection is not closed.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Commands received and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.commands.len()
    }

    /// Applies a Connect: the submission queue's entries (SQSIZE + 1) and whether SQ flow
    /// control is disabled (then a successful read may end with SUCCESS).
    pub fn set_sq(&mut self, entries: u16, flow_control_disabled: bool) {
        self.sq_entries = entries.max(1);
        self.sqhd %= self.sq_entries;
        self.sq_flow_control_disabled = flow_control_disabled;
    }

    /// Takes bytes from the host; returns what to do, in order.
    pub fn receive(&mut self, mut input: &[u8]) -> Vec<Action> {
        let mut out = Vec::new();
        while self.phase != Phase::Closed && !input.is_empty() {
            let r = match self.decoder.decode(&mut input) {
                Ok(None) => break,
                Ok(Some(pdu)) => self.on_pdu(pdu, &mut out),
                Err(DecodeError::Fatal(e)) => Err(e),
                Err(DecodeError::DataDigest { pdu }) => self.on_digest_error(*pdu, &mut out),
            };
            if let Err(mut e) = r {
                if e.header.is_empty() {
                    e = e.with_header(self.decoder.last_header());
                }
                self.fail(e, &mut out);
            }
        }
        out
    }

    fn fail(&mut self, e: PduError, out: &mut Vec<Action>) {
        let t = TermReq {
            fes: e.fes as u16,
            fei: e.fei,
        };
        let pdu = encode(&PduHeader::C2HTermReq(t), &[&e.header], &self.tx);
        out.push(Action::Send(Bytes::from(pdu.to_vec())));
        out.push(Action::Close(CloseReason::Fatal(e)));
        self.phase = Phase::Closed;
        self.commands.clear();
    }

    fn on_pdu(&mut self, pdu: Pdu, out: &mut Vec<Action>) -> Result<(), PduError> {
        match (self.phase, pdu.header) {
            (_, PduHeader::H2CTermReq(t)) => {
                self.phase = Phase::Closed;
                out.push(Action::Close(CloseReason::HostTerminated(t)));
                Ok(())
            }
            (Phase::AwaitIcReq, PduHeader::IcReq(ic)) => self.on_icreq(ic, out),
            (Phase::Ready, PduHeader::CapsuleCmd(sqe)) => self.on_capsule(sqe, pdu.data, out),
            (Phase::Ready, PduHeader::H2CData(d)) => self.on_h2c_data(d, &pdu.data, false, out),
            _ => Err(fatal(Fes::PduSequenceError, 0, "PDU not allowed here")),
        }
    }

    fn on_digest_error(&mut self, pdu: Pdu, out: &mut Vec<Action>) -> Result<(), PduError> {
        match pdu.header {
            PduHeader::CapsuleCmd(sqe) if self.phase == Phase::Ready => {
                self.admit(&sqe)?;
                self.send_cqe(sqe.cid(), StatusCode::TRANSIENT_TRANSPORT_ERROR, out);
                Ok(())
            }
            PduHeader::H2CData(d) if self.phase == Phase::Ready => {
                self.on_h2c_data(d, &pdu.data, true, out)
            }
            _ => Err(fatal(Fes::PduSequenceError, 0, "PDU not allowed here")),
        }
    }

    fn on_icreq(&mut self, ic: IcReq, out: &mut Vec<Action>) -> Result<(), PduError> {
        if ic.pfv != 0 {
            return Err(fatal(
                Fes::UnsupportedParameter,
                offset::PFV,
                "PFV is not 0",
            ));
        }
        if ic.hpda > 31 {
            return Err(fatal(
                Fes::UnsupportedParameter,
                offset::PDA,
                "HPDA over 31",
            ));
        }
        let resp = IcResp {
            pfv: 0,
            cpda: self.config.cpda.min(31),
            hdgst: ic.hdgst && self.config.allow_hdgst,
            ddgst: ic.ddgst && self.config.allow_ddgst,
            maxh2cdata: self.config.maxh2cdata.max(MIN_MAXH2CDATA) & !3,
        };
        out.push(Action::Send(Bytes::from(
            encode(&PduHeader::IcResp(resp), &[], &self.tx).to_vec(),
        )));
        self.host_maxr2t = ic.maxr2t;
        self.tx = Framing {
            hdgst: resp.hdgst,
            ddgst: resp.ddgst,
            pda: ic.hpda,
        };
        let mut dc = *self.decoder.config();
        dc.framing = Framing {
            hdgst: resp.hdgst,
            ddgst: resp.ddgst,
            pda: resp.cpda,
        };
        dc.max_data = resp.maxh2cdata;
        self.decoder.set_config(dc);
        self.phase = Phase::Ready;
        Ok(())
    }

    /// Counts a command into the submission queue: its CID must be free and the queue
    /// not full.
    fn admit(&mut self, sqe: &Sqe) -> Result<(), PduError> {
        if self.commands.contains_key(&sqe.cid()) {
            return Err(fatal(
                Fes::InvalidHeaderField,
                offset::CAPSULE_CID,
                "CID in use",
            ));
        }
        if self.commands.len() >= usize::from(self.sq_entries) {
            return Err(fatal(
                Fes::PduSequenceError,
                0,
                "more commands than the queue holds",
            ));
        }
        self.sqhd = (self.sqhd + 1) % self.sq_entries;
        Ok(())
    }

    fn on_capsule(&mut self, sqe: Sqe, data: Bytes, out: &mut Vec<Action>) -> Result<(), PduError> {
        self.admit(&sqe)?;
        let cid = sqe.cid();
        let sgl = sqe.sgl();
        let check = match (sqe.psdt(), sqe.direction()) {
            (0 | 3, _) | (_, DataDirection::Bidirectional) => Err(StatusCode::INVALID_FIELD),
            (_, DataDirection::None) if !data.is_empty() => Err(StatusCode::SGL_LENGTH_INVALID),
            (_, DataDirection::None) => Ok(0),
            (_, DataDirection::ControllerToHost) => check_transport(&sqe, &data, &self.config),
            (_, DataDirection::HostToController) if data.is_empty() => {
                check_transport(&sqe, &data, &self.config)
            }
            (_, DataDirection::HostToController) if sgl.id != SGL_INCAPSULE => {
                Err(StatusCode::SGL_TYPE_INVALID)
            }
            (_, DataDirection::HostToController) if sgl.address != 0 => {
                Err(StatusCode::SGL_OFFSET_INVALID)
            }
            (_, DataDirection::HostToController) if sgl.length as usize != data.len() => {
                Err(StatusCode::SGL_LENGTH_INVALID)
            }
            (_, DataDirection::HostToController) => Ok(0),
        };
        let len = match check {
            Ok(len) => len,
            Err(code) => {
                self.send_cqe(cid, code, out);
                return Ok(());
            }
        };
        if sqe.direction() == DataDirection::HostToController && data.is_empty() && len > 0 {
            let first = len.min(self.config.max_r2t_len.max(1));
            let rx = Receiving {
                sqe,
                ttag: 0,
                r2t_start: 0,
                r2t_end: 0,
                next: 0,
                total: len,
                buf: BytesMut::with_capacity(first as usize),
                failed: false,
            };
            let mut rx = Box::new(rx);
            self.send_r2t(cid, &mut rx, out);
            self.commands.insert(cid, CmdState::Receiving(rx));
            return Ok(());
        }
        let read_len = if sqe.direction() == DataDirection::ControllerToHost {
            len
        } else {
            0
        };
        self.commands
            .insert(cid, CmdState::Executing { len: read_len });
        out.push(Action::Execute(Command { sqe, data }));
        Ok(())
    }

    /// Asks for the next range of a write's data, from `rx.next`.
    fn send_r2t(&mut self, cid: u16, rx: &mut Receiving, out: &mut Vec<Action>) {
        let len = (rx.total - rx.next).min(self.config.max_r2t_len.max(1));
        rx.ttag = self.next_ttag;
        self.next_ttag = self.next_ttag.wrapping_add(1);
        rx.r2t_start = rx.next;
        rx.r2t_end = rx.next + len;
        let r2t = R2t {
            cid,
            ttag: rx.ttag,
            offset: rx.next,
            length: len,
        };
        let pdu = encode(&PduHeader::R2T(r2t), &[], &self.tx);
        out.push(Action::Send(Bytes::from(pdu.to_vec())));
    }

    fn on_h2c_data(
        &mut self,
        d: crate::pdu::DataHeader,
        data: &[u8],
        digest_failed: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), PduError> {
        let rx = match self.commands.get_mut(&d.cid) {
            Some(CmdState::Receiving(rx)) => rx,
            Some(CmdState::Executing { .. }) => {
                return Err(fatal(
                    Fes::PduSequenceError,
                    0,
                    "H2CData with no R2T outstanding",
                ))
            }
            None => {
                return Err(fatal(
                    Fes::InvalidHeaderField,
                    offset::CCCID,
                    "H2CData for no command",
                ))
            }
        };
        if d.ttag != rx.ttag {
            return Err(fatal(
                Fes::InvalidHeaderField,
                offset::TTAG,
                "TTAG is not the R2T's",
            ));
        }
        let end = u64::from(d.offset) + data.len() as u64;
        if d.offset < rx.r2t_start || end > u64::from(rx.r2t_end) {
            return Err(fatal(Fes::DataOutOfRange, 0, "H2CData outside its R2T"));
        }
        if d.offset != rx.next {
            return Err(fatal(
                Fes::PduSequenceError,
                0,
                "H2CData not at the next offset",
            ));
        }
        rx.next = end as u32;
        if d.last != (rx.next == rx.r2t_end) {
            return Err(fatal(
                Fes::PduSequenceError,
                0,
                "LAST_PDU not on the R2T's last data",
            ));
        }
        rx.failed |= digest_failed;
        if !rx.failed {
            rx.buf.extend_from_slice(data);
        }
        if !d.last {
            return Ok(());
        }
        if rx.next < rx.total && !rx.failed {
            let mut rx = match self.commands.remove(&d.cid) {
                Some(CmdState::Receiving(rx)) => rx,
                _ => return Ok(()),
            };
            self.send_r2t(d.cid, &mut rx, out);
            self.commands.insert(d.cid, CmdState::Receiving(rx));
            return Ok(());
        }
        let failed = rx.failed;
        let data = std::mem::take(&mut rx.buf).freeze();
        let sqe = rx.sqe;
        if failed {
            self.commands.remove(&d.cid);
            self.send_cqe(d.cid, StatusCode::TRANSIENT_TRANSPORT_ERROR, out);
        } else {
            self.commands.insert(d.cid, CmdState::Executing { len: 0 });
            out.push(Action::Execute(Command { sqe, data }));
        }
        Ok(())
    }

    /// Sends a response capsule with an error `code` (DNR unless the error is transient)
    /// for a command this layer refuses.
    fn send_cqe(&mut self, cid: u16, code: StatusCode, out: &mut Vec<Action>) {
        let dnr = code != StatusCode::TRANSIENT_TRANSPORT_ERROR;
        let mut cqe = Cqe::new(cid, Status::error(code, dnr));
        cqe.sqhd = self.sqhd;
        let pdu = encode(&PduHeader::CapsuleResp(cqe), &[], &self.tx);
        out.push(Action::Send(Bytes::from(pdu.to_vec())));
    }

    fn finish(&mut self, cid: u16) -> Result<u32, QueueError> {
        match self.commands.get(&cid) {
            Some(CmdState::Executing { len }) => {
                let len = *len;
                self.commands.remove(&cid);
                Ok(len)
            }
            _ => Err(QueueError::UnknownCommand(cid)),
        }
    }

    /// The response capsule of an executed command (its CID in `cqe`; SQHD is filled in).
    pub fn respond(&mut self, mut cqe: Cqe) -> Result<Encoded<'static>, QueueError> {
        self.finish(cqe.cid)?;
        cqe.sqhd = self.sqhd;
        Ok(encode(&PduHeader::CapsuleResp(cqe), &[], &self.tx))
    }

    /// The PDUs answering an executed read: its `data` (slices, at most the command's SGL
    /// length in all) in C2HData PDUs, then the response capsule, or nothing more when the
    /// last C2HData carries SUCCESS (SQ flow control disabled, success, DW0 and DW1 zero).
    pub fn respond_with_data<'a>(
        &mut self,
        mut cqe: Cqe,
        data: &[&'a [u8]],
    ) -> Result<Vec<Encoded<'a>>, QueueError> {
        let total: usize = data.iter().map(|d| d.len()).sum();
        let max = match self.commands.get(&cqe.cid) {
            Some(CmdState::Executing { len }) => *len,
            _ => return Err(QueueError::UnknownCommand(cqe.cid)),
        };
        if total > max as usize {
            return Err(QueueError::DataTooLong { got: total, max });
        }
        self.finish(cqe.cid)?;
        cqe.sqhd = self.sqhd;
        let success = self.sq_flow_control_disabled
            && cqe.status.is_success()
            && cqe.dw0 == 0
            && cqe.dw1 == 0
            && total > 0;
        let cut = self.config.c2h_cut.max(1) as usize;
        let mut pdus = Vec::with_capacity(total.div_ceil(cut) + 1);
        let mut at = 0;
        while at < total {
            let n = cut.min(total - at);
            let last = at + n == total;
            let h = crate::pdu::DataHeader {
                cid: cqe.cid,
                ttag: 0,
                offset: at as u32,
                last,
                success: last && success,
            };
            pdus.push(encode(
                &PduHeader::C2HData(h),
                &range(data, at, n),
                &self.tx,
            ));
            at += n;
        }
        if !success {
            pdus.push(encode(&PduHeader::CapsuleResp(cqe), &[], &self.tx));
        }
        Ok(pdus)
    }
}

/// Checks a command whose data the transport moves (R2T/H2CData or C2HData): a Transport
/// Data Block descriptor (or a zero-length in-capsule one) within the transfer limit.
fn check_transport(sqe: &Sqe, data: &[u8], cfg: &QueueConfig) -> Result<u32, StatusCode> {
    let sgl = sqe.sgl();
    if !data.is_empty() {
        return Err(StatusCode::INVALID_FIELD);
    }
    match sgl.id {
        SGL_TRANSPORT if sgl.length > cfg.max_transfer => Err(StatusCode::SGL_LENGTH_INVALID),
        SGL_TRANSPORT => Ok(sgl.length),
        SGL_INCAPSULE if sgl.length == 0 => Ok(0),
        SGL_INCAPSULE => Err(StatusCode::SGL_LENGTH_INVALID),
        _ => Err(StatusCode::SGL_TYPE_INVALID),
    }
}

/// The slices of `data` covering bytes `at..at + n` of their concatenation.
fn range<'a>(data: &[&'a [u8]], mut at: usize, mut n: usize) -> Vec<&'a [u8]> {
    let mut v = Vec::new();
    for d in data {
        if n == 0 {
            break;
        }
        if at >= d.len() {
            at -= d.len();
            continue;
        }
        let take = n.min(d.len() - at);
        v.push(&d[at..at + take]);
        n -= take;
        at = 0;
    }
    v
}
