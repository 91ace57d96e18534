//! The host side of one NVMe/TCP connection (one queue), sans IO.
//!
//! [`HostQueue::new`] queues the ICReq; [`HostQueue::receive`] takes the controller's bytes,
//! [`HostQueue::submit`] a command; both leave bytes to send in the output
//! ([`HostQueue::take_output`]) and finished commands in [`HostQueue::take_completions`].
//!
//! - The ICResp must be PFV 0, enable no digest the host did not ask for, and announce a
//!   MAXH2CDATA of at least 4096 bytes (a multiple of 4); its CPDA aligns the host's data.
//! - A write's data goes in the capsule when it fits the in-capsule limit (the controller's
//!   IOCCSZ for I/O queues, [`HostQueue::set_in_capsule_limit`]), else it waits for R2Ts:
//!   each R2T's range is answered at once by H2CData PDUs of at most MAXH2CDATA bytes, the
//!   last one flagged LAST_PDU.
//! - A read's C2HData PDUs come in order, each continuing where the last ended and within
//!   the command's length; LAST_PDU with SUCCESS completes the command without a response capsule.
//! - A response capsule completes the command of its CID.
//!
//! Everything else ends the connection: a PDU for a CID with nothing outstanding, data out
//! of range, an R2T for a read, a malformed PDU, a C2HTermReq. The error is returned (and
//! kept: every later call returns it again); for errors of the controller's PDUs an
//! H2CTermReq naming the fatal error status is left in the output. A data digest error fails
//! only its command ([`Completion::digest_error`]).

use bytes::{Bytes, BytesMut};
use nvme_tcp::cqe::{Cqe, Status};
use nvme_tcp::decoder::{DecodeError, Decoder, DecoderConfig, Role};
use nvme_tcp::pdu::{
    encode, offset, DataHeader, Framing, IcReq, IcResp, Pdu, PduHeader, R2t, TermReq,
};
use nvme_tcp::sqe::{SglDescriptor, Sqe};
use nvme_tcp::{Fes, PduError, MIN_MAXH2CDATA};

/// What the host asks for on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostConfig {
    /// Ask for header digests.
    pub hdgst: bool,
    /// Ask for data digests.
    pub ddgst: bool,
    /// Commands outstanding at once: CIDs are 0 to `depth - 1`.
    pub depth: u16,
    /// Most data of one command (and so of one C2HData PDU).
    pub max_transfer: u32,
    /// Most in-capsule data until [`HostQueue::set_in_capsule_limit`] (the admin queue's
    /// Connect needs 1 KiB).
    pub in_capsule: u32,
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            hdgst: false,
            ddgst: false,
            depth: 32,
            max_transfer: 1 << 20,
            in_capsule: 8192,
        }
    }
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The command's CID (free again).
    pub cid: u16,
    /// The completion entry (made up, successful, when the read data carried SUCCESS).
    pub cqe: Cqe,
    /// The read data (empty for other commands).
    pub data: Bytes,
    /// A C2HData PDU of this command failed its data digest: the data is not to be used.
    pub digest_error: bool,
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The controller sent something invalid; an H2CTermReq says so.
    #[error("protocol error from the controller: {0}")]
    Protocol(PduError),
    /// The controller ended the connection with a C2HTermReq.
    #[error("the controller ended the connection: C2HTermReq FES {fes:#x} ({}), FEI {fei}", fes_name(*fes))]
    TermReq {
        /// Fatal error status.
        fes: u16,
        /// Fatal error information.
        fei: u32,
    },
}

fn fes_name(fes: u16) -> &'static str {
    Fes::from_u16(fes).map_or("unknown", Fes::name)
}

/// Why a command could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The IC exchange has not finished.
    #[error("the connection is not initialized yet")]
    NotReady,
    /// Every CID is in use.
    #[error("all {0} command identifiers are in use")]
    Full(u16),
    /// The data is larger than the connection allows.
    #[error("{0} bytes of data exceed the {1}-byte command limit")]
    TooLarge(usize, u32),
    /// The connection failed.
    #[error(transparent)]
    Failed(#[from] HostError),
}

/// A command outstanding.
#[derive(Debug)]
struct Cmd {
    /// Write data not sent in the capsule (waits for R2Ts).
    write: Option<Bytes>,
    /// Read buffer and which bytes arrived.
    read: BytesMut,
    received: u32,
    digest_error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitIcResp,
    Ready,
}

/// One connection's host side.
#[derive(Debug)]
pub struct HostQueue {
    cfg: HostConfig,
    state: State,
    decoder: Decoder,
    /// How PDUs to the controller are framed (digests, its CPDA).
    send: Framing,
    maxh2cdata: u32,
    in_capsule: u32,
    cmds: Vec<Option<Cmd>>,
    free: Vec<u16>,
    out: Vec<u8>,
    done: Vec<Completion>,
    failed: Option<HostError>,
}

fn seq(fei: u32, what: &'static str) -> PduError {
    PduError::new(Fes::PduSequenceError, fei, what)
}

fn range(what: &'static str) -> PduError {
    PduError::new(Fes::DataOutOfRange, 0, what)
}

impl HostQueue {
    /// A connection about to start: the ICReq is in the output.
    pub fn new(cfg: HostConfig) -> HostQueue {
        let depth = cfg.depth.max(1);
        let mut q = HostQueue {
            cfg,
            state: State::AwaitIcResp,
            decoder: Decoder::new(DecoderConfig::new(Role::Host, cfg.max_transfer, 0)),
            send: Framing::default(),
            maxh2cdata: MIN_MAXH2CDATA,
            in_capsule: cfg.in_capsule,
            cmds: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            out: Vec::new(),
            done: Vec::new(),
            failed: None,
        };
        let ic = PduHeader::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: cfg.hdgst,
            ddgst: cfg.ddgst,
            maxr2t: 0,
        });
        encode(&ic, &[], &Framing::default()).write_to(&mut q.out);
        q
    }

    /// True once the ICResp was accepted.
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready && self.failed.is_none()
    }

    /// The digests the controller enabled (header, data).
    pub fn digests(&self) -> (bool, bool) {
        (self.send.hdgst, self.send.ddgst)
    }

    /// MAXH2CDATA the controller announced.
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Sets the most in-capsule data (from Identify Controller's IOCCSZ).
    pub fn set_in_capsule_limit(&mut self, bytes: u32) {
        self.in_capsule = bytes;
    }

    /// Commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.cmds.len() - self.free.len()
    }

    /// The error that ended the connection, if one did.
    pub fn failed(&self) -> Option<&HostError> {
        self.failed.as_ref()
    }

    /// Bytes to send, taken.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// True when there are bytes to send.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Finished commands, taken.
    pub fn take_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.done)
    }

    /// Sends `sqe` (its CID and data pointer are set here) with `write` data, or expecting
    /// `read_len` bytes back; returns the CID.
    pub fn submit(
        &mut self,
        mut sqe: Sqe,
        write: Bytes,
        read_len: u32,
    ) -> Result<u16, SubmitError> {
        if let Some(e) = &self.failed {
            return Err(e.clone().into());
        }
        if self.state != State::Ready {
            return Err(SubmitError::NotReady);
        }
        let len = write.len().max(read_len as usize);
        if len > self.cfg.max_transfer as usize {
            return Err(SubmitError::TooLarge(len, self.cfg.max_transfer));
        }
        let cid = self.free.pop().ok_or(SubmitError::Full(self.cfg.depth))?;
        sqe.set_cid(cid);
        let in_capsule = !write.is_empty() && write.len() <= self.in_capsule as usize;
        let sgl = if in_capsule {
            SglDescriptor::in_capsule(write.len() as u32)
        } else {
            SglDescriptor::transport(len as u32)
        };
        sqe.set_sgl(sgl);
        let data: &[&[u8]] = if in_capsule { &[&write[..]] } else { &[] };
        encode(&PduHeader::CapsuleCmd(sqe), data, &self.send).write_to(&mut self.out);
        let mut read = BytesMut::new();
        read.resize(read_len as usize, 0);
        self.cmds[usize::from(cid)] = Some(Cmd {
            write: (!in_capsule && !write.is_empty()).then_some(write),
            read,
            received: 0,
            digest_error: false,
        });
        Ok(cid)
    }

    /// Takes the controller's bytes. An error ends the connection.
    pub fn receive(&mut self, mut input: &[u8]) -> Result<(), HostError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // Bounded: every round consumes input or returns.
        loop {
            let r = match self.decoder.decode(&mut input) {
                Ok(None) => return Ok(()),
                Ok(Some(pdu)) => self.on_pdu(pdu),
                Err(DecodeError::DataDigest { pdu }) => self.on_digest_error(*pdu),
                Err(DecodeError::Fatal(e)) => Err(HostError::Protocol(e)),
            };
            if let Err(e) = r {
                return Err(self.fail(e));
            }
        }
    }

    /// Records the end of the connection; for a protocol error, queues an H2CTermReq.
    fn fail(&mut self, e: HostError) -> HostError {
        if let HostError::Protocol(p) = &e {
            let t = PduHeader::H2CTermReq(TermReq {
                fes: p.fes as u16,
                fei: p.fei,
            });
            encode(&t, &[&p.header], &self.send).write_to(&mut self.out);
        }
        self.failed = Some(e.clone());
        e
    }

    fn on_pdu(&mut self, pdu: Pdu) -> Result<(), HostError> {
        let header = self.decoder.last_header().to_vec();
        let with = |e: PduError| HostError::Protocol(e.with_header(&header));
        match (self.state, pdu.header) {
            (State::AwaitIcResp, PduHeader::IcResp(ic)) => self.on_ic_resp(ic).map_err(with),
            (_, PduHeader::C2HTermReq(t)) => Err(HostError::TermReq {
                fes: t.fes,
                fei: t.fei,
            }),
            (State::Ready, PduHeader::CapsuleResp(cqe)) => self.on_response(cqe).map_err(with),
            (State::Ready, PduHeader::C2HData(d)) => self.on_data(d, &pdu.data).map_err(with),
            (State::Ready, PduHeader::R2T(r)) => self.on_r2t(r).map_err(with),
            _ => Err(with(seq(0, "PDU not allowed in this state"))),
        }
    }

    fn on_ic_resp(&mut self, ic: IcResp) -> Result<(), PduError> {
        let unsupported = |fei, what| PduError::new(Fes::UnsupportedParameter, fei, what);
        if ic.pfv != 0 {
            return Err(unsupported(offset::PFV, "ICResp PFV is not 0"));
        }
        if (ic.hdgst && !self.cfg.hdgst) || (ic.ddgst && !self.cfg.ddgst) {
            return Err(unsupported(
                offset::DIGEST,
                "ICResp enables a digest not asked for",
            ));
        }
        if ic.cpda > 31 {
            return Err(unsupported(offset::PDA, "ICResp CPDA above 31"));
        }
        if ic.maxh2cdata < MIN_MAXH2CDATA || !ic.maxh2cdata.is_multiple_of(4) {
            return Err(unsupported(
                offset::MAX,
                "ICResp MAXH2CDATA below 4096 or not dwords",
            ));
        }
        self.send = Framing {
            hdgst: ic.hdgst,
            ddgst: ic.ddgst,
            pda: ic.cpda,
        };
        let mut dc = *self.decoder.config();
        dc.framing = Framing {
            hdgst: ic.hdgst,
            ddgst: ic.ddgst,
            pda: 0,
        };
        self.decoder.set_config(dc);
        self.maxh2cdata = ic.maxh2cdata;
        self.state = State::Ready;
        Ok(())
    }

    fn cmd(&mut self, cid: u16) -> Result<&mut Cmd, PduError> {
        self.cmds
            .get_mut(usize::from(cid))
            .and_then(Option::as_mut)
            .ok_or(PduError::new(
                Fes::InvalidHeaderField,
                offset::CCCID,
                "no command outstanding with this CID",
            ))
    }

    fn complete(&mut self, cid: u16, cqe: Cqe) {
        if let Some(c) = self.cmds.get_mut(usize::from(cid)).and_then(Option::take) {
            self.free.push(cid);
            self.done.push(Completion {
                cid,
                cqe,
                data: c.read.freeze(),
                digest_error: c.digest_error,
            });
        }
    }

    fn on_response(&mut self, cqe: Cqe) -> Result<(), PduError> {
        let cid = cqe.cid;
        let c = self.cmd(cid).map_err(|_| {
            PduError::new(
                Fes::InvalidHeaderField,
                8 + 12,
                "response capsule for a CID with nothing outstanding",
            )
        })?;
        if cqe.status.is_success() && c.received as usize != c.read.len() {
            return Err(range("successful read with data missing"));
        }
        self.complete(cid, cqe);
        Ok(())
    }

    fn on_data(&mut self, d: DataHeader, data: &[u8]) -> Result<(), PduError> {
        let c = self.cmd(d.cid)?;
        let (at, n) = (d.offset as usize, data.len());
        if at != c.received as usize {
            return Err(PduError::new(
                Fes::DataOutOfRange,
                offset::DATAO,
                "C2HData does not continue where the last ended",
            ));
        }
        let end = at + n;
        if end > c.read.len() {
            return Err(range("C2HData beyond the command's read length"));
        }
        c.read[at..end].copy_from_slice(data);
        c.received += n as u32;
        if d.success {
            if c.received as usize != c.read.len() {
                return Err(range("C2HData SUCCESS before all the data"));
            }
            let cqe = Cqe::new(d.cid, Status::SUCCESS);
            self.complete(d.cid, cqe);
        }
        Ok(())
    }

    fn on_digest_error(&mut self, pdu: Pdu) -> Result<(), HostError> {
        match pdu.header {
            PduHeader::C2HData(d) => {
                let c = self.cmd(d.cid).map_err(HostError::Protocol)?;
                if d.offset != c.received || c.received as usize + pdu.data.len() > c.read.len() {
                    return Err(HostError::Protocol(range("C2HData out of order or range")));
                }
                c.digest_error = true;
                // Counted as received so that the response (or SUCCESS) still matches.
                c.received = c.received.saturating_add(pdu.data.len() as u32);
                if d.success {
                    self.complete(d.cid, Cqe::new(d.cid, Status::SUCCESS));
                }
                Ok(())
            }
            _ => Err(HostError::Protocol(seq(
                0,
                "data digest error on a PDU without data",
            ))),
        }
    }

    fn on_r2t(&mut self, r: R2t) -> Result<(), PduError> {
        let (maxh2c, framing) = (self.maxh2cdata as usize, self.send);
        let c = self.cmd(r.cid)?;
        let Some(write) = c.write.clone() else {
            return Err(seq(offset::CCCID, "R2T for a command with no data to send"));
        };
        let (at, len) = (r.offset as usize, r.length as usize);
        if len == 0 || at.checked_add(len).is_none_or(|e| e > write.len()) {
            return Err(range("R2T outside the command's data"));
        }
        let mut sent = 0;
        // Bounded: each round sends at least one byte (MAXH2CDATA >= 4096).
        while sent < len {
            let n = (len - sent).min(maxh2c);
            let h = PduHeader::H2CData(DataHeader {
                cid: r.cid,
                ttag: r.ttag,
                offset: (at + sent) as u32,
                last: sent + n == len,
                success: false,
            });
            let chunk = &write[at + sent..at + sent + n];
            encode(&h, &[chunk], &framing).write_to(&mut self.out);
            sent += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_tcp::sqe::nvm;
    use nvme_tcp::status::StatusCode;

    const IC_RESP: IcResp = IcResp {
        pfv: 0,
        cpda: 0,
        hdgst: false,
        ddgst: false,
        maxh2cdata: 8192,
    };

    fn pdu(h: PduHeader, data: &[u8], f: &Framing) -> Vec<u8> {
        encode(&h, &[data], f).to_vec()
    }

    fn ready(cfg: HostConfig, ic: IcResp) -> HostQueue {
        let mut q = HostQueue::new(cfg);
        let icreq = q.take_output();
        assert_eq!((icreq.len(), icreq[0]), (128, 0));
        q.receive(&pdu(PduHeader::IcResp(ic), &[], &Framing::default()))
            .unwrap();
        assert!(q.is_ready());
        q
    }

    fn plain() -> HostQueue {
        ready(HostConfig::default(), IC_RESP)
    }

    fn read_cmd(q: &mut HostQueue, len: u32) -> u16 {
        q.submit(Sqe::rw(nvm::READ, 0, 1, 0, len / 512), Bytes::new(), len)
            .unwrap()
    }

    fn c2h(cid: u16, offset: u32, data: &[u8], last: bool, success: bool) -> Vec<u8> {
        let d = DataHeader {
            cid,
            ttag: 0,
            offset,
            last,
            success,
        };
        pdu(PduHeader::C2HData(d), data, &Framing::default())
    }

    fn resp(cid: u16, status: Status) -> Vec<u8> {
        pdu(
            PduHeader::CapsuleResp(Cqe::new(cid, status)),
            &[],
            &Framing::default(),
        )
    }

    /// Decodes what the host sent as the controller would.
    fn sent(q: &mut HostQueue, framing: Framing) -> Vec<Pdu> {
        let mut cfg = DecoderConfig::new(Role::Controller, 1 << 20, 1 << 20);
        cfg.framing = framing;
        let mut d = Decoder::new(cfg);
        let out = q.take_output();
        let mut input = &out[..];
        let mut v = Vec::new();
        for _ in 0..1000 {
            match d.decode(&mut input).unwrap() {
                Some(p) => v.push(p),
                None => break,
            }
        }
        assert!(input.is_empty());
        v
    }

    fn term_req_fes(q: &mut HostQueue) -> u16 {
        let out = q.take_output();
        assert_eq!(out[0], 0x02, "an H2CTermReq was queued");
        u16::from_le_bytes([out[8], out[9]])
    }

    #[test]
    fn read_in_two_c2h_pdus_then_a_response() {
        let mut q = plain();
        let cid = read_cmd(&mut q, 1024);
        let p = sent(&mut q, Framing::default());
        assert!(
            matches!(p[0].header, PduHeader::CapsuleCmd(s) if s.cid() == cid && s.sgl().length == 1024)
        );
        q.receive(&c2h(cid, 0, &[1; 512], false, false)).unwrap();
        q.receive(&c2h(cid, 512, &[2; 512], true, false)).unwrap();
        assert!(q.take_completions().is_empty());
        q.receive(&resp(cid, Status::SUCCESS)).unwrap();
        let c = q.take_completions();
        assert_eq!(c.len(), 1);
        assert_eq!(&c[0].data[..512], &[1; 512][..]);
        assert_eq!(&c[0].data[512..], &[2; 512][..]);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn success_flag_completes_without_a_response() {
        let mut q = plain();
        let cid = read_cmd(&mut q, 512);
        q.receive(&c2h(cid, 0, &[7; 512], true, true)).unwrap();
        let c = q.take_completions();
        assert_eq!((c.len(), c[0].cqe.status), (1, Status::SUCCESS));
    }

    #[test]
    fn small_write_in_capsule_large_write_by_r2t_cut_at_maxh2cdata() {
        let mut q = ready(
            HostConfig::default(),
            IcResp {
                maxh2cdata: 4096,
                ..IC_RESP
            },
        );
        q.set_in_capsule_limit(4096);
        let small = q
            .submit(
                Sqe::rw(nvm::WRITE, 0, 1, 0, 8),
                Bytes::from(vec![5; 4096]),
                0,
            )
            .unwrap();
        let data: Vec<u8> = (0..10240).map(|i| i as u8).collect();
        let big = q
            .submit(
                Sqe::rw(nvm::WRITE, 0, 1, 8, 20),
                Bytes::from(data.clone()),
                0,
            )
            .unwrap();
        let p = sent(&mut q, Framing::default());
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0].data.len(),
            4096,
            "the small write's data is in its capsule"
        );
        assert!(p[1].data.is_empty(), "the large write waits for R2Ts");
        let r2t = R2t {
            cid: big,
            ttag: 9,
            offset: 1024,
            length: 9216,
        };
        q.receive(&pdu(PduHeader::R2T(r2t), &[], &Framing::default()))
            .unwrap();
        let h2c = sent(&mut q, Framing::default());
        let cuts: Vec<_> = h2c
            .iter()
            .map(|p| match p.header {
                PduHeader::H2CData(d) => (d.offset, p.data.len(), d.last, d.ttag),
                ref h => panic!("unexpected {h:?}"),
            })
            .collect();
        assert_eq!(
            cuts,
            [
                (1024, 4096, false, 9),
                (5120, 4096, false, 9),
                (9216, 1024, true, 9)
            ]
        );
        assert_eq!(&h2c[2].data[..], &data[9216..]);
        q.receive(&resp(small, Status::SUCCESS)).unwrap();
        q.receive(&resp(
            big,
            Status::error(StatusCode::LBA_OUT_OF_RANGE, true),
        ))
        .unwrap();
        let c = q.take_completions();
        assert_eq!(c[1].cqe.status.code, StatusCode::LBA_OUT_OF_RANGE);
    }

    #[test]
    fn digests_are_negotiated_and_used_both_ways() {
        let cfg = HostConfig {
            hdgst: true,
            ddgst: true,
            ..HostConfig::default()
        };
        let mut q = ready(
            cfg,
            IcResp {
                hdgst: true,
                ddgst: true,
                ..IC_RESP
            },
        );
        assert_eq!(q.digests(), (true, true));
        let cid = read_cmd(&mut q, 512);
        let f = Framing {
            hdgst: true,
            ddgst: true,
            pda: 0,
        };
        assert_eq!(sent(&mut q, f).len(), 1);
        let d = DataHeader {
            cid,
            ttag: 0,
            offset: 0,
            last: true,
            success: true,
        };
        let mut bad = pdu(PduHeader::C2HData(d), &[3; 512], &f);
        let n = bad.len();
        bad[n - 1] ^= 1;
        q.receive(&bad).unwrap();
        let c = q.take_completions();
        assert!(
            c[0].digest_error,
            "a data digest error fails only its command"
        );
        assert!(q.is_ready());
    }

    #[test]
    fn a_digest_not_asked_for_ends_the_connection() {
        let mut q = HostQueue::new(HostConfig::default());
        q.take_output();
        let e = q
            .receive(&pdu(
                PduHeader::IcResp(IcResp {
                    ddgst: true,
                    ..IC_RESP
                }),
                &[],
                &Framing::default(),
            ))
            .unwrap_err();
        assert!(matches!(e, HostError::Protocol(ref p) if p.fes == Fes::UnsupportedParameter));
        assert_eq!(term_req_fes(&mut q), Fes::UnsupportedParameter as u16);
        assert!(matches!(
            q.submit(Sqe::default(), Bytes::new(), 0),
            Err(SubmitError::Failed(_))
        ));
    }

    #[test]
    fn c2h_data_for_an_unknown_cid_ends_the_connection() {
        let mut q = plain();
        let cid = read_cmd(&mut q, 512);
        q.take_output();
        let e = q
            .receive(&c2h(cid + 1, 0, &[0; 512], true, true))
            .unwrap_err();
        let HostError::Protocol(p) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(p.fei, offset::CCCID);
        assert_eq!(term_req_fes(&mut q), Fes::InvalidHeaderField as u16);
        assert_eq!(q.receive(&[]), Err(e), "the error is kept");
    }

    #[test]
    fn a_response_for_an_unknown_cid_ends_the_connection() {
        let mut q = plain();
        let e = q.receive(&resp(3, Status::SUCCESS)).unwrap_err();
        assert!(matches!(e, HostError::Protocol(ref p) if p.fes == Fes::InvalidHeaderField));
        assert!(
            e.to_string().contains("no command outstanding")
                || e.to_string().contains("nothing outstanding")
        );
    }

    #[test]
    fn c2h_data_out_of_range_or_order_ends_the_connection() {
        for (offset, len) in [(0u32, 1024usize), (512, 512)] {
            let mut q = plain();
            let cid = read_cmd(&mut q, 512);
            let e = q
                .receive(&c2h(cid, offset, &vec![0; len], true, false))
                .unwrap_err();
            assert!(
                matches!(e, HostError::Protocol(ref p) if p.fes == Fes::DataOutOfRange),
                "{e}"
            );
        }
        let mut q = plain();
        let cid = read_cmd(&mut q, 1024);
        let e = q.receive(&c2h(cid, 0, &[0; 512], true, true)).unwrap_err();
        assert!(e.to_string().contains("SUCCESS before all the data"), "{e}");
    }

    #[test]
    fn an_r2t_for_a_read_or_outside_the_write_ends_the_connection() {
        let mut q = plain();
        let cid = read_cmd(&mut q, 512);
        let r2t = R2t {
            cid,
            ttag: 1,
            offset: 0,
            length: 512,
        };
        assert!(q
            .receive(&pdu(PduHeader::R2T(r2t), &[], &Framing::default()))
            .is_err());
        let mut q = plain();
        q.set_in_capsule_limit(0);
        let cid = q
            .submit(
                Sqe::rw(nvm::WRITE, 0, 1, 0, 1),
                Bytes::from(vec![0; 512]),
                0,
            )
            .unwrap();
        let r2t = R2t {
            cid,
            ttag: 1,
            offset: 256,
            length: 512,
        };
        let e = q
            .receive(&pdu(PduHeader::R2T(r2t), &[], &Framing::default()))
            .unwrap_err();
        assert!(matches!(e, HostError::Protocol(ref p) if p.fes == Fes::DataOutOfRange));
    }

    #[test]
    fn a_term_req_ends_the_connection_with_its_status() {
        let mut q = plain();
        read_cmd(&mut q, 512);
        let t = TermReq {
            fes: Fes::HeaderDigestError as u16,
            fei: 0,
        };
        let e = q
            .receive(&pdu(
                PduHeader::C2HTermReq(t),
                &[0; 24],
                &Framing::default(),
            ))
            .unwrap_err();
        assert_eq!(e, HostError::TermReq { fes: 3, fei: 0 });
        assert!(e.to_string().contains("Header Digest Error"));
        q.take_output();
        assert!(!q.has_output(), "no TermReq is sent back for a TermReq");
    }

    #[test]
    fn truncated_and_garbage_pdus_never_panic() {
        let mut q = plain();
        let cid = read_cmd(&mut q, 512);
        let whole = c2h(cid, 0, &[9; 512], true, true);
        // A truncated PDU is held, not misread; the rest completes it.
        for cut in [1, 7, 8, 23, 24, 100] {
            let mut q2 = plain();
            let cid2 = read_cmd(&mut q2, 512);
            assert_eq!(cid2, cid);
            q2.receive(&whole[..cut]).unwrap();
            assert!(q2.take_completions().is_empty());
            q2.receive(&whole[cut..]).unwrap();
            assert_eq!(q2.take_completions().len(), 1);
        }
        // Garbage of every first byte: an error or nothing yet, never a panic.
        for b in 0..=255u8 {
            let mut q2 = plain();
            read_cmd(&mut q2, 512);
            let mut junk = whole.clone();
            junk[0] = b;
            junk[2] = b.wrapping_mul(7);
            let _ = q2.receive(&junk);
        }
        // A PDU of a host-to-controller type is refused.
        let e = q.receive(&pdu(
            PduHeader::H2CData(DataHeader {
                cid,
                ttag: 0,
                offset: 0,
                last: true,
                success: false,
            }),
            &[0; 4],
            &Framing::default(),
        ));
        assert!(e.is_err());
    }

    #[test]
    fn cids_are_reused_and_bounded_by_the_depth() {
        let mut q = ready(
            HostConfig {
                depth: 2,
                ..HostConfig::default()
            },
            IC_RESP,
        );
        let a = read_cmd(&mut q, 512);
        let b = read_cmd(&mut q, 512);
        assert_ne!(a, b);
        assert_eq!(
            q.submit(Sqe::rw(nvm::READ, 0, 1, 0, 1), Bytes::new(), 512),
            Err(SubmitError::Full(2))
        );
        q.receive(&c2h(a, 0, &[0; 512], true, true)).unwrap();
        assert_eq!(read_cmd(&mut q, 512), a);
    }
}
