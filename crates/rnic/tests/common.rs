#![allow(dead_code)]
use rdma::*;
use rnic::{Cq, Mr, Qp, Rnic};
use std::time::{Duration, Instant};

pub struct End {
    pub qp: Qp,
    pub scq: Cq,
    pub rcq: Cq,
}

pub fn wait_wc(cq: &Cq, timeout: Duration) -> Wc {
    let deadline = Instant::now() + timeout;
    let mut out = [Wc::EMPTY];
    loop {
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
        assert!(
            Instant::now() < deadline,
            "no completion within {timeout:?}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Connects a client QP on `a` to a server QP on `b` over loopback, posting `recvs` receive
/// buffers (from `rbuf_a`/`rbuf_b`, each split in equal parts) before connecting.
pub fn pair(
    a: &Rnic,
    pda: &rnic::Pd,
    b: &Rnic,
    pdb: &rnic::Pd,
    params: ConnParams,
    pre: impl FnOnce(&Qp, &Qp),
) -> (End, End) {
    let listener = b.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let mk = |r: &Rnic, pd: &rnic::Pd| {
        let scq = r.create_cq(4096, None).unwrap();
        let rcq = r.create_cq(4096, None).unwrap();
        let qp = r
            .create_qp(
                pd,
                &scq,
                &rcq,
                QpCaps {
                    max_send_wr: 1024,
                    max_recv_wr: 1024,
                    max_sge: 16,
                },
            )
            .unwrap();
        End { qp, scq, rcq }
    };
    let ea = mk(a, pda);
    let eb = mk(b, pdb);
    pre(&ea.qp, &eb.qp);
    let p2 = params.clone();
    let qpb = &eb.qp;
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            let req = listener
                .get_request(Duration::from_secs(5))
                .unwrap()
                .expect("a request");
            req.accept(qpb, &p2).unwrap()
        });
        ea.qp.connect(addr, &params).unwrap();
        h.join().unwrap();
    });
    (ea, eb)
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn mr_with(r: &Rnic, pd: &rnic::Pd, data: &[u8], access: Access) -> Mr {
    let mr = r.reg_mr(pd, data.len(), access).unwrap();
    mr.write_at(0, data);
    mr
}

/// A signaled RDMA Write of `sges` to `sink` at offset `at`.
pub fn rdma_write(wr_id: u64, sink: &Mr, at: usize, sges: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::RdmaWrite {
            remote_addr: sink.addr() + at as u64,
            rkey: sink.rkey(),
        },
        sges,
        signaled: true,
    }
}

/// Posts a signaled RDMA Write of `sges` to the start of `sink`.
pub fn post_rdma_write(qp: &Qp, wr_id: u64, sink: &Mr, sges: Vec<Sge>) {
    qp.post_send(rdma_write(wr_id, sink, 0, sges)).unwrap()
}
