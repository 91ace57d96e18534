//! Traces cut to their headers (`--trace-snap`) stay small and still decode: the same run
//! traced whole by the target and snapped by the initiator, with both digests on, gives the
//! analyzer the same PDUs, commands and data bytes.

use std::path::PathBuf;
use std::time::Duration;

use analyze::stats::{self, StatsOptions};
use analyze::{analyze_file, Analysis, Options};
use bytes::Bytes;
use iscsi_initiator::{IscsiUrl, SessionConfig, TraceFile};
use pcap_trace::PduTrace;

const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
nop_interval_secs = 0

[[target]]
name = "iqn.2026-11.org.ironsan:snap"
header_digest = "required"
data_digest = "required"
[target.lun.0]
size = "16MiB"
backend = "memory"
"#;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ironsan-snap-{}-{name}", std::process::id()))
}

fn data_bytes(a: &Analysis) -> u64 {
    stats::commands(a, &StatsOptions::default())
        .iter()
        .map(|c| c.data_in_bytes + c.data_out_bytes)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headers_only_trace_decodes_like_the_whole_one() {
    let (whole, snapped) = (temp("target.pcapng"), temp("initiator.pcapng"));
    let run = async {
        let config = iscsi_target::Config::parse(CONFIG, "snap.toml").expect("config");
        let bound = transports::bind_target(config).await.expect("bind");
        let addr = bound.local_addrs()[0];
        let target_trace = PduTrace::create(&whole).expect("trace file");
        bound.trace_to(target_trace.clone());
        tokio::spawn(bound.serve());
        let url = IscsiUrl::parse_lun(&format!(
            "iscsi://{addr}/iqn.2026-11.org.ironsan:snap/0?header_digest=crc32c&data_digest=crc32c"
        ))
        .expect("url");
        let trace = TraceFile(PduTrace::create(&snapped).expect("trace file").with_snap(0));
        let cfg = SessionConfig {
            trace: Some(trace.clone()),
            ..SessionConfig::from_url(&url)
        };
        let s = transports::connect_session(&url, cfg).await.expect("login");
        let data = Bytes::from(
            (0..4u32 << 20)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<u8>>(),
        );
        for i in 0..4u64 {
            s.write(0, i * 2048, 512, data.slice(..1 << 20))
                .await
                .expect("write");
            let back = s.read(0, i * 2048, 2048, 512).await.expect("read");
            assert!(back == data.slice(..1 << 20));
        }
        s.logout().await.expect("logout");
        tokio::time::sleep(Duration::from_millis(100)).await;
        trace.flush().expect("flush");
        target_trace.flush().expect("flush");
    };
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("in time");
    let opts = Options::default();
    let (a, b) = (
        analyze_file(&whole, &opts).expect("whole trace"),
        analyze_file(&snapped, &opts).expect("snapped trace"),
    );
    assert_eq!(a.pdus.len(), b.pdus.len(), "the same PDUs");
    // Each end saw the two directions interleave a little differently: compare per direction.
    let opcodes = |x: &Analysis, to_target: bool| {
        x.pdus
            .iter()
            .filter(|p| (p.opcode < 0x20) == to_target)
            .map(|p| p.opcode)
            .collect::<Vec<u8>>()
    };
    for dir in [true, false] {
        assert_eq!(opcodes(&a, dir), opcodes(&b, dir));
    }
    assert_eq!(data_bytes(&a), 8 << 20, "4 MiB written and read");
    assert_eq!(data_bytes(&b), data_bytes(&a));
    let (sa, sb) = (
        std::fs::metadata(&whole).unwrap().len(),
        std::fs::metadata(&snapped).unwrap().len(),
    );
    assert!(sb * 50 < sa, "snapped {sb} bytes, whole {sa}");
    let _ = std::fs::remove_file(&whole);
    let _ = std::fs::remove_file(&snapped);
}
