//! Memory stays bounded: with 100 idle sessions, and with a client that sends READs and never
//! reads the answers. Its own test binary, so the resident set measured is the target's (and
//! this test's), not other tests'.

use std::time::Duration;
use test_support::raw_tcp::*;

fn resident_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / (1 << 20) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_and_a_client_that_never_reads_stay_bounded() {
    let addr = start_target("queue_depth = 16").await;
    healthy_session(addr, 0, 1).await;
    let base = resident_mib();

    // 100 idle sessions.
    let mut idle = Vec::new();
    for i in 0..100u32 {
        let mut c = RawConn::connect(addr).await;
        c.isid[4] = (i >> 8) as u8;
        c.isid[5] = i as u8;
        c.login(1, &plain_keys()).await;
        idle.push(c);
    }
    let with_idle = resident_mib();
    let per_session_kib = (with_idle - base) * 1024.0 / 100.0;
    println!("100 idle sessions: {base:.1} -> {with_idle:.1} MiB ({per_session_kib:.0} KiB each)");
    assert!(
        with_idle - base < 64.0,
        "100 idle sessions cost {:.1} MiB",
        with_idle - base
    );

    // A client that sends 2000 one-MiB READs (CmdSN ever increasing) and never reads.
    let mut hog = RawConn::connect(addr).await;
    hog.isid = [0x80, 0, 0, 0xee, 0xee, 0xee];
    hog.login(1, &plain_keys()).await;
    let mut burst = Vec::new();
    for _ in 0..2000 {
        let b = hog.scsi_bhs(&read10(0, 2048), 1 << 20, 0, 0);
        burst.extend_from_slice(&b);
    }
    hog.send_raw(&burst).await;
    // Give the target time to execute what its window admits and to fill the socket.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with_hog = resident_mib();
    println!(
        "non-reading client with 2000 x 1 MiB READs queued: {with_idle:.1} -> {with_hog:.1} MiB"
    );
    // Unbounded would be ~2 GiB; the window (16) bounds it to tens of MiB plus socket buffers.
    assert!(
        with_hog - with_idle < 160.0,
        "a non-reading client grew the target by {:.1} MiB",
        with_hog - with_idle
    );

    // Everyone else is still served: every idle session answers a ping, and new work runs.
    for c in idle.iter_mut() {
        let echo = c.ping(b"ping").await;
        assert_eq!(echo.data, b"ping");
    }
    roundtrip(&mut idle[0], 64, 16, 3).await;
    healthy_session(addr, 128, 4).await;

    // Now drain the hog: only what the CmdSN window admitted was executed; the rest of the
    // 2000 commands were outside the window and dropped, so nothing piled up.
    let mut answered = 0;
    let mut data_bytes = 0usize;
    for _ in 0..200_000 {
        let Some(r) = hog.recv_within(Duration::from_secs(1)).await else {
            break;
        };
        if r.opcode() == 0x25 {
            data_bytes += r.data.len();
        }
        if r.opcode() == 0x21 || (r.opcode() == 0x25 && r.bhs[1] & 0x01 != 0) {
            answered += 1;
        }
    }
    println!("non-reading client: {answered} of 2000 READs answered ({data_bytes} bytes)");
    assert!(answered >= 1, "the window's commands were executed");
    assert!(
        answered <= 64,
        "{answered} commands ran: more than the window admits"
    );

    // The hog goes away; the target frees its tasks (a new session still works after).
    drop(hog);
    tokio::time::sleep(Duration::from_millis(500)).await;
    healthy_session(addr, 256, 5).await;
}
