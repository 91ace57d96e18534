//! Posting in place (switched on: `Rnic::post_in_place`): a work request posted to an empty
//! send queue is written on the poster's thread, one posted behind queued work goes through
//! the engine, and the two keep one order on the wire and in the completion queue.

mod common;
use common::*;
use rdma::*;
use rnic::Rnic;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// With the sender's engine driven by nobody, a Send posted on an idle connection still
/// reaches the peer and completes: the poster wrote it. Turned off, the same post waits for
/// the engine's turn.
#[test]
fn a_send_posted_to_an_idle_queue_is_written_by_the_poster() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let driving = Arc::new(AtomicBool::new(true));
    let (a, mut drive_a) = Rnic::new_driven(|| {}).unwrap();
    a.post_in_place(true);
    let b = Rnic::new().unwrap();
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let rbuf = b.reg_mr(&pdb, 4 * 64, Access::LOCAL_WRITE).unwrap();
    let src = mr_with(&a, &pda, &pattern(3, 64), Access::NONE);
    // The driver turns while connecting (the MPA exchange attaches the QP through it), then
    // stops for good.
    let on = driving.clone();
    let driver = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + T;
        while on.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            drive_a.turn();
            std::thread::yield_now();
        }
        drive_a
    });
    let params = ConnParams {
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, eb) = pair(&a, &pda, &b, &pdb, params, |_, qb| {
        for i in 0..4 {
            qb.post_recv(RecvWr {
                wr_id: i,
                sges: vec![rbuf.sge(i as usize * 64, 64)],
            })
            .unwrap();
        }
    });
    // The responder sends nothing before our first FPDU; give the attach a moment to settle.
    std::thread::sleep(Duration::from_millis(100));
    driving.store(false, Ordering::Release);
    let mut drive_a = driver.join().unwrap();
    let send = |wr_id: u64| SendWr {
        wr_id,
        op: SendOp::Send,
        sges: vec![src.sge(0, 64)],
        signaled: true,
    };
    ea.qp.post_send(send(7)).unwrap();
    let got = wait_wc(&eb.rcq, T);
    assert_eq!(
        (got.wr_id, got.status, got.byte_len),
        (0, WcStatus::Success, 64)
    );
    let done = wait_wc(&ea.scq, T);
    assert_eq!((done.wr_id, done.status), (7, WcStatus::Success));

    a.post_in_place(false);
    ea.qp.post_send(send(8)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut out = [Wc::EMPTY];
    assert_eq!(eb.rcq.poll(&mut out), 0, "sent without the engine");
    assert_eq!(ea.scq.poll(&mut out), 0, "completed without the engine");
    let deadline = std::time::Instant::now() + T;
    while ea.scq.poll(&mut out) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine never sent it"
        );
        drive_a.turn();
    }
    assert_eq!((out[0].wr_id, out[0].status), (8, WcStatus::Success));
    assert_eq!(wait_wc(&eb.rcq, T).wr_id, 1);
}

/// Rounds of Sends posted behind a large RDMA Write (queued: the engine writes them) and
/// Sends posted one at a time to an idle queue (written in place), with and without MPA CRC:
/// every Send arrives in posting order with its bytes, the Write lands whole, and the
/// sender's completions are exactly the signalled requests, in posting order.
#[test]
fn in_place_and_engine_posted_sends_keep_one_order() {
    for crc in [false, true] {
        mixed_rounds(crc);
    }
}

fn mixed_rounds(crc: bool) {
    const ROUNDS: usize = 6;
    const QUEUED: usize = 24;
    const SINGLES: usize = 8;
    const SENDS: usize = ROUNDS * (QUEUED + SINGLES);
    const RECV_LEN: usize = 9000;
    const WRITE_LEN: usize = 1 << 20;
    let (a, b) = (Rnic::new().unwrap(), Rnic::new().unwrap());
    a.post_in_place(true);
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let rbuf = b
        .reg_mr(&pdb, SENDS * RECV_LEN, Access::LOCAL_WRITE)
        .unwrap();
    let sink = b
        .reg_mr(&pdb, WRITE_LEN, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    let params = ConnParams {
        crc,
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, eb) = pair(&a, &pda, &b, &pdb, params, |_, qb| {
        for i in 0..SENDS {
            qb.post_recv(RecvWr {
                wr_id: i as u64,
                sges: vec![rbuf.sge(i * RECV_LEN, RECV_LEN)],
            })
            .unwrap();
        }
    });
    let src_data = pattern(11, WRITE_LEN + RECV_LEN);
    let src = mr_with(&a, &pda, &src_data, Access::NONE);
    let len_of = |i: usize| 1 + (i * 997) % RECV_LEN;
    let mut signalled = Vec::new();
    let mut post = |i: usize| {
        let signaled = i.is_multiple_of(3);
        if signaled {
            signalled.push(i as u64);
        }
        ea.qp
            .post_send(SendWr {
                wr_id: i as u64,
                op: SendOp::Send,
                sges: vec![src.sge(i % 4096, len_of(i))],
                signaled,
            })
            .unwrap();
        signaled
    };
    let mut completions = Vec::new();
    let take_until = |wr_id: u64, completions: &mut Vec<u64>| loop {
        let wc = wait_wc(&ea.scq, T);
        assert_eq!(wc.status, WcStatus::Success, "completion of {}", wc.wr_id);
        completions.push(wc.wr_id);
        if wc.wr_id >= wr_id {
            return;
        }
    };
    let mut i = 0;
    for round in 0..ROUNDS {
        ea.qp
            .post_send(SendWr {
                signaled: false,
                ..rdma_write(
                    1 << 40 | round as u64,
                    &sink,
                    0,
                    vec![src.sge(0, WRITE_LEN)],
                )
            })
            .unwrap();
        for _ in 0..QUEUED {
            post(i);
            i += 1;
        }
        for _ in 0..SINGLES {
            // Wait until everything before is written and completed: the queue is idle.
            if post(i) {
                take_until(i as u64, &mut completions);
            }
            i += 1;
        }
    }
    for r in 0..SENDS {
        let wc = wait_wc(&eb.rcq, T);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (r as u64, WcStatus::Success, len_of(r)),
            "receive {r} (crc {crc})"
        );
        let mut got = vec![0u8; len_of(r)];
        rbuf.read_at(r * RECV_LEN, &mut got);
        let from = r % 4096;
        assert!(got == src_data[from..from + len_of(r)], "Send {r} payload");
    }
    if let Some(&last) = signalled.last() {
        if completions.last() != Some(&last) {
            take_until(last, &mut completions);
        }
    }
    assert_eq!(completions, signalled, "completions (crc {crc})");
    let mut got = vec![0u8; WRITE_LEN];
    sink.read_at(0, &mut got);
    assert!(got == src_data[..WRITE_LEN], "the RDMA Write's bytes");
}
