//! Correctness under load: 64 queue pairs between two RNICs on loopback, each running a seeded
//! random mix of Sends, RDMA Writes and RDMA Reads from 1 byte to 16 MiB, everything posted at
//! once, with every payload verified and the bytes around every target checked untouched.
mod common;
use common::*;
use rand::{Rng, SeedableRng};
use rdma::*;
use rnic::{Mr, Rnic};
use std::time::Duration;

const QPS: usize = 64;
const OPS_PER_QP: usize = 8;
/// Payload bytes of the whole run (the forced 16 MiB messages included): modest, so the test
/// finishes in seconds on two shared cores.
const BUDGET: usize = 320 << 20;
const MAX_MSG: usize = 16 << 20;
/// Bytes left around every target so a stray placement would be seen.
const GUARD: usize = 64;
const T: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Send,
    SendSe,
    Write,
    Read,
}

#[derive(Clone, Debug)]
struct Op {
    kind: Kind,
    size: usize,
    /// Offset of the payload inside the target region (after the front guard).
    off: usize,
    /// Split the local data into two SGEs at this point (Send/Write only).
    split: Option<usize>,
    seed: u64,
}

/// Sizes spread evenly over powers of two from 1 B to 16 MiB; once the budget is spent, small.
fn plan(seed: u64) -> Vec<Vec<Op>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut spent = 0usize;
    let mut plans = Vec::new();
    for q in 0..QPS {
        let mut ops = Vec::new();
        for i in 0..OPS_PER_QP {
            let kind = [Kind::Send, Kind::SendSe, Kind::Write, Kind::Read][rng.gen_range(0..4)];
            let exp = rng.gen_range(0..=24u32);
            let mut size = rng.gen_range(1usize << exp..=(2usize << exp).min(MAX_MSG));
            if spent + size > BUDGET / 2 {
                size = rng.gen_range(1..=64 << 10);
            }
            let mut op = Op {
                kind,
                size,
                off: rng.gen_range(0..GUARD),
                split: None,
                seed: (q * 1000 + i) as u64 ^ seed,
            };
            // The extremes, whatever the dice say: 16 MiB and 1 B of each kind.
            match (q, i) {
                (0..=2, 0) => {
                    op.kind = [Kind::Write, Kind::Read, Kind::Send][q];
                    op.size = MAX_MSG;
                }
                (3..=5, 0) => {
                    op.kind = [Kind::Write, Kind::Read, Kind::Send][q - 3];
                    op.size = 1;
                }
                _ => {}
            }
            if op.kind != Kind::Read && op.size > 1 && rng.gen_bool(0.3) {
                op.split = Some(rng.gen_range(1..op.size));
            }
            spent += op.size;
            ops.push(op);
        }
        plans.push(ops);
    }
    assert!(spent <= BUDGET, "plan spends {spent} bytes");
    plans
}

/// What one queue pair needs on each side for its plan.
struct Buffers {
    /// Per op: the active side's source (Send/Write) or sink (Read).
    local: Vec<Mr>,
    /// Per op: the passive side's receive buffer (Send), sink (Write) or source (Read).
    remote: Vec<Mr>,
}

fn run_qp(a: &Rnic, pda: &rnic::Pd, b: &Rnic, pdb: &rnic::Pd, ea: &End, eb: &End, ops: &[Op]) {
    let mut bufs = Buffers {
        local: Vec::new(),
        remote: Vec::new(),
    };
    for op in ops {
        let data = pattern(op.seed, op.size);
        let region = op.size + 2 * GUARD;
        match op.kind {
            Kind::Send | Kind::SendSe => {
                bufs.local.push(mr_with(a, pda, &data, Access::NONE));
                let r = b.reg_mr(pdb, region, Access::LOCAL_WRITE).unwrap();
                eb.qp
                    .post_recv(RecvWr {
                        wr_id: bufs.remote.len() as u64,
                        sges: vec![r.sge(GUARD + op.off, op.size + GUARD - op.off)],
                    })
                    .unwrap();
                bufs.remote.push(r);
            }
            Kind::Write => {
                bufs.local.push(mr_with(a, pda, &data, Access::NONE));
                bufs.remote
                    .push(b.reg_mr(pdb, region, Access::REMOTE_WRITE).unwrap());
            }
            Kind::Read => {
                bufs.local
                    .push(a.reg_mr(pda, region, Access::LOCAL_WRITE).unwrap());
                let src = b.reg_mr(pdb, region, Access::REMOTE_READ).unwrap();
                src.write_at(GUARD + op.off, &data);
                bufs.remote.push(src);
            }
        }
    }
    let fin_rx = b.reg_mr(pdb, 8, Access::LOCAL_WRITE).unwrap();
    eb.qp
        .post_recv(RecvWr {
            wr_id: u64::MAX,
            sges: vec![fin_rx.sge(0, 8)],
        })
        .unwrap();

    for (i, op) in ops.iter().enumerate() {
        let (l, r) = (&bufs.local[i], &bufs.remote[i]);
        let sges = match op.split {
            Some(s) => vec![l.sge(0, s), l.sge(s, op.size - s)],
            None => vec![l.sge(0, op.size)],
        };
        let target = r.addr() + (GUARD + op.off) as u64;
        let (op_code, sges) = match op.kind {
            Kind::Send => (SendOp::Send, sges),
            Kind::SendSe => (SendOp::SendSe, sges),
            Kind::Write => (
                SendOp::RdmaWrite {
                    remote_addr: target,
                    rkey: r.rkey(),
                },
                sges,
            ),
            Kind::Read => (
                SendOp::RdmaRead {
                    remote_addr: target,
                    rkey: r.rkey(),
                },
                vec![l.sge(GUARD + op.off, op.size)],
            ),
        };
        ea.qp
            .post_send(SendWr {
                wr_id: i as u64,
                op: op_code,
                sges,
                signaled: true,
            })
            .unwrap();
    }
    // A Send after everything: when it arrives, every Write before it is placed.
    let fin = mr_with(a, pda, b"fin", Access::NONE);
    ea.qp
        .post_send(SendWr {
            wr_id: u64::MAX,
            op: SendOp::Send,
            sges: vec![fin.sge(0, 3)],
            signaled: true,
        })
        .unwrap();

    // Active side: one successful completion per work request. Sends and Writes complete in
    // posting order; a Read completes when its response is in, possibly after later ones.
    let mut done = vec![false; ops.len() + 1];
    let mut last_non_read = None;
    for _ in 0..=ops.len() {
        let wc = wait_wc(&ea.scq, T);
        let i = if wc.wr_id == u64::MAX {
            ops.len()
        } else {
            wc.wr_id as usize
        };
        assert!(i <= ops.len() && !done[i], "unexpected completion {wc:?}");
        done[i] = true;
        assert_eq!(wc.status, WcStatus::Success, "{:?}", ops.get(i));
        match ops.get(i) {
            Some(op) if op.kind == Kind::Read => {
                assert_eq!(
                    (wc.opcode, wc.byte_len as usize),
                    (WcOpcode::RdmaRead, op.size)
                );
            }
            _ => {
                assert!(
                    last_non_read < Some(i),
                    "completion {i} after {last_non_read:?}"
                );
                last_non_read = Some(i);
            }
        }
    }

    // Passive side: the receives complete in order, with the right lengths and flags.
    for (i, op) in ops.iter().enumerate() {
        if matches!(op.kind, Kind::Send | Kind::SendSe) {
            let wc = wait_wc(&eb.rcq, T);
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len as usize, wc.solicited),
                (
                    i as u64,
                    WcStatus::Success,
                    op.size,
                    op.kind == Kind::SendSe
                ),
                "{op:?}"
            );
        }
    }
    let wc = wait_wc(&eb.rcq, T);
    assert_eq!((wc.wr_id, wc.byte_len), (u64::MAX, 3));

    // Every payload where it belongs, nothing around it touched.
    for (i, op) in ops.iter().enumerate() {
        let holder = match op.kind {
            Kind::Read => &bufs.local[i],
            _ => &bufs.remote[i],
        };
        let mut got = vec![0u8; holder.len()];
        holder.read_at(0, &mut got);
        let at = GUARD + op.off;
        assert!(
            got[at..at + op.size] == pattern(op.seed, op.size)[..],
            "payload mismatch: {op:?}"
        );
        assert!(
            got[..at]
                .iter()
                .chain(&got[at + op.size..])
                .all(|&x| x == 0),
            "bytes outside the target changed: {op:?}"
        );
    }
}

#[test]
fn sixty_four_qps_mixed_operations_verified() {
    sixty_four_qps(false);
}

/// The same load with every FPDU sent as its own MSG_EOR message (the path network
/// connections take): partial sends of a batch resume mid-FPDU without loss.
#[test]
fn sixty_four_qps_with_segment_aligned_fpdus() {
    sixty_four_qps(true);
}

fn sixty_four_qps(aligned: bool) {
    let plans = plan(0x1905_2026);
    let total: usize = plans.iter().flatten().map(|o| o.size).sum();
    let a = Rnic::new().unwrap();
    let b = Rnic::new().unwrap();
    a.align_fpdus_on_loopback(aligned);
    b.align_fpdus_on_loopback(aligned);
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let pairs: Vec<(End, End)> = (0..QPS)
        .map(|i| {
            let params = ConnParams {
                crc: i % 2 == 1,
                first_fpdu_delay: Duration::ZERO,
                ..Default::default()
            };
            pair(&a, &pda, &b, &pdb, params, |_, _| {})
        })
        .collect();
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for ((ea, eb), ops) in pairs.iter().zip(&plans) {
            let (a, b, pda, pdb) = (&a, &b, &pda, &pdb);
            s.spawn(move || run_qp(a, pda, b, pdb, ea, eb, ops));
        }
    });
    eprintln!(
        "{QPS} QPs, {} operations, {:.1} MiB verified in {:.2?}",
        QPS * OPS_PER_QP,
        total as f64 / (1 << 20) as f64,
        t0.elapsed()
    );
    for (ea, eb) in &pairs {
        ea.qp.disconnect();
        assert!(ea.qp.wait_closed(T) && eb.qp.wait_closed(T));
    }
}
