//! Two RNIC instances over loopback TCP: every operation, with CRC off and on.
mod common;
use common::*;
use rdma::*;
use rnic::{Rnic, Turn};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn all_ops(crc: bool) {
    let a = Rnic::new().unwrap();
    let b = Rnic::new().unwrap();
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let rbuf = b.reg_mr(&pdb, 300_000, Access::LOCAL_WRITE).unwrap();
    let params = ConnParams {
        crc,
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, eb) = pair(&a, &pda, &b, &pdb, params, |_, qb| {
        qb.post_recv(RecvWr {
            wr_id: 1,
            sges: vec![rbuf.sge(0, 200_000)],
        })
        .unwrap();
        qb.post_recv(RecvWr {
            wr_id: 2,
            sges: vec![rbuf.sge(200_000, 50_000), rbuf.sge(250_000, 50_000)],
        })
        .unwrap();
    });

    // Send of 150 000 bytes (three FPDUs on loopback), then RDMA Write, then Send w/ SE+Invalidate.
    let data = pattern(1, 150_000);
    let src = mr_with(&a, &pda, &data, Access::NONE);
    ea.qp
        .post_send(SendWr {
            wr_id: 10,
            op: SendOp::Send,
            sges: vec![src.sge(0, data.len())],
            signaled: true,
        })
        .unwrap();
    let wc = wait_wc(&eb.rcq, T);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (1, WcStatus::Success, WcOpcode::Recv, 150_000)
    );
    let mut got = vec![0u8; data.len()];
    rbuf.read_at(0, &mut got);
    assert!(got == data, "Send payload mismatch");
    assert_eq!(wait_wc(&ea.scq, T).wr_id, 10);

    let sink = b
        .reg_mr(
            &pdb,
            1 << 20,
            Access::REMOTE_WRITE | Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let wdata = pattern(2, 700_001);
    let wsrc = mr_with(&a, &pda, &wdata, Access::NONE);
    ea.qp
        .post_send(SendWr {
            wr_id: 11,
            op: SendOp::RdmaWrite {
                remote_addr: sink.addr() + 5,
                rkey: sink.rkey(),
            },
            sges: vec![wsrc.sge(0, 400_000), wsrc.sge(400_000, 300_001)],
            signaled: true,
        })
        .unwrap();
    let small = mr_with(&a, &pda, b"done", Access::NONE);
    ea.qp
        .post_send(SendWr {
            wr_id: 12,
            op: SendOp::SendSeInvalidate { rkey: sink.rkey() },
            sges: vec![small.sge(0, 4)],
            signaled: true,
        })
        .unwrap();
    // The Send completes after the Write's data is placed (ordering).
    let wc = wait_wc(&eb.rcq, T);
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.solicited, wc.invalidated_rkey),
        (2, 4, true, Some(sink.rkey()))
    );
    let mut got = vec![0u8; wdata.len()];
    sink.read_at(5, &mut got);
    assert!(got == wdata, "RDMA Write payload mismatch");
    assert!(
        !sink.is_valid(),
        "Send with Invalidate invalidated the STag"
    );
    assert_eq!(wait_wc(&ea.scq, T).wr_id, 11);
    assert_eq!(wait_wc(&ea.scq, T).wr_id, 12);

    // RDMA Read of a re-validated region.
    let new_key = sink.revalidate();
    let rsink = a.reg_mr(&pda, 1 << 20, Access::LOCAL_WRITE).unwrap();
    ea.qp
        .post_send(SendWr {
            wr_id: 13,
            op: SendOp::RdmaRead {
                remote_addr: sink.addr() + 5,
                rkey: new_key,
            },
            sges: vec![rsink.sge(100, wdata.len())],
            signaled: true,
        })
        .unwrap();
    let wc = wait_wc(&ea.scq, T);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (13, WcStatus::Success, WcOpcode::RdmaRead, 700_001)
    );
    let mut got = vec![0u8; wdata.len()];
    rsink.read_at(100, &mut got);
    assert!(got == wdata, "RDMA Read payload mismatch");

    // Orderly close: both sides end in Error with nothing left outstanding.
    ea.qp.disconnect();
    assert!(ea.qp.wait_closed(T));
    assert!(eb.qp.wait_closed(T));
}

#[test]
fn all_operations_crc_off() {
    all_ops(false);
}

#[test]
fn all_operations_crc_on() {
    all_ops(true);
}

#[test]
fn flush_on_disconnect_and_reject_with_private_data() {
    let a = Rnic::new().unwrap();
    let pd = a.alloc_pd().unwrap();
    let buf = a.reg_mr(&pd, 4096, Access::LOCAL_WRITE).unwrap();
    let (ea, eb) = pair(
        &a,
        &pd,
        &a,
        &pd,
        ConnParams {
            first_fpdu_delay: Duration::ZERO,
            ..Default::default()
        },
        |_, _| {},
    );
    eb.qp
        .post_recv(RecvWr {
            wr_id: 77,
            sges: vec![buf.sge(0, 4096)],
        })
        .unwrap();
    ea.qp.disconnect();
    assert!(eb.qp.wait_closed(T));
    let wc = wait_wc(&eb.rcq, T);
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::Flushed));

    let listener = a.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let h = std::thread::spawn(move || {
        let req = listener.get_request(T).unwrap().unwrap();
        assert_eq!(req.private_data(), b"hello");
        req.reject(b"go away").unwrap();
    });
    let cq = a.create_cq(16, None).unwrap();
    let qp = a.create_qp(&pd, &cq, &cq, QpCaps::default()).unwrap();
    let err = qp
        .connect(
            addr,
            &ConnParams {
                private_data: b"hello".to_vec(),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::Rejected(ref pd) if pd == b"go away"),
        "{err}"
    );
    h.join().unwrap();
}

#[test]
fn peer_to_peer_rtr() {
    let a = Rnic::new().unwrap();
    let pd = a.alloc_pd().unwrap();
    let buf = a.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let src = mr_with(&a, &pd, b"after rtr", Access::NONE);
    let params = ConnParams {
        p2p: true,
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, eb) = pair(&a, &pd, &a, &pd, params, |qa, _| {
        qa.post_recv(RecvWr {
            wr_id: 5,
            sges: vec![buf.sge(0, 64)],
        })
        .unwrap();
    });
    // The responder sends first: allowed once the RTR has arrived.
    eb.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sges: vec![src.sge(0, 9)],
            signaled: true,
        })
        .unwrap();
    let wc = wait_wc(&ea.rcq, T);
    assert_eq!((wc.wr_id, wc.byte_len), (5, 9));
}

/// Two RNICs, a protection domain on each, and a queue pair between them with MPA CRC on
/// (and RDMA Reads allowed both ways): (a, b, a's PD, b's PD, a's end, b's end).
fn crc_pair() -> (Rnic, Rnic, rnic::Pd, rnic::Pd, End, End) {
    let a = Rnic::new().unwrap();
    let b = Rnic::new().unwrap();
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let params = ConnParams {
        crc: true,
        first_fpdu_delay: Duration::ZERO,
        ird: 4,
        ord: 4,
        ..Default::default()
    };
    let (ea, eb) = pair(&a, &pda, &b, &pdb, params, |_, _| {});
    (a, b, pda, pdb, ea, eb)
}

/// With MPA CRC, an RDMA Write whose source region another thread rewrites while the Write is
/// queued (an iSER target's RAM LUN image under an overlapping WRITE) still arrives with a CRC
/// that covers its bytes: a hardware RNIC reads memory once, and so must this one. Before, the
/// CRC was computed when the FPDU was queued and the bytes read again when it was sent, and
/// the receiver answered with an MPA CRC Terminate.
#[test]
fn a_source_rewritten_during_a_crc_protected_write_arrives_intact() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const LEN: usize = 4 << 20;
    let (a, b, pda, pdb, ea, eb) = crc_pair();
    let sink = b
        .reg_mr(&pdb, LEN, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    let src = mr_with(&a, &pda, &pattern(3, LEN), Access::NONE);
    let write_all = |wr_id| post_rdma_write(&ea.qp, wr_id, &sink, vec![src.sge(0, LEN)]);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (x, y) = (pattern(4, 64 << 10), pattern(5, 64 << 10));
            let deadline = std::time::Instant::now() + T;
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                for (i, off) in (0..LEN).step_by(x.len()).enumerate() {
                    src.write_at(off, if i % 2 == 0 { &x } else { &y });
                }
            }
        });
        for n in 0..16 {
            write_all(n);
        }
        for n in 0..16 {
            let wc = wait_wc(&ea.scq, T);
            assert_eq!((wc.wr_id, wc.status), (n, WcStatus::Success));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(ea.qp.last_error().is_none(), "{:?}", ea.qp.last_error());
    assert!(eb.qp.last_error().is_none(), "{:?}", eb.qp.last_error());
    // The connection carries on: a stable source arrives as it is.
    let data = pattern(6, LEN);
    src.write_at(0, &data);
    write_all(99);
    assert_eq!(wait_wc(&ea.scq, T).status, WcStatus::Success);
    ea.qp.disconnect();
    assert!(ea.qp.wait_closed(T));
    assert!(
        eb.qp.wait_closed(T),
        "the receiver took every byte before the close"
    );
    let mut got = vec![0u8; LEN];
    sink.read_at(0, &mut got);
    assert!(got == data, "the last RDMA Write's bytes differ");
}

/// Many small Sends with RDMA Writes of sizes around the direct-read threshold between
/// them, posted at once: the receiver reads them ahead in bulk (headers, trailers and short
/// payloads from its stage; long payloads partly from the stage, the rest straight from the
/// socket), and every byte lands where it belongs, in order.
fn burst_of_mixed_sizes(crc: bool) {
    burst_of_mixed_sizes_on(&Rnic::new().unwrap(), &Rnic::new().unwrap(), crc);
}

fn burst_of_mixed_sizes_on(a: &Rnic, b: &Rnic, crc: bool) {
    const SENDS: usize = 300;
    const RECV_LEN: usize = 512;
    let write_sizes = [
        1, 100, 8192, 12_287, 12_288, 12_289, 16_384, 70_000, 300_000,
    ];
    let pda = a.alloc_pd().unwrap();
    let pdb = b.alloc_pd().unwrap();
    let rbuf = b
        .reg_mr(&pdb, SENDS * RECV_LEN, Access::LOCAL_WRITE)
        .unwrap();
    let sink_len: usize = write_sizes.iter().sum::<usize>() * (SENDS / 10 / write_sizes.len() + 1);
    let sink = b
        .reg_mr(&pdb, sink_len, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    let params = ConnParams {
        crc,
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, eb) = pair(a, &pda, b, &pdb, params, |_, qb| {
        for i in 0..SENDS {
            qb.post_recv(RecvWr {
                wr_id: i as u64,
                sges: vec![rbuf.sge(i * RECV_LEN, RECV_LEN)],
            })
            .unwrap();
        }
    });
    let src_data = pattern(7, 400_000);
    let src = mr_with(a, &pda, &src_data, Access::NONE);
    // (offset in the sink, length, offset in the source) of every Write.
    let mut writes = Vec::new();
    let mut at = 0;
    for i in 0..SENDS {
        if i % 10 == 5 {
            let len = write_sizes[writes.len() % write_sizes.len()];
            let from = (writes.len() * 977) % (src_data.len() - len);
            let wr = rdma_write(1_000 + i as u64, &sink, at, vec![src.sge(from, len)]);
            ea.qp
                .post_send(SendWr {
                    signaled: false,
                    ..wr
                })
                .unwrap();
            writes.push((at, len, from));
            at += len;
        }
        let len = 1 + i % RECV_LEN;
        ea.qp
            .post_send(SendWr {
                wr_id: i as u64,
                op: SendOp::Send,
                sges: vec![src.sge(i, len)],
                signaled: false,
            })
            .unwrap();
    }
    for i in 0..SENDS {
        let wc = wait_wc(&eb.rcq, T);
        let len = 1 + i % RECV_LEN;
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (i as u64, WcStatus::Success, len),
            "receive {i}"
        );
        let mut got = vec![0u8; len];
        rbuf.read_at(i * RECV_LEN, &mut got);
        assert!(got == src_data[i..i + len], "Send {i} payload");
    }
    for (n, &(at, len, from)) in writes.iter().enumerate() {
        let mut got = vec![0u8; len];
        sink.read_at(at, &mut got);
        assert!(
            got == src_data[from..from + len],
            "RDMA Write {n} ({len} bytes)"
        );
    }
}

#[test]
fn a_burst_of_mixed_sizes_lands_intact_crc_off() {
    burst_of_mixed_sizes(false);
}

#[test]
fn a_burst_of_mixed_sizes_lands_intact_crc_on() {
    burst_of_mixed_sizes(true);
}

/// Two RNICs without progress threads, driven by a loop of the test's own: the same burst
/// lands intact, posting a verb calls the kick, and each engine stops once its RNIC is
/// dropped.
#[test]
fn driven_engines_serve_a_burst_and_stop_with_their_rnics() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let kicks = Arc::new(AtomicUsize::new(0));
    let counted = kicks.clone();
    let (a, drive_a) = Rnic::new_driven(move || {
        counted.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    let (b, drive_b) = Rnic::new_driven(|| {}).unwrap();
    let driving = std::thread::spawn(move || {
        let mut drivers = [(drive_a, false), (drive_b, false)];
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while drivers.iter().any(|(_, stopped)| !stopped) {
            assert!(
                std::time::Instant::now() < deadline,
                "an engine did not stop"
            );
            for (driver, stopped) in drivers.iter_mut().filter(|(_, s)| !s) {
                *stopped = driver.turn() == Turn::Stopped;
            }
            std::thread::yield_now();
        }
    });
    burst_of_mixed_sizes_on(&a, &b, true);
    assert!(
        kicks.load(Ordering::Relaxed) > 0,
        "posting never kicked the driver"
    );
    drop((a, b));
    driving.join().unwrap();
}

/// With MPA CRC, payload from a caller's immutable bytes (`reg_bytes`) leaves from them in
/// place, its CRC taken there, while payload from an ordinary region is copied as its CRC is
/// computed: an RDMA Write gathering both kinds, across many FPDUs, and an RDMA Read served from
/// the immutable bytes, arrive intact and with CRCs the receiver accepts.
#[test]
fn crc_protected_payload_from_immutable_and_ordinary_regions_arrives_intact() {
    const PART: usize = 100_000;
    let (a, b, pda, pdb, ea, eb) = crc_pair();
    let fixed = bytes::Bytes::from(pattern(7, PART));
    let fixed_mr = a
        .reg_bytes(&pda, fixed.clone(), Access::REMOTE_READ)
        .unwrap();
    let plain = mr_with(&a, &pda, &pattern(8, PART), Access::NONE);
    let sink = b
        .reg_mr(&pdb, 4 * PART, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    post_rdma_write(
        &ea.qp,
        1,
        &sink,
        vec![
            fixed_mr.sge(0, PART),
            plain.sge(0, PART),
            plain.sge(0, 1000),
            fixed_mr.sge(1000, PART - 1000),
        ],
    );
    let wc = wait_wc(&ea.scq, T);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    // b reads the immutable bytes back from a (a serves the Read Response from them).
    let back = b.reg_mr(&pdb, PART, Access::LOCAL_WRITE).unwrap();
    eb.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::RdmaRead {
                remote_addr: fixed_mr.addr(),
                rkey: fixed_mr.rkey(),
            },
            sges: vec![back.sge(0, PART)],
            signaled: true,
        })
        .unwrap();
    let wc = wait_wc(&eb.scq, T);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert!(ea.qp.last_error().is_none(), "{:?}", ea.qp.last_error());
    assert!(eb.qp.last_error().is_none(), "{:?}", eb.qp.last_error());
    let mut want = fixed.to_vec();
    want.extend_from_slice(&pattern(8, PART));
    want.extend_from_slice(&pattern(8, PART)[..1000]);
    want.extend_from_slice(&fixed[1000..]);
    let mut got = vec![0u8; want.len()];
    sink.read_at(0, &mut got);
    assert!(got == want, "the gathered RDMA Write's bytes differ");
    let mut got = vec![0u8; PART];
    back.read_at(0, &mut got);
    assert!(got == fixed[..], "the RDMA Read's bytes differ");
}

/// The CRCs of a region's 4 KiB blocks as its owner keeps them ([`BlockCrcs`]); `lie` makes
/// every block's CRC wrong, and `asked` counts the blocks the engine took a CRC of.
struct OwnerCrcs {
    lie: bool,
    asked: std::sync::atomic::AtomicUsize,
}

impl BlockCrcs for OwnerCrcs {
    fn block_len(&self) -> usize {
        4096
    }
    fn block_crc(&self, _index: usize, bytes: &[u8]) -> u32 {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        iwarp::crc::crc32c(bytes) ^ u32::from(self.lie)
    }
}

/// Sends `pieces` (offset, length) of a region whose owner keeps its block CRCs with
/// `OwnerCrcs { lie }`, in one RDMA Write with MPA CRC; returns what arrived, the blocks whose
/// CRC the engine took, and the two ends' errors.
fn write_with_block_crcs(
    lie: bool,
    pieces: &[(usize, usize)],
) -> (Vec<u8>, Vec<u8>, usize, Option<String>) {
    const LEN: usize = 1 << 20;
    let (a, b, pda, pdb, ea, eb) = crc_pair();
    let data = pattern(11, LEN);
    let src = mr_with(&a, &pda, &data, Access::NONE);
    let crcs = std::sync::Arc::new(OwnerCrcs {
        lie,
        asked: Default::default(),
    });
    assert!(
        src.keep_block_crcs(crcs.clone()),
        "the software RNIC takes block CRCs"
    );
    let total: usize = pieces.iter().map(|p| p.1).sum();
    let sink = b
        .reg_mr(&pdb, total, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    let sges = pieces.iter().map(|&(off, len)| src.sge(off, len)).collect();
    post_rdma_write(&ea.qp, 1, &sink, sges);
    let _ = wait_wc(&ea.scq, T);
    let want: Vec<u8> = pieces
        .iter()
        .flat_map(|&(off, len)| data[off..off + len].to_vec())
        .collect();
    if !lie {
        assert!(ea.qp.last_error().is_none(), "{:?}", ea.qp.last_error());
    } else {
        // The receiver finds the CRC wrong and ends the stream.
        let deadline = std::time::Instant::now() + T;
        while eb.qp.last_error().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The sender's completion says the data left, not that the receiver placed it all:
    // read until it is there (bounded), then return what arrived.
    let mut got = vec![0u8; total];
    let deadline = std::time::Instant::now() + T;
    loop {
        sink.read_at(0, &mut got);
        if lie || got == want || std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let asked = crcs.asked.load(std::sync::atomic::Ordering::Relaxed);
    (got, want, asked, eb.qp.last_error())
}

/// Payload from a region whose owner keeps its blocks' CRCs leaves with an MPA CRC joined
/// from them (only partial blocks at the ends of each piece and FPDU are read) and arrives
/// intact: pieces at unaligned offsets, shorter than a block, spanning many blocks, and one
/// ending the region. CRCs that do not match the bytes are caught by the receiver, so the
/// engine really sends by them.
#[test]
fn payload_sent_by_its_owners_block_crcs_arrives_intact_and_a_wrong_crc_is_caught() {
    let pieces = [
        (0, 200_000),
        (5, 100),
        (4095, 4098),
        (12_345, 300_000),
        ((1 << 20) - 70_000, 70_000),
    ];
    let (got, want, asked, err) = write_with_block_crcs(false, &pieces);
    assert!(err.is_none(), "{err:?}");
    assert!(got == want, "the bytes sent by block CRCs differ");
    assert!(asked >= 100, "the engine took {asked} block CRCs");
    let (_, _, asked, err) = write_with_block_crcs(true, &[(0, 64 << 10)]);
    assert!(asked > 0);
    let err = err.expect("the receiver rejected the wrong CRC");
    assert!(err.contains("CRC"), "{err}");
}

/// A peer whose engine never turns answers no RDMA Read and reads nothing: an orderly
/// disconnect would wait for it for ever, an abort tears the connection down at once, and
/// the outstanding Read and the RDMA Writes stuck behind the full socket are flushed.
#[test]
fn abort_ends_a_connection_whose_peer_stopped() {
    let a = Rnic::new().unwrap();
    let pda = a.alloc_pd().unwrap();
    let (b, _stopped_engine) = Rnic::new_driven(|| {}).unwrap();
    let pdb = b.alloc_pd().unwrap();
    let params = ConnParams {
        first_fpdu_delay: Duration::ZERO,
        ..Default::default()
    };
    let (ea, _eb) = pair(&a, &pda, &b, &pdb, params, |_, _| {});
    const LEN: usize = 4 << 20;
    let remote = b
        .reg_mr(&pdb, LEN, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    let local = a.reg_mr(&pda, LEN, Access::LOCAL_WRITE).unwrap();
    ea.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::RdmaRead {
                remote_addr: remote.addr(),
                rkey: remote.rkey(),
            },
            sges: vec![local.sge(0, 4096)],
            signaled: true,
        })
        .unwrap();
    // More than the sockets between them hold.
    const WRITES: u64 = 16;
    for i in 0..WRITES {
        ea.qp
            .post_send(SendWr {
                wr_id: 2 + i,
                op: SendOp::RdmaWrite {
                    remote_addr: remote.addr(),
                    rkey: remote.rkey(),
                },
                sges: vec![local.sge(0, LEN)],
                signaled: true,
            })
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut done = std::collections::HashMap::new();
    let mut wcs = [Wc::EMPTY; 32];
    let n = ea.scq.poll(&mut wcs);
    done.extend(wcs[..n].iter().map(|wc| (wc.wr_id, wc.status)));
    assert!(!done.contains_key(&1), "the Read was answered");
    ea.qp.abort();
    assert!(ea.qp.wait_closed(T), "the aborted QP is in the error state");
    let deadline = std::time::Instant::now() + T;
    while done.len() < 1 + WRITES as usize {
        assert!(std::time::Instant::now() < deadline, "completions {done:?}");
        let n = ea.scq.poll(&mut wcs);
        done.extend(wcs[..n].iter().map(|wc| (wc.wr_id, wc.status)));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(done[&1], WcStatus::Flushed, "the Read flushed");
    let flushed = done.values().filter(|s| **s == WcStatus::Flushed).count();
    assert!(
        flushed > 1,
        "the writes the peer never took flushed: {done:?}"
    );
}
