//! The datamover conformance kit (`datamover::conformance`) run against the iSER target
//! datamover on the software RNIC. The initiator end is a raw iSER initiator on the `rdma`
//! API: each command's buffer registered and named in its iSER header (Read STag for reads,
//! Write STag at the first solicited byte for writes, as Linux does); read data is what the
//! target RDMA-Wrote there when the status arrives; solicited data leaves by the RNIC's
//! answers to the target's RDMA Reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use datamover::conformance::{KitConnection, KitEvent, KitInitiator, KitTransport};
use datamover::{CmdSnState, FfpConfig, LoginChannel};
use datamover_iser::{accept, AcceptConfig};
use iscsi_wire::{Bhs, DataOut, Digests, Pdu, RESERVED_TAG};
use iser::IserHeader;
use rdma::{
    Access, CompletionQueue, ConnParams, Listener, MemoryRegion, Provider, QpCaps, QueuePair,
    RecvWr, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};
use rnic::Rnic;

mod common;

/// The software RNIC, with or without MPA CRC; with `one_per_poll` the target's end polls
/// through [`OnePerPoll`].
struct Iser {
    crc: bool,
    one_per_poll: bool,
}

const RECV_SLOTS: u64 = 32;
const RECV_LEN: usize = 8192 + 128;
/// 8 KiB slots in the initiator's send buffer.
const SEND_SLOTS: usize = 8;

#[async_trait]
impl KitTransport for Iser {
    fn config(&self) -> FfpConfig {
        datamover::conformance::config(Digests::default(), false, 1)
    }

    async fn connect(&self) -> KitConnection {
        let dev = Rnic::new().unwrap();
        if self.one_per_poll {
            self.connect_on(Arc::new(OnePerPoll(dev))).await
        } else {
            self.connect_on(Arc::new(dev)).await
        }
    }
}

impl Iser {
    /// A connection whose target end runs on `target_dev`.
    async fn connect_on<P>(&self, target_dev: Arc<P>) -> KitConnection
    where
        P: datamover_iser::endpoint::Device<Listener = rnic::RnicListener, Qp = rnic::Qp>,
    {
        let listener = target_dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let dev = Rnic::new().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(1024, None).unwrap();
        let qp = dev.create_qp(&pd, &cq, &cq, QpCaps::default()).unwrap();
        let recv = dev
            .reg_mr(&pd, RECV_SLOTS as usize * RECV_LEN, Access::LOCAL_WRITE)
            .unwrap();
        for slot in 0..RECV_SLOTS {
            qp.post_recv(RecvWr {
                wr_id: slot,
                sges: vec![recv.sge(slot as usize * RECV_LEN, RECV_LEN)],
            })
            .unwrap();
        }
        let qp = Arc::new(qp);
        let qp2 = qp.clone();
        let crc = self.crc;
        let connecting = tokio::task::spawn_blocking(move || {
            let params = ConnParams {
                private_data: vec![0x80, 0, 0, 0],
                ird: 16,
                ord: 1,
                crc,
                ..ConnParams::default()
            };
            qp2.connect(addr, &params).unwrap()
        });
        let req = common::next_request(listener).await;
        let cfg = AcceptConfig {
            crc: self.crc,
            ..AcceptConfig::default()
        };
        let target_dev = datamover_iser::TargetDevice::new(target_dev).unwrap();
        let login = accept(target_dev, req, cfg).await.unwrap();
        connecting.await.unwrap();
        let (dm, notices) =
            Box::new(login).into_full_feature(self.config(), CmdSnState::new(1, 64));
        let send = dev.reg_mr(&pd, 64 * 1024, Access::NONE).unwrap();
        let peer = RawIser {
            dev,
            pd,
            qp: Some(qp),
            cq,
            recv,
            send,
            sends: 0,
            sends_in_flight: 0,
            buffers: HashMap::new(),
            pending: Vec::new(),
        };
        (dm, notices, Box::new(peer))
    }
}

/// A command's registered buffer: for a read, where the target writes; for a write, what it
/// reads.
struct Buffer {
    mr: rnic::Mr,
    len: usize,
}

struct RawIser {
    dev: Rnic,
    pd: rnic::Pd,
    qp: Option<Arc<rnic::Qp>>,
    cq: rnic::Cq,
    recv: rnic::Mr,
    send: rnic::Mr,
    /// Sends posted (each takes the next 8 KiB of the send buffer, cyclically).
    sends: usize,
    /// Sends posted whose completion has not been polled yet: a slot is reused only after
    /// the Send that used it completed (on one CPU the RNIC may not have sent it yet).
    sends_in_flight: usize,
    buffers: HashMap<u32, Buffer>,
    pending: Vec<KitEvent>,
}

impl RawIser {
    async fn post(&mut self, header: IserHeader, pdu: &Pdu) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.sends_in_flight >= SEND_SLOTS && self.qp.is_some() {
            assert!(Instant::now() < deadline, "a Send never completed");
            if self.poll_completions() == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let Some(qp) = &self.qp else { return };
        let mut bytes = vec![0u8; iser::send_len(pdu)];
        iser::encode_send(&header, pdu, &mut bytes);
        let at = (self.sends % SEND_SLOTS) * 8192;
        self.sends += 1;
        self.sends_in_flight += 1;
        self.send.write_at(at, &bytes);
        let _ = qp.post_send(SendWr {
            wr_id: 1_000_000 + self.sends as u64,
            op: SendOp::Send,
            sges: vec![self.send.sge(at, bytes.len())],
            signaled: true,
        });
    }

    fn register(&mut self, itt: u32, data: &[u8], access: Access) -> (u32, u64) {
        let mr = self
            .dev
            .reg_mr(&self.pd, data.len().max(1), access)
            .unwrap();
        mr.write_at(0, data);
        let key = (mr.rkey(), mr.addr());
        self.buffers.insert(
            itt,
            Buffer {
                mr,
                len: data.len(),
            },
        );
        key
    }

    async fn data_out(&mut self, itt: u32, data: &Bytes, from: u32, to: u32) {
        let seq = iscsi_session::DataOutSequence {
            itt,
            lun: 0,
            ttt: RESERVED_TAG,
            exp_stat_sn: 0,
            max_segment: 4096,
        };
        let pdus: Vec<Pdu> = seq.pdus(data, from, to).collect();
        for p in pdus {
            self.post(IserHeader::CONTROL, &p).await;
        }
    }

    /// Turns a received Send into events: a status comes with the data placed before it.
    fn on_recv(&mut self, wc: &Wc) {
        let slot = wc.wr_id;
        let mut bytes = vec![0u8; wc.byte_len as usize];
        self.recv.read_at(slot as usize * RECV_LEN, &mut bytes);
        if let Some(qp) = &self.qp {
            let _ = qp.post_recv(RecvWr {
                wr_id: slot,
                sges: vec![self.recv.sge(slot as usize * RECV_LEN, RECV_LEN)],
            });
        }
        let send = iser::parse_send(&Bytes::from(bytes), 8192).expect("a valid iSER Send");
        match send.pdu.bhs {
            Bhs::ScsiResponse(r) => {
                if let Some(b) = self.buffers.remove(&r.itt) {
                    let mut data = vec![0u8; b.len];
                    b.mr.read_at(0, &mut data);
                    if self.buffers_were_read(&b) {
                        self.pending.push(KitEvent::Data {
                            itt: r.itt,
                            offset: 0,
                            data: Bytes::from(data),
                        });
                    }
                }
                self.pending.push(KitEvent::Status {
                    itt: r.itt,
                    stat_sn: r.stat_sn,
                    status: r.status,
                    underflow: r.underflow,
                    residual: r.residual,
                });
            }
            Bhs::DataIn(_) | Bhs::R2t(_) => panic!("iSER never sends Data-In or R2T"),
            _ => self.pending.push(KitEvent::Control(send.pdu)),
        }
    }

    /// Polls the completion queue once: receives become events, Send completions free their
    /// slots, an error closes the connection. Returns how many completions there were.
    fn poll_completions(&mut self) -> usize {
        let mut wcs = [Wc::EMPTY; 16];
        let n = self.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                self.qp = None;
                self.pending.push(KitEvent::Closed);
                break;
            }
            match wc.opcode {
                WcOpcode::Recv => self.on_recv(wc),
                WcOpcode::Send => self.sends_in_flight -= 1,
                _ => {}
            }
        }
        n
    }

    fn buffers_were_read(&self, b: &Buffer) -> bool {
        b.mr.access().contains(Access::REMOTE_WRITE)
    }
}

#[async_trait]
impl KitInitiator for RawIser {
    async fn send_read(&mut self, itt: u32, len: u32) {
        let key = self.register(itt, &vec![0u8; len as usize], Access::REMOTE_WRITE);
        let header = IserHeader {
            read: Some(key),
            ..IserHeader::CONTROL
        };
        self.post(
            header,
            &Pdu::new(
                datamover::conformance::scsi_command(itt, true, len, true),
                Bytes::new(),
            ),
        )
        .await;
    }

    async fn send_write(&mut self, itt: u32, data: Bytes, immediate: u32, unsolicited: u32) {
        let (stag, addr) = self.register(itt, &data, Access::REMOTE_READ);
        let header = IserHeader {
            // Linux: the Write address is where the solicited data begins.
            write: Some((stag, addr + u64::from(immediate + unsolicited))),
            ..IserHeader::CONTROL
        };
        let len = data.len() as u32;
        let cmd = datamover::conformance::scsi_command(itt, false, len, unsolicited == 0);
        self.post(header, &Pdu::new(cmd, data.slice(..immediate as usize)))
            .await;
        if unsolicited > 0 {
            self.data_out(itt, &data, immediate, immediate + unsolicited)
                .await;
        }
    }

    async fn send_write_withholding(&mut self, itt: u32, data: Bytes) {
        let (stag, addr) = self.register(itt, &data, Access::REMOTE_READ);
        let header = IserHeader {
            write: Some((stag, addr + data.len() as u64)),
            ..IserHeader::CONTROL
        };
        let cmd = datamover::conformance::scsi_command(itt, false, data.len() as u32, false);
        self.post(header, &Pdu::new(cmd, Bytes::new())).await;
    }

    async fn send_bad_data(&mut self, itt: u32) {
        let len = self.buffers.get(&itt).map_or(0, |b| b.len as u32);
        let bhs = Bhs::DataOut(DataOut {
            final_: true,
            itt,
            ttt: RESERVED_TAG,
            buffer_offset: len,
            ..Default::default()
        });
        self.post(
            IserHeader::CONTROL,
            &Pdu::new(bhs, Bytes::from(vec![0xee; 512])),
        )
        .await;
    }

    async fn next_event(&mut self, timeout: Duration) -> Option<KitEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.pending.is_empty() {
                return Some(self.pending.remove(0));
            }
            self.qp.as_ref()?;
            if self.poll_completions() == 0 {
                if Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    fn disconnect(&mut self) {
        if let Some(qp) = self.qp.take() {
            qp.disconnect();
        }
    }
}

mod plain {
    use super::*;
    datamover::conformance_tests!(Iser {
        crc: false,
        one_per_poll: false
    });
}

mod with_mpa_crc {
    use super::*;
    datamover::conformance_tests!(Iser {
        crc: true,
        one_per_poll: false
    });
}

/// The software RNIC handing over one completion per poll, however many wait (the verbs
/// provider handed over at most 16): the target must poll until the queue is empty before it sleeps, or
/// the rest waits for the next completion's event (writes stalled for seconds on rdma-core).
mod one_completion_per_poll {
    use super::*;
    datamover::conformance_tests!(Iser {
        crc: false,
        one_per_poll: true
    });
}

/// The software RNIC whose completion queues hand over at most one completion per poll.
struct OnePerPoll(Rnic);

struct OneCq(rnic::Cq);

impl CompletionQueue for OneCq {
    fn poll(&self, out: &mut [Wc]) -> usize {
        let n = out.len().min(1);
        self.0.poll(&mut out[..n])
    }
    fn req_notify(&self, solicited_only: bool) {
        self.0.req_notify(solicited_only)
    }
}

impl Provider for OnePerPoll {
    type Pd = rnic::Pd;
    type Mr = rnic::Mr;
    type Channel = rnic::Channel;
    type Cq = OneCq;
    type Qp = rnic::Qp;
    type Listener = rnic::RnicListener;

    fn name(&self) -> String {
        self.0.name()
    }
    fn alloc_pd(&self) -> rdma::Result<rnic::Pd> {
        self.0.alloc_pd()
    }
    fn reg_mr(&self, pd: &rnic::Pd, len: usize, access: Access) -> rdma::Result<rnic::Mr> {
        self.0.reg_mr(pd, len, access)
    }
    fn create_channel(&self) -> rdma::Result<rnic::Channel> {
        self.0.create_channel()
    }
    fn create_cq(&self, depth: u32, ch: Option<&rnic::Channel>) -> rdma::Result<OneCq> {
        self.0.create_cq(depth, ch).map(OneCq)
    }
    fn create_qp(
        &self,
        pd: &rnic::Pd,
        send_cq: &OneCq,
        recv_cq: &OneCq,
        caps: QpCaps,
    ) -> rdma::Result<rnic::Qp> {
        self.0.create_qp(pd, &send_cq.0, &recv_cq.0, caps)
    }
    fn listen(&self, addr: std::net::SocketAddr) -> rdma::Result<rnic::RnicListener> {
        self.0.listen(addr)
    }
}

/// Large reads (1 MiB, many FPDUs each) and writes, several in flight, with MPA CRC: every
/// FPDU's CRC is checked by the receiving RNIC, which terminates the connection on a mismatch.
#[tokio::test]
async fn large_transfers_with_mpa_crc_arrive_intact() {
    let t = Iser {
        crc: true,
        one_per_poll: false,
    };
    let (dm, mut notices, mut peer) = t.connect().await;
    let data: Bytes = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into();
    for round in 0..4u32 {
        for k in 0..4u32 {
            peer.send_read(round * 16 + k, data.len() as u32).await;
        }
        for _ in 0..4 {
            let Some(datamover::Notice::Command { pdu, .. }) = notices.recv().await else {
                panic!("a command notice")
            };
            let Bhs::ScsiCommand(c) = pdu.pdu.bhs else {
                panic!()
            };
            let task = datamover::TaskRef {
                itt: c.itt,
                lun: c.lun,
            };
            let status = datamover::CollapsedStatus {
                status: 0,
                overflow: false,
                underflow: false,
                residual: 0,
            };
            dm.put_data(task, data.clone(), None, Some(status))
                .await
                .unwrap();
        }
        let mut statuses = 0;
        while statuses < 4 {
            match peer.next_event(Duration::from_secs(20)).await {
                Some(KitEvent::Data { data: got, .. }) => assert!(got == data, "read data intact"),
                Some(KitEvent::Status { .. }) => statuses += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// When the initiator goes away, everything the target registered for the connection (receive
/// ring, send buffers, pooled regions of its RDMA Writes) is released once the session lets
/// go of the datamover: no registration outlives its connection.
#[tokio::test]
async fn a_closed_connection_releases_every_registered_region() {
    use datamover::{CollapsedStatus, Notice, TaskRef};
    let target_dev = Arc::new(Rnic::new().unwrap());
    let t = Iser {
        crc: false,
        one_per_poll: false,
    };
    let (dm, mut notices, mut peer) = t.connect_on(target_dev.clone()).await;
    assert!(target_dev.stags().registered() > 0);
    peer.send_read(7, 100_000).await;
    match tokio::time::timeout(Duration::from_secs(10), notices.recv()).await {
        Ok(Some(Notice::Command { .. })) => {}
        other => panic!("expected the READ, got {other:?}"),
    }
    let good = CollapsedStatus {
        status: 0,
        overflow: false,
        underflow: false,
        residual: 0,
    };
    let data = Bytes::from(vec![0x5a; 100_000]);
    dm.put_data(TaskRef { itt: 7, lun: 0 }, data, None, Some(good))
        .await
        .expect("put_data");
    loop {
        match peer.next_event(Duration::from_secs(10)).await {
            Some(KitEvent::Status { itt: 7, .. }) => break,
            Some(_) => continue,
            None => panic!("no status"),
        }
    }
    peer.disconnect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), notices.recv()).await {
            Ok(Some(Notice::Closed(_))) | Ok(None) => break,
            Ok(Some(_)) => assert!(Instant::now() < deadline, "no end of the notices"),
            Err(_) => panic!("the datamover did not hear of the disconnect"),
        }
    }
    drop(dm);
    drop(notices);
    let deadline = Instant::now() + Duration::from_secs(10);
    while target_dev.stags().registered() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} regions still registered after the connection ended",
            target_dev.stags().registered()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// After a Logout Response the initiator is given a moment to close first (it disconnects
/// when it has the response; Linux siw reports a fatal QP error when the target beats it to
/// it); an initiator that does not close is disconnected when the grace is over.
#[tokio::test]
async fn after_logout_the_initiator_may_close_first() {
    use datamover::Notice;
    async fn closed_within(notices: &mut tokio::sync::mpsc::Receiver<Notice>, d: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            match tokio::time::timeout_at(deadline, notices.recv()).await {
                Ok(Some(Notice::Closed(_))) | Ok(None) => return true,
                Ok(Some(_)) => continue,
                Err(_) => return false,
            }
        }
    }
    let t = Iser {
        crc: false,
        one_per_poll: false,
    };
    // The initiator closes: the connection ends at once.
    let (dm, mut notices, mut peer) = t.connect().await;
    dm.close_after_logout();
    tokio::time::sleep(Duration::from_millis(200)).await;
    peer.disconnect();
    assert!(closed_within(&mut notices, Duration::from_millis(1500)).await);
    // The initiator stays: the target waits, then closes.
    let (dm, mut notices, _peer) = t.connect().await;
    dm.close_after_logout();
    assert!(
        !closed_within(&mut notices, Duration::from_millis(1000)).await,
        "closed before the initiator had its moment"
    );
    assert!(
        closed_within(&mut notices, Duration::from_secs(5)).await,
        "never closed"
    );
}
