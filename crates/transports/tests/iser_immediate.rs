//! Immediate data over iSER, end to end on the software RNIC: a write that fits the command's
//! Send (ImmediateData=Yes, within the target's TargetRecvDataSegmentLength and
//! FirstBurstLength, 16 KiB) travels in it and costs the target no RDMA Read; a larger one is fetched
//! by RDMA Read; and with immediate data switched off (`SessionConfig::immediate_data`) a small
//! write is fetched too. Every write reads back verified. Alone in its test binary: the RDMA
//! Read count is the process's.

use std::time::Duration;

use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use test_support::random_bytes;

const CONFIG: &str = r#"
portals = ["iser://127.0.0.1:PORT"]
queue_depth = 32

[[target]]
name = "iqn.2026-11.org.ironsan:immediate"
[target.lun.0]
size = "16MiB"
backend = "memory"
"#;

/// RDMA Reads the target has posted so far.
fn rdma_reads() -> u64 {
    datamover_iser::stats::snapshot().rdma_reads
}

/// Writes `len` bytes at `lba` and reads them back; the RDMA Reads the write cost.
async fn write_counting_reads(s: &Session, lba: u64, len: usize, seed: u64) -> u64 {
    let data = random_bytes(len, seed);
    let before = rdma_reads();
    s.write(0, lba, 512, data.clone()).await.expect("write");
    let reads = rdma_reads() - before;
    let back = s.read(0, lba, (len / 512) as u32, 512).await.expect("read");
    assert!(back == data, "{len} bytes at LBA {lba}: read back differs");
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_ride_in_the_command_send() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let port = test_support::target::free_port();
        let addr = test_support::start_target(&CONFIG.replace("PORT", &port.to_string())).await;
        let u = IscsiUrl::parse_lun(&format!(
            "iser://{addr}/iqn.2026-11.org.ironsan:immediate/0"
        ))
        .expect("url");

        let s = test_support::connect(&u).await.expect("iSER login");
        // Up to the target's TargetRecvDataSegmentLength (16 KiB), whole in the Send.
        for (k, len) in [512, 4096, 16384].into_iter().enumerate() {
            let reads = write_counting_reads(&s, 8 * k as u64 * 16, len, k as u64).await;
            assert_eq!(reads, 0, "a {len}-byte write came as immediate data");
        }
        let reads = write_counting_reads(&s, 1000, 64 << 10, 9).await;
        assert!(reads >= 1, "a 64 KiB write is fetched by RDMA Read");
        s.logout().await.unwrap();

        let mut cfg = SessionConfig::from_url(&u);
        cfg.immediate_data = false;
        cfg.initial_r2t = true;
        let s = transports::connect_session(&u, cfg)
            .await
            .expect("login without immediate data");
        let reads = write_counting_reads(&s, 2000, 4096, 20).await;
        assert_eq!(
            reads, 1,
            "without immediate data a 4 KiB write is one RDMA Read"
        );
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}
