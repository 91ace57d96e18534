//! The access generator against an ironsan target in this process: what it writes, it reads
//! back and verifies, sequential and random, reads, writes and a mix.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bench::workload::{self, Pattern, Progress, Rw, Workload};
use iscsi_initiator::IscsiUrl;

const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
queue_depth = 64

[[target]]
name = "iqn.2026-11.org.ironsan:plain"
[target.lun.0]
size = "64MiB"
backend = "memory"
"#;

async fn start_target() -> SocketAddr {
    test_support::start_target(CONFIG).await
}

fn url(addr: SocketAddr) -> IscsiUrl {
    IscsiUrl::parse_lun(&format!("iscsi://{addr}/iqn.2026-11.org.ironsan:plain/0")).expect("url")
}

fn timeout<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(60), f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_verifies_what_it_wrote() {
    timeout(async {
        let addr = start_target().await;
        let u = url(addr);
        let s = Arc::new(test_support::connect(&u).await.unwrap());
        s.test_unit_ready(0).await.unwrap();
        let cap = s.capacity(0).await.unwrap();
        for (rw, pattern) in [
            (Rw::Write, Pattern::Seq),
            (Rw::Read, Pattern::Rand),
            (Rw::Mixed { read_pct: 50 }, Pattern::Rand),
        ] {
            let w = Workload {
                rw,
                pattern,
                size: 64 * 1024,
                qd: 8,
                duration: None,
                count: Some(200),
                span: Some(4 << 20),
                verify: true,
                seed: 42,
            };
            let r = workload::run(
                std::slice::from_ref(&s),
                0,
                cap,
                &w,
                Arc::new(Progress::default()),
            )
            .await
            .unwrap();
            assert_eq!(r.ops, 200);
            assert!(r.verified_bytes > 0, "{rw:?}: nothing verified");
            assert!(r.lat_p50_us <= r.lat_p99_us && r.lat_p99_us <= r.lat_max_us);
        }
        // Random writes over a region of 16 chunks at QD 16: each chunk is written many
        // times, sometimes with another write to it queued; every chunk written must read
        // back as its latest write.
        let w = Workload {
            rw: Rw::Write,
            pattern: Pattern::Rand,
            size: 64 * 1024,
            qd: 16,
            duration: None,
            count: Some(400),
            span: Some(1 << 20),
            verify: true,
            seed: 43,
        };
        let r = workload::run(
            std::slice::from_ref(&s),
            0,
            cap,
            &w,
            Arc::new(Progress::default()),
        )
        .await
        .unwrap();
        assert!(r.writes >= 300, "{} writes", r.writes);
        assert_eq!(
            r.verified_bytes,
            1 << 20,
            "all 16 chunks written and verified"
        );
    })
    .await
    .expect("in time");
}
