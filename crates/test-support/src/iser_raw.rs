//! Raw iSER: the 28-byte iSER header laid out byte by byte (RFC 7145 §9.2 as Linux lays it
//! out) and the queue pair with its rings of receives and send buffers on the software RNIC
//! ([`Rings`]) for raw initiators, and what a raw target says to the project's initiator.

use bytes::Bytes;
use iscsi_wire::{Bhs, LoginRequest, LoginResponse, Pdu, Stage};
use rdma::{
    Access, CompletionQueue, MemoryRegion, Provider, QpCaps, QueuePair, RecvWr, SendOp, SendWr, Wc,
    WcOpcode, WcStatus,
};
use rnic::Rnic;

/// Bytes of the iSER header and the BHS in front of every control PDU's data segment.
pub const HEADERS_LEN: usize = 28 + 48;

/// The iSER header of a control PDU, with the Write STag and address when `write` is given
/// (WSV) and the Read STag and address when `read` is (RSV).
pub fn iser_header(write: Option<(u32, u64)>, read: Option<(u32, u64)>) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0] = 0x10;
    if let Some((stag, va)) = write {
        h[0] |= 0x08;
        h[4..8].copy_from_slice(&stag.to_be_bytes());
        h[8..16].copy_from_slice(&va.to_be_bytes());
    }
    if let Some((stag, va)) = read {
        h[0] |= 0x04;
        h[16..20].copy_from_slice(&stag.to_be_bytes());
        h[20..28].copy_from_slice(&va.to_be_bytes());
    }
    h
}

/// One Send: iSER header, BHS, data padded to 4.
pub fn send_bytes(header: &[u8; 28], bhs: &[u8; 48], data: &[u8]) -> Vec<u8> {
    let mut v = header.to_vec();
    v.extend_from_slice(bhs);
    v.extend_from_slice(data);
    v.resize(HEADERS_LEN + data.len().next_multiple_of(4), 0);
    v
}

/// What a raw iSER target answers a Login Request with: straight from the operational stage
/// to full feature phase, in iSER mode, with the keys LIO answers (its sequence numbers are
/// stamped by the caller).
pub fn iser_login_response(r: &LoginRequest) -> Pdu {
    let rsp = Bhs::LoginResponse(LoginResponse {
        transit: true,
        cont: false,
        csg: Stage::Operational,
        nsg: Stage::FullFeature,
        version_max: 0,
        version_active: 0,
        isid: r.isid,
        tsih: 1,
        itt: r.itt,
        stat_sn: 0,
        exp_cmd_sn: 0,
        max_cmd_sn: 0,
        status_class: 0,
        status_detail: 0,
    });
    let keys: &[u8] = b"RDMAExtensions=Yes\0TargetRecvDataSegmentLength=8192\0\
        InitialR2T=Yes\0ImmediateData=Yes\0MaxBurstLength=262144\0FirstBurstLength=8192\0\
        MaxConnections=1\0ErrorRecoveryLevel=0\0DataPDUInOrder=Yes\0DataSequenceInOrder=Yes\0";
    Pdu::new(rsp, Bytes::from_static(keys))
}

/// A raw target's Send of `pdu`, stamped with its numbers (a window of 64 commands from
/// `exp_cmd_sn`; `stat_sn` advances past a PDU that takes one): the iSER header and the PDU.
pub fn raw_target_send(mut pdu: Pdu, stat_sn: &mut u32, exp_cmd_sn: u32) -> Vec<u8> {
    pdu.bhs
        .set_target_sns(*stat_sn, exp_cmd_sn, exp_cmd_sn.wrapping_add(63));
    if pdu.bhs.advances_stat_sn() {
        *stat_sn = stat_sn.wrapping_add(1);
    }
    let mut send = vec![0u8; iser::send_len(&pdu)];
    iser::encode_send(&iser::IserHeader::CONTROL, &pdu, &mut send);
    send
}

/// How many receives and send buffers a raw iSER queue pair keeps, and their sizes.
#[derive(Debug, Clone, Copy)]
pub struct RingSizes {
    pub recv_slots: usize,
    pub recv_len: usize,
    pub send_slots: usize,
    pub send_len: usize,
}

/// A raw iSER peer's queue pair on the software RNIC: a ring of posted receives (each posted
/// again once read, while `repost` holds) and a ring of registered send buffers, a Send
/// from each in turn. What the peer says and how it waits are its own.
/// (Fields drop in order: the queue pair goes before the memory it used.)
pub struct Rings {
    pub qp: rnic::Qp,
    recv: rnic::Mr,
    send: rnic::Mr,
    pub cq: rnic::Cq,
    sizes: RingSizes,
    /// Sends posted, and Sends completed (with success or not).
    pub sends_posted: u64,
    pub sends_done: u64,
    /// Whether a receive is posted again once its Send is read (a peer that never reads has
    /// only the receives it posted first).
    pub repost: bool,
}

impl Rings {
    /// A queue pair on `dev` (its completion queue `cq_depth` deep, room for `max_send_wr`
    /// work requests of `max_sge` entries) with every receive posted, not connected yet.
    pub fn new(
        dev: &Rnic,
        pd: &rnic::Pd,
        cq_depth: u32,
        max_send_wr: u32,
        max_sge: u32,
        sizes: RingSizes,
    ) -> rdma::Result<Rings> {
        let cq = dev.create_cq(cq_depth, None)?;
        let caps = QpCaps {
            max_send_wr,
            max_recv_wr: sizes.recv_slots as u32,
            max_sge,
        };
        let qp = dev.create_qp(pd, &cq, &cq, caps)?;
        let recv = dev.reg_mr(pd, sizes.recv_slots * sizes.recv_len, Access::LOCAL_WRITE)?;
        let send = dev.reg_mr(pd, sizes.send_slots * sizes.send_len, Access::NONE)?;
        let rings = Rings {
            qp,
            recv,
            send,
            cq,
            sizes,
            sends_posted: 0,
            sends_done: 0,
            repost: true,
        };
        for slot in 0..sizes.recv_slots {
            rings.post_recv(slot)?;
        }
        Ok(rings)
    }

    fn post_recv(&self, slot: usize) -> rdma::Result<()> {
        let len = self.sizes.recv_len;
        self.qp.post_recv(RecvWr {
            wr_id: slot as u64,
            sges: vec![self.recv.sge(slot * len, len)],
        })
    }

    /// Takes up to 64 waiting completions and hands each to `each`, with the bytes of a
    /// received Send (its receive posted again while `repost` holds). Send completions are
    /// counted, failed or not. Returns how many completions there were.
    pub fn poll(&mut self, mut each: impl FnMut(&Wc, Option<Vec<u8>>)) -> usize {
        let mut wcs = [Wc::EMPTY; 64];
        let n = self.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.opcode == WcOpcode::Send {
                self.sends_done += 1;
            }
            let received = wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv;
            let bytes = received.then(|| {
                let slot = wc.wr_id as usize;
                let mut bytes = vec![0u8; wc.byte_len as usize];
                self.recv.read_at(slot * self.sizes.recv_len, &mut bytes);
                if self.repost {
                    let _ = self.post_recv(slot);
                }
                bytes
            });
            each(wc, bytes);
        }
        n
    }

    /// Whether every send buffer is in use (a Send from it not completed yet).
    pub fn full(&self) -> bool {
        self.sends_posted - self.sends_done >= self.sizes.send_slots as u64
    }

    /// Posts `bytes` (at most a send buffer) as one signaled Send from the next send buffer,
    /// which the caller has waited to be free ([`Rings::full`]). False if the queue pair
    /// refused it.
    pub fn post_send(&mut self, bytes: &[u8]) -> bool {
        let at = (self.sends_posted as usize % self.sizes.send_slots) * self.sizes.send_len;
        self.send.write_at(at, bytes);
        let posted = self.qp.post_send(SendWr {
            wr_id: (1 << 32) | self.sends_posted,
            op: SendOp::Send,
            sges: vec![self.send.sge(at, bytes.len())],
            signaled: true,
        });
        self.sends_posted += 1;
        if posted.is_err() {
            self.sends_done += 1;
            return false;
        }
        true
    }
}
