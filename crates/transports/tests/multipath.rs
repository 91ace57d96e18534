//! Multipath sessions against two targets in this process, on two loopback ports, serving
//! one file as the same LUN (same NAA and serial): gateways of one logical unit. A verifying
//! workload runs while the first gateway is stopped and started again; paths that show
//! different LUs are refused; with every path gone, commands wait their time and fail.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iscsi_initiator::{AluaState, IscsiUrl, MultipathConfig, Session, SessionConfig};
use iscsi_target::Config;

const IQN: &str = "iqn.2026-11.org.ironsan:gateways";
const NAA: &str = "0x600140500000000000000000000000aa";

/// A running gateway: its target and the task serving it.
struct Gateway {
    target: Arc<iscsi_target::Target>,
    serving: tokio::task::JoinHandle<()>,
    addr: SocketAddr,
}

fn lun_keys(file: &Path, naa: &str) -> String {
    format!(
        "size = \"8MiB\"\nbackend = {{ type = \"file\", path = \"{}\", create = true }}\nserial = \"MP-0001\"\nwwn = \"{naa}\"\nio = \"threads\"",
        file.display()
    )
}

/// Serves `lun` (TOML keys of LUN 0) on `port` of loopback (0: any); a port just freed by a
/// stopped gateway may take a moment to bind again (bounded).
async fn gateway(port: u16, lun: &str) -> Gateway {
    let text =
        test_support::target::one_lun_config(&format!("[\"127.0.0.1:{port}\"]"), "", IQN, "", lun);
    let mut last = String::new();
    for _ in 0..50 {
        let config = Config::parse(&text, "test.toml").expect("config");
        match transports::bind_target(config).await {
            Ok(bound) => {
                let addr = bound.local_addrs()[0];
                let target = bound.target();
                let serving = tokio::spawn(bound.serve());
                return Gateway {
                    target,
                    serving,
                    addr,
                };
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot serve on port {port}: {last}");
}

impl Gateway {
    /// Stops it as a crashed gateway would look: sessions closed, portal closed.
    async fn stop(self) {
        self.target.shutdown(Duration::ZERO).await;
        tokio::time::timeout(Duration::from_secs(10), self.serving)
            .await
            .expect("the gateway stops")
            .expect("serve task");
    }
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ironsan-mpath-{}-{name}.img", std::process::id()))
}

fn url_of(addrs: &[SocketAddr]) -> IscsiUrl {
    let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    IscsiUrl::parse_lun(&format!("iscsi://{}/{IQN}/0", list.join(","))).expect("url")
}

async fn connect(url: &IscsiUrl, mp: MultipathConfig) -> Result<Session, iscsi_initiator::Error> {
    let mut cfg = SessionConfig::from_url(url);
    cfg.multipath = mp;
    transports::connect_session(url, cfg).await
}

fn quick() -> MultipathConfig {
    MultipathConfig {
        no_path_retry: Duration::from_secs(20),
        command_timeout: Duration::from_secs(10),
        check_interval: Duration::from_millis(200),
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(400),
    }
}

/// Waits (bounded) until `f` holds of the session's paths.
async fn until(s: &Session, what: &str, f: impl Fn(&[iscsi_initiator::PathStatus]) -> bool) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if f(&s.paths()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within 15 s: {:?}", s.paths());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_and_restarted_under_a_verifying_workload() {
    tokio::time::timeout(Duration::from_secs(90), async {
        test_support::target::log_from_env();
        let file = scratch("shared");
        let _ = std::fs::remove_file(&file);
        let lun = lun_keys(&file, NAA);
        let a = gateway(0, &lun).await;
        let b = gateway(0, &lun).await;
        let (a_addr, b_addr) = (a.addr, b.addr);
        let url = url_of(&[a_addr, b_addr]);
        let session = Arc::new(connect(&url, quick()).await.expect("multipath login"));
        let paths = session.paths();
        assert_eq!(paths.len(), 2);
        assert!(
            paths
                .iter()
                .all(|p| p.up && p.state == Some(AluaState::ActiveOptimized)),
            "{paths:?}"
        );
        assert_eq!(session.connection_count(), 2);
        let cap = session.capacity(0).await.expect("capacity");
        assert_eq!(cap.bytes(), 8 << 20);

        let w = bench::workload::Workload {
            rw: bench::workload::Rw::Mixed { read_pct: 50 },
            pattern: bench::workload::Pattern::Rand,
            size: 4096,
            qd: 8,
            duration: Some(Duration::from_secs(5)),
            count: None,
            span: Some(2 << 20),
            verify: true,
            seed: 11,
        };
        let running = tokio::spawn({
            let s = session.clone();
            async move {
                let progress = Arc::new(bench::workload::Progress::default());
                bench::workload::run(&[s], 0, cap, &w, progress).await
            }
        });
        tokio::time::sleep(Duration::from_millis(800)).await;
        let on_a = session.paths()[0].commands;
        assert!(
            on_a > 0,
            "the first path carries the traffic: {:?}",
            session.paths()
        );
        let on_b = session.paths()[1].commands;

        a.stop().await;
        until(&session, "A down", |p| !p[0].up).await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(
            session.paths()[1].commands > on_b,
            "B took the traffic: {:?}",
            session.paths()
        );

        let a = gateway(a_addr.port(), &lun).await;
        until(&session, "A back", |p| p[0].up).await;
        let back = session.paths()[0].commands;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            session.paths()[0].commands > back,
            "traffic returns to A: {:?}",
            session.paths()
        );

        let summary = running
            .await
            .expect("workload task")
            .expect("no error reaches the caller");
        assert!(
            summary.verified_bytes > 0 && summary.writes > 0,
            "{summary:?}"
        );
        let session = Arc::into_inner(session).expect("the workload let go of the session");
        session.logout().await.expect("logout of both paths");
        a.stop().await;
        b.stop().await;
        let _ = std::fs::remove_file(&file);
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_showing_different_lus_are_refused() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let (fa, fb) = (scratch("naa-a"), scratch("naa-b"));
        let a = gateway(0, &lun_keys(&fa, NAA)).await;
        let b = gateway(0, &lun_keys(&fb, "0x600140500000000000000000000000bb")).await;
        let e = connect(&url_of(&[a.addr, b.addr]), quick())
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("different logical units") && e.contains("NAA"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        a.stop().await;
        b.stop().await;
        let _ = std::fs::remove_file(&fa);
        let _ = std::fs::remove_file(&fb);
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_path_commands_wait_their_time_then_fail() {
    tokio::time::timeout(Duration::from_secs(60), async {
        // Nothing listens: the login itself fails, naming each path.
        let nowhere = url_of(&[
            SocketAddr::from(([127, 0, 0, 1], test_support::target::free_port())),
            SocketAddr::from(([127, 0, 0, 1], test_support::target::free_port())),
        ]);
        let e = connect(&nowhere, quick())
            .await
            .err()
            .expect("no path")
            .to_string();
        assert!(e.contains("no path") && !e.contains('\n'), "{e}");

        let file = scratch("gone");
        let lun = lun_keys(&file, NAA);
        let a = gateway(0, &lun).await;
        let b = gateway(0, &lun).await;
        let mp = MultipathConfig {
            no_path_retry: Duration::from_secs(1),
            ..quick()
        };
        let s = connect(&url_of(&[a.addr, b.addr]), mp)
            .await
            .expect("login");
        s.test_unit_ready(0).await.expect("TEST UNIT READY");
        a.stop().await;
        b.stop().await;
        let t0 = Instant::now();
        let e = s.read(0, 0, 8, 512).await.expect_err("no path").to_string();
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        assert!(e.contains("no usable path") && e.contains("down"), "{e}");
        drop(s);
        let _ = std::fs::remove_file(&file);
    })
    .await
    .expect("in time");
}
