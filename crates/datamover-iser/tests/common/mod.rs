//! What the iSER tests share: a raw initiator written directly on the `rdma` API, behaving as
//! Linux ib_iser does (the iSER word 0x80 in its private data, the Login Request as the first
//! Send behind a 28-byte iSER header).

// Each test file uses a part of this module.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi_wire::{Bhs, LoginRequest, Pdu, Stage};
use iser::IserHeader;
use rdma::{
    Access, CompletionQueue, MemoryRegion, Provider, QpCaps, QueuePair, RecvWr, SendOp, SendWr, Wc,
    WcOpcode, WcStatus,
};
use rnic::Rnic;

pub const LOGIN_TEXT: &[u8] =
    b"InitiatorName=iqn.2026-11.org.ironsan:raw\0SessionType=Normal\0RDMAExtensions=Yes\0";

/// The raw initiator's end: a queue pair with one receive buffer and one send buffer.
pub struct RawInitiator {
    /// Its own RNIC (its progress thread runs while the initiator lives).
    _dev: Rnic,
    pub qp: rnic::Qp,
    cq: rnic::Cq,
    recv: rnic::Mr,
    send: rnic::Mr,
}

impl RawInitiator {
    pub fn new(dev: Rnic) -> RawInitiator {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64, None).unwrap();
        let qp = dev.create_qp(&pd, &cq, &cq, QpCaps::default()).unwrap();
        let recv = dev.reg_mr(&pd, 16384, Access::LOCAL_WRITE).unwrap();
        let send = dev.reg_mr(&pd, 16384, Access::NONE).unwrap();
        qp.post_recv(RecvWr {
            wr_id: 1,
            sges: vec![recv.sge(0, 16384)],
        })
        .unwrap();
        RawInitiator {
            _dev: dev,
            qp,
            cq,
            recv,
            send,
        }
    }

    pub fn send_bytes(&self, bytes: &[u8]) {
        self.send.write_at(0, bytes);
        self.qp
            .post_send(SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sges: vec![self.send.sge(0, bytes.len())],
                signaled: true,
            })
            .unwrap();
    }

    pub fn send_pdu(&self, pdu: &Pdu) {
        let mut bytes = vec![0u8; iser::send_len(pdu)];
        iser::encode_send(&IserHeader::CONTROL, pdu, &mut bytes);
        self.send_bytes(&bytes);
    }

    /// The next received Send, parsed.
    pub fn recv_pdu(&self) -> (IserHeader, Pdu) {
        let wc = self.wait(WcOpcode::Recv);
        let mut bytes = vec![0u8; wc.byte_len as usize];
        self.recv.read_at(0, &mut bytes);
        let s = iser::parse_send(&Bytes::from(bytes), 8192).expect("a valid iSER Send");
        (s.header, s.pdu)
    }

    pub fn wait(&self, want: WcOpcode) -> Wc {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = [Wc::EMPTY];
        loop {
            if self.cq.poll(&mut out) == 1 {
                assert_eq!(out[0].status, WcStatus::Success, "{out:?}");
                if out[0].opcode == want {
                    return out[0];
                }
                continue;
            }
            assert!(Instant::now() < deadline, "no {want:?} completion");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

pub fn login_request() -> Pdu {
    let bhs = Bhs::LoginRequest(LoginRequest {
        transit: true,
        cont: false,
        csg: Stage::Operational,
        nsg: Stage::FullFeature,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: 0x1000,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    });
    Pdu::new(bhs, Bytes::from_static(LOGIN_TEXT))
}

/// The next connection request on `listener` (waited for on a thread of its own).
pub async fn next_request(listener: rnic::RnicListener) -> rnic::Request {
    tokio::task::spawn_blocking(move || {
        rdma::Listener::get_request(&listener, Duration::from_secs(5))
            .unwrap()
            .expect("a connection request")
    })
    .await
    .unwrap()
}
