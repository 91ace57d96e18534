//! The RNIC's listener against clients that misbehave: silent, half a Request, port probes,
//! garbage, one byte at a time, 2,000 idle connections. None of them delays or fails a real
//! client, each is dropped in time, and the rping server outlives them all. A completion queue
//! that overflows is an error its owner sees; no completion is lost.

mod common;

use common::wait_wc;
use rdma::*;
use rdma_tools::rping;
use rnic::{Rnic, RnicListener};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Every wait here is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

/// Clients that never finish an MPA Request: one silent, one with half the key, one sending
/// something else, one that connects and closes at once, one trickling a Request a byte at a
/// time. Returns what keeps them open.
fn hostile_clients(addr: SocketAddr) -> (Vec<TcpStream>, std::thread::JoinHandle<()>) {
    let silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"MPA ID R").unwrap();
    let mut other = TcpStream::connect(addr).unwrap();
    other.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(TcpStream::connect(addr).unwrap());
    let slow = std::thread::spawn(move || {
        let Ok(mut s) = TcpStream::connect(addr) else {
            return;
        };
        for b in b"MPA ID Req Frame".iter().take(12) {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    (vec![silent, half, other], slow)
}

fn serve_one_ping_client(
    listener: RnicListener,
) -> std::thread::JoinHandle<std::result::Result<u32, String>> {
    std::thread::spawn(move || {
        let dev = Rnic::new().unwrap();
        let opt = rping::PingOptions {
            timeout: WAIT,
            ..Default::default()
        };
        rping::server(&dev, &listener, &opt, |_| {})
    })
}

fn ping(addr: SocketAddr) -> std::result::Result<rping::PingReport, String> {
    let dev = Rnic::new().unwrap();
    let opt = rping::PingOptions {
        count: 3,
        timeout: WAIT,
        ..Default::default()
    };
    rping::client(&dev, addr, &opt, |_| {})
}

#[test]
fn stalled_probing_and_trickling_clients_delay_no_ping() {
    let srv = Rnic::new().unwrap();
    let listener = srv.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    // The hostile clients connect before the server even asks for a request.
    let (_open, slow) = hostile_clients(addr);
    let server = serve_one_ping_client(listener);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let report = ping(addr).expect("the ping succeeds");
    let took = started.elapsed();
    assert_eq!(report.rtt_us.len(), 3);
    // REQUEST_TIMEOUT is 5 s: a ping queued behind a silent client would take that long.
    assert!(
        took < Duration::from_secs(3),
        "the ping waited {took:?} behind the stalled clients"
    );
    assert_eq!(
        server.join().unwrap(),
        Ok(3),
        "the server served the real client"
    );
    slow.join().unwrap();
}

#[test]
fn a_port_probe_does_not_stop_the_ping_server() {
    let srv = Rnic::new().unwrap();
    let listener = srv.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let server = serve_one_ping_client(listener);
    for _ in 0..3 {
        drop(TcpStream::connect(addr).unwrap());
    }
    std::thread::sleep(Duration::from_millis(200));
    let report = ping(addr).expect("the ping after the probes succeeds");
    assert_eq!(report.rtt_us.len(), 3);
    assert_eq!(server.join().unwrap(), Ok(3));
}

#[test]
fn a_listener_drops_what_never_completes_and_keeps_serving() {
    let srv = Rnic::new().unwrap();
    let listener = srv.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let (_open, slow) = hostile_clients(addr);
    // Nothing complete: no request, and no error either (the failures are logged, not returned).
    assert!(listener
        .get_request(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(listener.pending_requests() >= 3, "the stalled clients wait");
    // Within REQUEST_TIMEOUT (+ margin) every one of them is dropped.
    let deadline = Instant::now() + rnic::REQUEST_TIMEOUT + Duration::from_secs(5);
    while listener.pending_requests() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} connections still pending after the timeout",
            listener.pending_requests()
        );
        assert!(listener
            .get_request(Duration::from_millis(200))
            .unwrap()
            .is_none());
    }
    slow.join().unwrap();
}

#[test]
fn two_thousand_idle_connections_and_a_real_client_at_once() {
    const IDLE: usize = 2000;
    let limit = rdma_tools::raise_nofile_limit();
    // Both ends of every idle connection live in this process, plus the test harness's.
    assert!(
        limit >= 2 * IDLE as u64 + 256,
        "RLIMIT_NOFILE is {limit}: this test needs {} descriptors",
        2 * IDLE + 256
    );
    let srv = Rnic::new().unwrap();
    let listener = srv.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    // The server waits for a request (so the listener accepts) while the idle clients come.
    let server = std::thread::spawn(move || {
        let dev = Rnic::new().unwrap();
        let opt = rping::PingOptions {
            timeout: WAIT,
            ..Default::default()
        };
        let served = rping::server(&dev, &listener, &opt, |_| {});
        (served, listener)
    });
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(addr).expect("idle connection"))
        .collect();
    let started = Instant::now();
    let report = ping(addr).expect("the real client is served");
    assert_eq!(report.rtt_us.len(), 3);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the ping took {:?} among {IDLE} idle connections",
        started.elapsed()
    );
    let (served, listener) = server.join().unwrap();
    assert_eq!(served, Ok(3));
    // The idle ones are dropped once their time is up; their descriptors are freed.
    let deadline = Instant::now() + rnic::REQUEST_TIMEOUT + Duration::from_secs(10);
    while listener.pending_requests() > 0 {
        assert!(Instant::now() < deadline, "idle connections never dropped");
        let _ = listener.get_request(Duration::from_millis(200)).unwrap();
    }
    drop(idle);
}

#[test]
fn an_overflowing_completion_queue_fails_its_qp_and_loses_nothing() {
    let (a, b) = (Rnic::new().unwrap(), Rnic::new().unwrap());
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    // The receiver's completions go to a CQ of depth 4 nobody polls while 8 Sends arrive.
    let small = b.create_cq(4, None).unwrap();
    let bscq = b.create_cq(64, None).unwrap();
    let qp = b
        .create_qp(
            &pdb,
            &bscq,
            &small,
            QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_sge: 1,
            },
        )
        .unwrap();
    let listener = b.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let rmr = b.reg_mr(&pdb, 8 * 64, Access::LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        qp.post_recv(RecvWr {
            wr_id: 100 + i,
            sges: vec![rmr.sge(i as usize * 64, 64)],
        })
        .unwrap();
    }
    let scq = a.create_cq(64, None).unwrap();
    let sqp = a
        .create_qp(
            &pda,
            &scq,
            &scq,
            QpCaps {
                max_send_wr: 16,
                max_recv_wr: 4,
                max_sge: 1,
            },
        )
        .unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let req = listener.get_request(WAIT).unwrap().expect("a request");
            req.accept(&qp, &ConnParams::default()).unwrap();
        });
        sqp.connect(addr, &ConnParams::default()).unwrap();
        h.join().unwrap();
    });
    let smr = a.reg_mr(&pda, 64, Access::NONE).unwrap();
    for i in 0..8u64 {
        sqp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Send,
            sges: vec![smr.sge(0, 64)],
            signaled: false,
        })
        .unwrap();
    }
    // The receiver's QP is moved to the error state by the overrun.
    let deadline = Instant::now() + WAIT;
    while qp.state() != QpState::Error {
        assert!(Instant::now() < deadline, "the QP never left RTS");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(small.overrun());
    assert!(
        qp.last_error().is_some_and(|e| e.contains("overrun")),
        "{:?}",
        qp.last_error()
    );
    // Every posted receive completes exactly once (received or flushed), and the overrun is
    // among the completions, right after the first that did not fit.
    let mut seen = Vec::new();
    let mut overruns = 0;
    let deadline = Instant::now() + WAIT;
    while seen.len() < 8 {
        assert!(Instant::now() < deadline, "completions missing: {seen:?}");
        let wc = wait_wc(&small, WAIT);
        match wc.status {
            WcStatus::CqOverrun => {
                if overruns == 0 {
                    assert_eq!(seen.len(), 5, "the overrun follows the fifth completion");
                }
                overruns += 1;
            }
            WcStatus::Success | WcStatus::Flushed => seen.push(wc.wr_id),
            other => panic!("unexpected completion status {other:?}"),
        }
    }
    assert!(overruns >= 1, "the overrun is reported");
    seen.sort_unstable();
    assert_eq!(seen, (100..108).collect::<Vec<_>>(), "no completion lost");
}
