//! End to end on loopback: the target serving a RAM LUN as namespace 1, and a small host
//! built on nvme_tcp's codec: discovery, admin and I/O queues (with and without digests),
//! Identify, a pattern written (in-capsule and through R2Ts) and read back, a bad PDU
//! answered with a C2HTermReq that ends only its own connection.

use bytes::Bytes;
use nvme_target::{DriverConfig, NvmeTarget, Subsystem, DISCOVERY_NQN};
use nvme_tcp::decoder::{Decoder, DecoderConfig, Role};
use nvme_tcp::identify::{IdentifyController, IdentifyNamespace};
use nvme_tcp::log::{self, GetLogPage};
use nvme_tcp::pdu::{encode, DataHeader, Framing, IcReq, PduHeader};
use nvme_tcp::sqe::fabrics::{self, reg, Connect, ConnectData, Property};
use nvme_tcp::sqe::{admin, nvm, SglDescriptor};
use nvme_tcp::{Cqe, Sqe, Status};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SUB: &str = "nqn.2026-01.org.example:loop";
const HOST: &str = "nqn.2026-01.org.example:host";
const STEP: Duration = Duration::from_secs(10);

struct Host {
    s: TcpStream,
    dec: Decoder,
    tx: Framing,
    maxh2cdata: u32,
    cid: u16,
    pending: std::collections::VecDeque<nvme_tcp::Pdu>,
}

impl Host {
    async fn connect(addr: SocketAddr, digests: bool) -> Host {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: digests,
            ddgst: digests,
            maxr2t: 0,
        };
        s.write_all(&encode(&PduHeader::IcReq(ic), &[], &Framing::default()).to_vec())
            .await
            .unwrap();
        let mut h = Host {
            s,
            dec: Decoder::new(DecoderConfig::new(Role::Host, 1 << 20, 0)),
            tx: Framing::default(),
            maxh2cdata: 0,
            cid: 0,
            pending: Default::default(),
        };
        let PduHeader::IcResp(r) = h.pdu().await.0 else {
            panic!("no ICResp")
        };
        assert_eq!((r.hdgst, r.ddgst), (digests, digests));
        h.maxh2cdata = r.maxh2cdata;
        h.tx = Framing {
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            pda: r.cpda,
        };
        let mut dc = *h.dec.config();
        dc.framing = Framing {
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            pda: 0,
        };
        h.dec.set_config(dc);
        h
    }

    async fn pdu(&mut self) -> (PduHeader, Bytes) {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(p) = self.pending.pop_front() {
                return (p.header, p.data);
            }
            let n = tokio::time::timeout(STEP, self.s.read(&mut buf))
                .await
                .expect("the target answers")
                .unwrap();
            assert!(n > 0, "connection closed");
            let mut input = &buf[..n];
            while let Some(p) = self.dec.decode(&mut input).unwrap() {
                self.pending.push_back(p);
            }
        }
    }

    async fn send(&mut self, h: PduHeader, data: &[u8]) {
        self.s
            .write_all(&encode(&h, &[data], &self.tx).to_vec())
            .await
            .unwrap();
    }

    /// Runs one command: in-capsule data, or data sent on R2Ts; returns the completion and
    /// the data read.
    async fn command(&mut self, mut sqe: Sqe, in_capsule: &[u8], out: &[u8]) -> (Cqe, Vec<u8>) {
        self.cid = self.cid.wrapping_add(1);
        sqe.set_cid(self.cid);
        self.send(PduHeader::CapsuleCmd(sqe), in_capsule).await;
        let mut read = Vec::new();
        loop {
            match self.pdu().await {
                (PduHeader::CapsuleResp(c), _) => return (c, read),
                (PduHeader::C2HData(d), data) => {
                    assert_eq!(d.offset as usize, read.len());
                    read.extend_from_slice(&data);
                    if d.success {
                        return (Cqe::new(d.cid, Status::SUCCESS), read);
                    }
                }
                (PduHeader::R2T(r), _) => {
                    let (mut at, end) = (r.offset, r.offset + r.length);
                    while at < end {
                        let n = (end - at).min(self.maxh2cdata);
                        let d = DataHeader {
                            cid: r.cid,
                            ttag: r.ttag,
                            offset: at,
                            last: at + n == end,
                            success: false,
                        };
                        let chunk = &out[at as usize..(at + n) as usize];
                        self.send(PduHeader::H2CData(d), chunk).await;
                        at += n;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    async fn fabrics_connect(&mut self, qid: u16, cntlid: u16, subnqn: &str) -> Cqe {
        let kato = if qid == 0 { 10_000 } else { 0 };
        self.fabrics_connect_kato(qid, cntlid, subnqn, kato).await
    }

    async fn fabrics_connect_kato(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        kato: u32,
    ) -> Cqe {
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato,
        };
        let d = ConnectData {
            hostid: [3; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: HOST.into(),
        };
        self.command(c.to_sqe(0), &d.to_bytes(), &[]).await.0
    }

    /// Connect an admin queue and enable the controller; returns the CNTLID.
    async fn admin(&mut self, subnqn: &str) -> u16 {
        let c = self.fabrics_connect(0, 0xFFFF, subnqn).await;
        assert!(c.status.is_success(), "{c:?}");
        let cntlid = c.dw0 as u16;
        let p = Property {
            offset: reg::CC,
            eight_bytes: false,
            value: 1 | (6 << 16) | (4 << 20),
        };
        let (c, _) = self
            .command(p.to_sqe(fabrics::PROPERTY_SET, 0), &[], &[])
            .await;
        assert!(c.status.is_success());
        let p = Property {
            offset: reg::CSTS,
            eight_bytes: false,
            value: 0,
        };
        let (c, _) = self
            .command(p.to_sqe(fabrics::PROPERTY_GET, 0), &[], &[])
            .await;
        assert_eq!(c.dw0 & 1, 1);
        cntlid
    }
}

fn identify(cns: u8, nsid: u32) -> Sqe {
    let mut s = Sqe::new(admin::IDENTIFY, 0);
    s.set_nsid(nsid);
    s.set_cdw(10, u32::from(cns));
    s.set_sgl(SglDescriptor::transport(4096));
    s
}

fn rw(op: u8, slba: u64, blocks: u32, bytes: u32, in_capsule: bool) -> Sqe {
    let mut s = Sqe::rw(op, 0, 1, slba, blocks);
    s.set_sgl(if in_capsule {
        SglDescriptor::in_capsule(bytes)
    } else {
        SglDescriptor::transport(bytes)
    });
    s
}

async fn start() -> (SocketAddr, SocketAddr, scsi::LunExport) {
    let cfg = scsi::LunConfig::memory(16 << 20);
    let device = scsi::Device::new("iqn.2026-01.org.example:loop", vec![(0, cfg)]).unwrap();
    let lun = device.lun_export(0).unwrap();
    let mut ns = BTreeMap::new();
    ns.insert(1, lun.clone());
    let s = Subsystem::new(SUB, vec![HOST.into()], false, None, ns);
    let t = NvmeTarget::bind(
        vec![(s, vec!["127.0.0.1:0".parse().unwrap()])],
        vec!["127.0.0.1:0".parse().unwrap()],
        DriverConfig::default(),
    )
    .await
    .unwrap();
    let addrs = t.local_addrs();
    tokio::spawn(t.serve());
    (addrs[0], addrs[1], lun)
}

#[tokio::test]
async fn discover_connect_identify_write_read_and_a_bad_pdu() {
    let (addr, disc_addr, lun) = start().await;

    // Discovery: the subsystem at the address it is served on.
    let mut d = Host::connect(disc_addr, false).await;
    d.admin(DISCOVERY_NQN).await;
    let g = GetLogPage {
        lid: log::LID_DISCOVERY,
        lsp: 0,
        rae: false,
        len: 2048,
        offset: 0,
    };
    let (c, page) = d.command(g.to_sqe(0), &[], &[]).await;
    assert!(c.status.is_success());
    let (_, entries) = log::parse_discovery_page(&page).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].subnqn, SUB);
    assert_eq!(entries[0].trsvcid, addr.port().to_string());
    assert_eq!(entries[0].traddr, "127.0.0.1");

    // Admin queue: Connect, enable, Identify.
    let mut a = Host::connect(addr, false).await;
    let cntlid = a.admin(SUB).await;
    let (_, id) = a
        .command(identify(admin::CNS_CONTROLLER, 0), &[], &[])
        .await;
    let id = IdentifyController::parse(&id).unwrap();
    assert_eq!((id.cntlid, id.subnqn.as_str()), (cntlid, SUB));
    let (_, ns) = a.command(identify(admin::CNS_NAMESPACE, 1), &[], &[]).await;
    let ns = IdentifyNamespace::parse(&ns).unwrap();
    assert_eq!(ns.nsze, (16 << 20) / 512);
    assert_eq!(ns.lbads, 9);

    // A host not allowed, a subsystem not there.
    let mut x = Host::connect(addr, false).await;
    let c = x
        .fabrics_connect(0, 0xFFFF, "nqn.2026-01.org.example:nothing")
        .await;
    assert_eq!(
        c.status.code,
        nvme_tcp::StatusCode::CONNECT_INVALID_PARAMETERS
    );
    assert_eq!(c.dw0, (1 << 16) | 256);

    // I/O queues, without and with digests: write through R2Ts and in the capsule, read back.
    let pattern: Vec<u8> = (0..256 * 1024u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    for (qid, digests) in [(1u16, false), (2, true)] {
        let mut q = Host::connect(addr, digests).await;
        let c = q.fabrics_connect(qid, cntlid, SUB).await;
        assert!(c.status.is_success(), "{c:?}");
        let slba = u64::from(qid) * 1024;
        let (c, _) = q
            .command(rw(nvm::WRITE, slba, 512, 256 * 1024, false), &[], &pattern)
            .await;
        assert!(c.status.is_success(), "{c:?}");
        let small = &pattern[..4096];
        let (c, _) = q
            .command(rw(nvm::WRITE, slba + 512, 8, 4096, true), small, &[])
            .await;
        assert!(c.status.is_success(), "{c:?}");
        let (c, back) = q
            .command(rw(nvm::READ, slba, 512, 256 * 1024, false), &[], &[])
            .await;
        assert!(c.status.is_success());
        assert_eq!(back, pattern);
        let (_, back) = q
            .command(rw(nvm::READ, slba + 512, 8, 4096, false), &[], &[])
            .await;
        assert_eq!(back, small);
        // The LUN's backend holds the same bytes: iSCSI reads what NVMe wrote.
        let b = lun.backend().read_at(slba * 512, 4096).await.unwrap();
        assert_eq!(&b[..], &pattern[..4096]);
        // Past the end of the namespace.
        let (c, _) = q
            .command(rw(nvm::READ, (16 << 20) / 512, 1, 512, false), &[], &[])
            .await;
        assert_eq!(c.status.code, nvme_tcp::StatusCode::LBA_OUT_OF_RANGE);
    }

    // A bad PDU: a C2HTermReq, then the connection closes; the admin queue carries on.
    let mut q = Host::connect(addr, false).await;
    q.s.write_all(&[0x77, 0, 8, 0, 8, 0, 0, 0]).await.unwrap();
    let (h, _) = q.pdu().await;
    assert!(matches!(h, PduHeader::C2HTermReq(_)), "{h:?}");
    let mut rest = [0u8; 64];
    let n = tokio::time::timeout(STEP, q.s.read(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "closed after the TermReq");
    let (c, _) = a
        .command(identify(admin::CNS_CONTROLLER, 0), &[], &[])
        .await;
    assert!(c.status.is_success());
}

/// Reads until the target closes the connection (bounded by STEP).
async fn closed_by_target(h: &mut Host) -> bool {
    let mut buf = [0u8; 256];
    for _ in 0..100 {
        match tokio::time::timeout(STEP, h.s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
    false
}

#[tokio::test]
async fn keep_alive_timeout_tears_the_controller_down() {
    let (addr, _, _) = start().await;
    let mut a = Host::connect(addr, false).await;
    let c = a.fabrics_connect_kato(0, 0xFFFF, SUB, 600).await;
    assert!(c.status.is_success());
    let cntlid = c.dw0 as u16;
    let p = Property {
        offset: reg::CC,
        eight_bytes: false,
        value: 1,
    };
    assert!(a
        .command(p.to_sqe(fabrics::PROPERTY_SET, 0), &[], &[])
        .await
        .0
        .status
        .is_success());
    let mut q = Host::connect(addr, false).await;
    assert!(q.fabrics_connect(1, cntlid, SUB).await.status.is_success());
    // Keep alives hold it up past KATO.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (c, _) = a.command(Sqe::new(admin::KEEP_ALIVE, 0), &[], &[]).await;
        assert!(c.status.is_success());
    }
    // Then silence: both queues are closed, and the CNTLID is gone for new I/O queues.
    assert!(closed_by_target(&mut a).await, "admin queue closed");
    assert!(closed_by_target(&mut q).await, "I/O queue closed");
    let mut late = Host::connect(addr, false).await;
    let c = late.fabrics_connect(2, cntlid, SUB).await;
    assert_eq!(
        c.status.code,
        nvme_tcp::StatusCode::CONNECT_INVALID_PARAMETERS
    );
}
