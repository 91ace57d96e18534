//! The host against a small controller on loopback, built on `nvme_tcp::queue`'s controller
//! side and a RAM namespace: bring-up, reads and writes (in-capsule, by R2T cut at
//! MAXH2CDATA, C2HData with SUCCESS), many commands outstanding over two queues, digests,
//! write zeroes, deallocate, flush, and an error status reaching the caller typed.

use bytes::Bytes;
use nvme_initiator::{ConnectOptions, Controller, Error};
use nvme_tcp::cqe::{Cqe, Status};
use nvme_tcp::queue::{Action, Command, ControllerQueue, QueueConfig};
use nvme_tcp::sqe::fabrics::{self, reg, Connect, Property};
use nvme_tcp::sqe::{admin, nvm};
use nvme_tcp::status::StatusCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const NQN: &str = "nqn.2026-01.org.ironsan.test:loop";
const BLOCKS: u64 = 4096;
const BS: usize = 512;

struct Device {
    data: Mutex<Vec<u8>>,
    /// The CC register last set.
    cc: Mutex<u32>,
}

fn identify_controller() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[4..8].copy_from_slice(b"LOOP");
    b[78..80].copy_from_slice(&1u16.to_le_bytes());
    b[520..522].copy_from_slice(&0x0cu16.to_le_bytes());
    // 4 KiB of in-capsule data: larger writes go by R2T.
    b[1792..1796].copy_from_slice(&((4096u32 + 64) / 16).to_le_bytes());
    b
}

fn identify_namespace() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[0..8].copy_from_slice(&BLOCKS.to_le_bytes());
    b[8..16].copy_from_slice(&BLOCKS.to_le_bytes());
    b[128 + 2] = 9;
    b
}

/// Executes one command: the completion and any read data.
/// `qid` is the queue's, set by its Connect (admin and NVM opcodes overlap).
fn execute(dev: &Device, q: &mut ControllerQueue, qid: &mut u16, c: &Command) -> (Cqe, Vec<u8>) {
    let s = c.sqe;
    let ok = |dw0: u32, dw1: u32| Cqe {
        dw0,
        dw1,
        ..Cqe::new(s.cid(), Status::SUCCESS)
    };
    let fail = |code| Cqe::new(s.cid(), Status::error(code, true));
    let range = |slba: u64, nlb: u32| {
        let (at, n) = (slba as usize * BS, nlb as usize * BS);
        (slba + u64::from(nlb) <= BLOCKS).then_some(at..at + n)
    };
    match (s.opcode(), s.fctype()) {
        (fabrics::OPCODE, fabrics::CONNECT) => {
            let con = Connect::parse(&s);
            *qid = con.qid;
            q.set_sq(con.sqsize + 1, con.sq_flow_control_disabled());
            (ok(1, 0), vec![])
        }
        (fabrics::OPCODE, fabrics::PROPERTY_GET) => {
            let p = Property::parse(&s);
            let v: u64 = match p.offset {
                reg::CAP => 1023 | (2 << 24),
                reg::CSTS => {
                    let cc = *dev.cc.lock().unwrap();
                    u64::from((cc & 1) | if (cc >> 14) & 3 != 0 { 8 } else { 0 })
                }
                _ => 0,
            };
            (ok(v as u32, (v >> 32) as u32), vec![])
        }
        (fabrics::OPCODE, fabrics::PROPERTY_SET) => {
            let p = Property::parse(&s);
            if p.offset == reg::CC {
                *dev.cc.lock().unwrap() = p.value as u32;
            }
            (ok(0, 0), vec![])
        }
        _ if *qid != 0 => execute_io(dev, c, ok(0, 0), fail(StatusCode::LBA_OUT_OF_RANGE), range),
        (admin::IDENTIFY, _) if s.nsid() == 0 => (ok(0, 0), identify_controller()),
        (admin::IDENTIFY, _) if s.nsid() == 1 => (ok(0, 0), identify_namespace()),
        (admin::IDENTIFY, _) => (fail(StatusCode::INVALID_NAMESPACE), vec![]),
        (admin::SET_FEATURES, _) => (ok(0x0001_0001, 0), vec![]),
        (admin::KEEP_ALIVE, _) => (ok(0, 0), vec![]),
        _ => (fail(StatusCode::INVALID_OPCODE), vec![]),
    }
}

fn execute_io(
    dev: &Device,
    c: &Command,
    ok: Cqe,
    fail: Cqe,
    range: impl Fn(u64, u32) -> Option<std::ops::Range<usize>>,
) -> (Cqe, Vec<u8>) {
    let s = c.sqe;
    let mut d = dev.data.lock().unwrap();
    match s.opcode() {
        nvm::READ => match range(s.slba(), s.nlb()) {
            Some(r) => (ok, d[r].to_vec()),
            None => (fail, vec![]),
        },
        nvm::WRITE => match range(s.slba(), s.nlb()) {
            Some(r) if r.len() == c.data.len() => {
                d[r].copy_from_slice(&c.data);
                (ok, vec![])
            }
            _ => (fail, vec![]),
        },
        nvm::WRITE_ZEROES => match range(s.slba(), s.nlb()) {
            Some(r) => {
                d[r].fill(0);
                (ok, vec![])
            }
            None => (fail, vec![]),
        },
        nvm::DATASET_MANAGEMENT => {
            for r in nvm::dsm_ranges(&c.data) {
                match range(r.slba, r.blocks) {
                    Some(r) => d[r].fill(0),
                    None => return (fail, vec![]),
                }
            }
            (ok, vec![])
        }
        nvm::FLUSH => (ok, vec![]),
        _ => (
            Cqe::new(s.cid(), Status::error(StatusCode::INVALID_OPCODE, true)),
            vec![],
        ),
    }
}

async fn serve_conn(dev: Arc<Device>, mut sock: TcpStream) {
    let cfg = QueueConfig {
        maxh2cdata: 8192,
        c2h_cut: 16384,
        max_r2t_len: 32768,
        ..QueueConfig::default()
    };
    let mut q = ControllerQueue::new(cfg);
    let mut qid = 0;
    let mut buf = vec![0u8; 65536];
    for _ in 0..1_000_000 {
        let n = match sock.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut out = Vec::new();
        for a in q.receive(&buf[..n]) {
            match a {
                Action::Send(b) => out.extend_from_slice(&b),
                Action::Execute(c) => {
                    let (cqe, data) = execute(&dev, &mut q, &mut qid, &c);
                    if data.is_empty() {
                        q.respond(cqe).unwrap().write_to(&mut out);
                    } else {
                        for p in q.respond_with_data(cqe, &[&data]).unwrap() {
                            p.write_to(&mut out);
                        }
                    }
                }
                Action::Close(_) => {
                    let _ = sock.write_all(&out).await;
                    return;
                }
            }
        }
        if sock.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn controller() -> (String, Arc<Device>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let dev = Arc::new(Device {
        data: Mutex::new(vec![0xEE; BLOCKS as usize * BS]),
        cc: Mutex::new(0),
    });
    let d = dev.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(serve_conn(d.clone(), s));
        }
    });
    (addr, dev)
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect::<Vec<_>>()
        .into()
}

async fn round_trip(digests: bool) {
    let (addr, dev) = controller().await;
    let mut o = ConnectOptions::new(NQN);
    o.queues = 2;
    o.queue_depth = 16;
    o.hdgst = digests;
    o.ddgst = digests;
    let c = Controller::connect(&addr, &o).await.unwrap();
    assert_eq!(
        (c.queues(), c.cntlid(), c.digests()),
        (2, 1, (digests, digests))
    );
    let ns = c.namespace(1).await.unwrap();
    assert_eq!((ns.nsze, ns.block_size), (BLOCKS, 512));
    // By R2T: 256 KiB cut into 8 KiB H2CData PDUs over several R2Ts.
    let big = pattern(256 << 10, 1);
    c.write(1, 8, big.clone()).await.unwrap();
    assert_eq!(
        &dev.data.lock().unwrap()[8 * BS..8 * BS + big.len()],
        &big[..]
    );
    assert_eq!(c.read(1, 8, 512).await.unwrap(), big);
    // In the capsule.
    let small = pattern(2048, 2);
    c.write(1, 0, small.clone()).await.unwrap();
    assert_eq!(c.read(1, 0, 4).await.unwrap(), small);
    // Many outstanding over both queues.
    let c = Arc::new(c);
    let tasks: Vec<_> = (0..40u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let d = pattern(4096, i as u8);
                c.write(1, 1024 + i * 8, d.clone()).await.unwrap();
                assert_eq!(c.read(1, 1024 + i * 8, 8).await.unwrap(), d);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    c.write_zeroes(1, 8, 16).await.unwrap();
    c.deallocate(1, 24, 8).await.unwrap();
    c.flush(1).await.unwrap();
    let back = c.read(1, 8, 24).await.unwrap();
    let nz: Vec<usize> = (0..back.len()).filter(|&i| back[i] != 0).collect();
    assert!(nz.is_empty(), "{} nonzero from {:?}", nz.len(), nz.first());
}

#[tokio::test]
async fn reads_and_writes_without_digests() {
    tokio::time::timeout(Duration::from_secs(30), round_trip(false))
        .await
        .unwrap();
}

#[tokio::test]
async fn reads_and_writes_with_header_and_data_digests() {
    tokio::time::timeout(Duration::from_secs(30), round_trip(true))
        .await
        .unwrap();
}

#[tokio::test]
async fn errors_are_typed_with_the_nvme_status() {
    let (addr, _dev) = controller().await;
    let c = Controller::connect(&addr, &ConnectOptions::new(NQN))
        .await
        .unwrap();
    let e = c.namespace(2).await.unwrap_err();
    assert_eq!(
        e.status().map(|s| s.code),
        Some(StatusCode::INVALID_NAMESPACE)
    );
    assert!(e.to_string().contains("Invalid Namespace or Format"), "{e}");
    let e = c.read(1, BLOCKS - 1, 2).await.unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    let e = c.write(1, 0, Bytes::from(vec![0; 100])).await.unwrap_err();
    assert!(e.to_string().contains("whole 512-byte blocks"), "{e}");
    c.shutdown().await.unwrap();
}
