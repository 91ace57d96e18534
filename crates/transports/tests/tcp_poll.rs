//! iSCSI/TCP with its readers polling the socket after each PDU (`tcp_poll_us` on the target,
//! `?tcp_poll_us=` on the initiator's URL), against the target started in-process: every
//! combination of polling on and off at the two ends moves data both ways unchanged, and an
//! idle connection with polling on at both ends does not spin.

use std::net::SocketAddr;
use std::time::Duration;

use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use test_support::random_bytes;

async fn target(poll_us: u64) -> SocketAddr {
    test_support::start_target(&format!(
        r#"
portals = ["127.0.0.1:0"]
tcp_poll_us = {poll_us}

[[target]]
name = "iqn.2026-11.org.ironsan:poll"
[target.lun.0]
size = "16MiB"
backend = "memory"
"#
    ))
    .await
}

async fn session(addr: SocketAddr, poll_us: u64) -> Session {
    let url = IscsiUrl::parse_lun(&format!(
        "iscsi://{addr}/iqn.2026-11.org.ironsan:poll/0?tcp_poll_us={poll_us}"
    ))
    .unwrap();
    let cfg = SessionConfig::from_url(&url);
    assert_eq!(cfg.tcp_poll, Duration::from_micros(poll_us));
    transports::connect_session(&url, cfg).await.unwrap()
}

/// Writes `len` bytes at `lba` and reads them back, 4 KiB commands one at a time then one
/// large command, comparing every byte.
async fn round_trip(s: &Session, lba: u64, seed: u64) {
    let lun = s.default_lun();
    let cap = s.capacity(lun).await.unwrap();
    let bs = cap.block_size as usize;
    for i in 0..16u64 {
        let data = random_bytes(4096, seed + i);
        let at = lba + i * (4096 / bs) as u64;
        s.write(lun, at, cap.block_size, data.clone())
            .await
            .unwrap();
        let back = s
            .read(lun, at, (4096 / bs) as u32, cap.block_size)
            .await
            .unwrap();
        assert_eq!(back, data, "4 KiB block {i}");
    }
    let data = random_bytes(1 << 20, seed);
    s.write(lun, lba, cap.block_size, data.clone())
        .await
        .unwrap();
    let back = s
        .read(lun, lba, ((1 << 20) / bs) as u32, cap.block_size)
        .await
        .unwrap();
    assert!(back == data, "1 MiB read back unchanged");
}

/// User plus system CPU seconds of this process (from /proc, in 10 ms ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let tick = |i: usize| fields[i].parse::<f64>().unwrap();
    (tick(11) + tick(12)) / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_on_or_off_at_either_end_moves_data_unchanged_and_idles_without_spinning() {
    for (i, target_poll) in [0u64, 50].into_iter().enumerate() {
        let addr = target(target_poll).await;
        for (j, initiator_poll) in [0u64, 50].into_iter().enumerate() {
            let s = session(addr, initiator_poll).await;
            round_trip(&s, (i * 2 + j) as u64 * 4096, 100 * (i * 2 + j) as u64).await;
            s.logout().await.unwrap();
        }
    }
    // Both ends polling (a generous window), then idle: the readers stop polling one window
    // after the last PDU, so a second of idleness costs next to no CPU.
    let addr = target(1000).await;
    let s = session(addr, 1000).await;
    round_trip(&s, 0, 7).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spent = cpu_seconds() - before;
    assert!(spent < 0.25, "{spent} CPU seconds in 1 s of idleness");
    round_trip(&s, 8192, 8).await;
    s.logout().await.unwrap();
}
