//! Portals no client can stall or kill, and the configured limits on sessions and connections.
//! The iSCSI/TCP portal and the portal serving iSER and iSCSI/TCP on one port each accept the
//! next client while others stall: 2,000 idle connections, port probes (connect + close), a
//! client that sends half a PDU and stops, one that sends a byte a second; a real session logs
//! in and moves verified data meanwhile. A login past `max_sessions`, `max_connections` or
//! `max_connections_per_initiator` is refused with RFC 7143's status (0x0302 Out of resources,
//! 0x0206 Too many connections), and other sessions carry on. A connection naming a session's
//! TSIH with another ISID is refused (0x020a Session does not exist).

use test_support::raw_tcp::*;

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn start_with(portals: &str, extra: &str) -> SocketAddr {
    let lun = "size = \"64MiB\"\nbackend = \"memory\"";
    test_support::start_target(&test_support::one_lun_config(portals, extra, IQN, "", lun)).await
}

/// 2,000 idle connections, probes, a half PDU and a trickling client against the portal at
/// `addr`, then a real session (login, write, read back) within a few seconds.
async fn survives_hostile_clients(addr: SocketAddr) {
    const IDLE: usize = 2000;
    let limit = rdma_tools::raise_nofile_limit();
    assert!(
        limit >= 2 * IDLE as u64 + 256,
        "RLIMIT_NOFILE is {limit}: this test needs {} descriptors",
        2 * IDLE + 256
    );
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        let c = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("an idle connection in time")
            .expect("an idle connection");
        idle.push(c);
    }
    for _ in 0..10 {
        drop(TcpStream::connect(addr).await.expect("a probe"));
    }
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&[0x43, 0x87, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let slow = tokio::spawn(async move {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            return;
        };
        for b in [0x43u8, 0x87, 0, 0, 0, 0, 0, 0, 0, 0] {
            if s.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let started = Instant::now();
    tokio::time::timeout(WAIT, healthy_session(addr, 8, 7))
        .await
        .expect("a real session among 2,000 idle connections in time");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the real session took {:?}",
        started.elapsed()
    );
    // And again, once more with the hostile ones still there.
    tokio::time::timeout(WAIT, healthy_session(addr, 16, 9))
        .await
        .expect("a second session in time");
    slow.abort();
    drop((idle, half));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iscsi_tcp_portal_serves_a_client_among_hostile_ones() {
    let addr = start_with("[\"127.0.0.1:0\"]", "").await;
    survives_hostile_clients(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_iser_and_tcp_portal_serves_a_client_among_hostile_ones() {
    let addr = start_with("[\"tcp://127.0.0.1:0\", \"iser://127.0.0.1:0\"]", "").await;
    survives_hostile_clients(addr).await;
}

/// Logs in (security stage, then operational stage to full feature phase) as `initiator` with
/// ISID `isid_tail`; returns the status (class, detail) of the Login Response that refused
/// it, or of the final one, and the conn.
async fn login_as(
    addr: SocketAddr,
    initiator: &str,
    isid_tail: u8,
    tsih: u16,
    cid: u16,
) -> ([u8; 2], RawConn) {
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = isid_tail;
    c.tsih = tsih;
    c.cid = cid;
    let first = [
        ("InitiatorName", initiator),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
        ("AuthMethod", "None"),
    ];
    let r = c.login_request(0, 1, true, &key_values(&first)).await;
    assert_eq!(r.opcode(), 0x23, "login response");
    if login_status(&r) != OK {
        return (login_status(&r), c);
    }
    c.took_login_response(&r);
    (c.operational_stage(&plain_keys()).await, c)
}

const OK: [u8; 2] = [0, 0];
const OUT_OF_RESOURCES: [u8; 2] = [3, 2];
const TOO_MANY_CONNECTIONS: [u8; 2] = [2, 6];
const A: &str = "iqn.2026-11.org.ironsan.test:a";
const B: &str = "iqn.2026-11.org.ironsan.test:b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_refuses_one_more_with_out_of_resources() {
    let addr = start_target("max_sessions = 2").await;
    let (s1, _c1) = login_as(addr, A, 1, 0, 1).await;
    let (s2, _c2) = login_as(addr, B, 2, 0, 1).await;
    assert_eq!((s1, s2), (OK, OK));
    let (s3, mut c3) = login_as(addr, A, 3, 0, 1).await;
    assert_eq!(s3, OUT_OF_RESOURCES, "a third session is refused");
    assert!(
        c3.closed_by_target(0).await,
        "the refused connection is closed"
    );
    // Reinstating an existing session (same initiator and ISID) is no new session.
    let (again, mut c1b) = login_as(addr, A, 1, 0, 1).await;
    assert_eq!(again, OK, "session reinstatement is allowed at the limit");
    roundtrip(&mut c1b, 0, 8, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_refuses_one_more_with_out_of_resources() {
    let addr = start_target("max_connections = 2").await;
    let (s1, mut c1) = login_as(addr, A, 1, 0, 1).await;
    assert_eq!(s1, OK);
    // A second connection of the same session, then a third connection anywhere.
    let (s2, _c2) = login_as(addr, A, 1, c1.tsih, 2).await;
    assert_eq!(s2, OK);
    let (s3, _) = login_as(addr, B, 2, 0, 1).await;
    assert_eq!(s3, OUT_OF_RESOURCES, "a new session's connection");
    let (s4, _) = login_as(addr, A, 1, c1.tsih, 3).await;
    assert_eq!(s4, OUT_OF_RESOURCES, "a third connection of the session");
    // Replacing connection 2 (same CID: connection reinstatement) adds none.
    let (s5, _c2b) = login_as(addr, A, 1, c1.tsih, 2).await;
    assert_eq!(s5, OK, "connection reinstatement is allowed at the limit");
    roundtrip(&mut c1, 0, 8, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_per_initiator_refuses_with_too_many_connections() {
    let addr = start_target("max_connections_per_initiator = 1").await;
    let (s1, mut c1) = login_as(addr, A, 1, 0, 1).await;
    assert_eq!(s1, OK);
    let (s2, mut c2) = login_as(addr, A, 2, 0, 1).await;
    assert_eq!(s2, TOO_MANY_CONNECTIONS, "A's second session");
    assert!(c2.closed_by_target(0).await);
    let (s3, _) = login_as(addr, A, 1, c1.tsih, 2).await;
    assert_eq!(
        s3, TOO_MANY_CONNECTIONS,
        "A's second connection in its session"
    );
    // Another initiator is not affected, and A's session still works.
    let (s4, mut c4) = login_as(addr, B, 1, 0, 1).await;
    assert_eq!(s4, OK);
    roundtrip(&mut c4, 64, 8, 4).await;
    roundtrip(&mut c1, 0, 8, 3).await;
}

const SESSION_DOES_NOT_EXIST: [u8; 2] = [2, 0x0a];

/// A connection joining a session must carry that session's ISID: with the same initiator
/// name, target, TSIH and CID but another ISID it names no session (0x020a), so it cannot
/// take over the session's connection, and the session carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_session_with_another_isid_is_refused() {
    let addr = start_target("").await;
    let (s1, mut c1) = login_as(addr, A, 1, 0, 1).await;
    assert_eq!(s1, OK);
    let (s2, mut c2) = login_as(addr, A, 2, c1.tsih, 1).await;
    assert_eq!(s2, SESSION_DOES_NOT_EXIST, "another ISID with the TSIH");
    assert!(
        c2.closed_by_target(0).await,
        "the refused connection is closed"
    );
    roundtrip(&mut c1, 0, 8, 5).await;
    // The session's own ISID still joins it.
    let (s3, mut c3) = login_as(addr, A, 1, c1.tsih, 2).await;
    assert_eq!(s3, OK, "the session's ISID joins");
    roundtrip(&mut c3, 64, 8, 6).await;
    // CmdSN is session-wide: c1 goes on from where c3 left it.
    c1.cmd_sn = c3.cmd_sn;
    roundtrip(&mut c1, 0, 8, 7).await;
}

#[test]
fn a_zero_limit_is_a_config_error_naming_the_line() {
    let e = iscsi_target::Config::parse("queue_depth = 8\nmax_sessions = 0\n", "x.toml")
        .unwrap_err()
        .0;
    assert!(
        e.starts_with("x.toml:2:") && e.contains("max_sessions"),
        "{e}"
    );
}

/// With `max_pending_logins = 16`, 40 idle connections leave 16 open: each one past the cap
/// drops the one that has waited longest. A real session logs in meanwhile.
async fn pending_logins_are_capped(portals: &str) {
    let addr = start_with(portals, "max_pending_logins = 16").await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(RawConn::connect(addr).await);
    }
    let mut closed = 0;
    for c in idle.iter_mut().take(24) {
        if c.closed_by_target(0).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 24, "the 24 longest waiting were dropped");
    tokio::time::timeout(WAIT, healthy_session(addr, 8, 3))
        .await
        .expect("a real session past the cap in time");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tcp_portal_caps_connections_logging_in() {
    pending_logins_are_capped("[\"127.0.0.1:0\"]").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_portal_caps_connections_being_sorted() {
    pending_logins_are_capped("[\"tcp://127.0.0.1:0\", \"iser://127.0.0.1:0\"]").await;
}

/// A Login Request trickled a byte at a time (each byte well inside the per-PDU wait) is cut
/// off at `login_deadline_secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_that_drags_on_is_cut_at_the_deadline() {
    let addr = start_with("[\"127.0.0.1:0\"]", "login_deadline_secs = 2").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let mut cut = false;
    for b in [0x43u8, 0x87, 0, 0, 0, 0, 0, 0].iter().cycle().take(40) {
        if s.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut buf = [0u8; 1];
    use tokio::io::AsyncReadExt;
    let eof = matches!(
        tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    );
    assert!(cut || eof, "the trickling login was not cut off");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "cut at the 2 s deadline, not the 15 s per-PDU wait ({:?})",
        started.elapsed()
    );
}
