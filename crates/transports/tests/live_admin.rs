//! A running target changed live (iscsi-target's admin API), seen over loopback by the
//! project's initiator and by the raw test initiator: targets added and removed, an ACL
//! that refuses a new login, a LUN made read-only, a LUN resized, sessions listed and asked
//! to log out, and whole configurations applied (or refused, changing nothing).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iscsi_initiator::scsi::Sense;
use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use iscsi_target::config::TargetConfig;
use iscsi_target::{Config, Target};

const A: &str = "iqn.2026-11.org.ironsan:admin-a";
const B: &str = "iqn.2026-11.org.ironsan:admin-b";
const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
[[target]]
name = "iqn.2026-11.org.ironsan:admin-a"
[target.lun.0]
size = "4MiB"
backend = "memory"
"#;

const T: Duration = Duration::from_secs(30);
const TUR: [u8; 6] = [0; 6];
const READ_CAPACITY_10: [u8; 10] = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];

async fn start() -> (std::net::SocketAddr, Arc<Target>) {
    test_support::target::log_from_env();
    test_support::target::serve(Config::parse(CONFIG, "test.toml").expect("config")).await
}

async fn login_as(
    addr: std::net::SocketAddr,
    target: &str,
    initiator: Option<&str>,
) -> Result<Session, iscsi_initiator::Error> {
    let url = IscsiUrl::parse_lun(&format!("iscsi://{addr}/{target}/0")).unwrap();
    let mut cfg = SessionConfig::from_url(&url);
    if let Some(name) = initiator {
        cfg.initiator_name = name.to_string();
    }
    transports::connect_session(&url, cfg).await
}

async fn login(addr: std::net::SocketAddr, target: &str) -> Session {
    login_as(addr, target, None).await.expect("login")
}

/// (key, ASC, ASCQ) of a command sent as is (no retry on a unit attention); `None`: GOOD.
async fn sense_of(
    s: &Session,
    lun: u16,
    cdb: &[u8],
    read_len: u32,
    out: Bytes,
) -> Option<(u8, u8, u8)> {
    let r = s.raw(lun, cdb, read_len, out).await.expect("answered");
    if r.status == 0 {
        return None;
    }
    assert_eq!(r.status, 2, "CHECK CONDITION");
    let sense = Sense::parse(&r.sense).expect("sense data");
    Some((sense.key, sense.asc, sense.ascq))
}

fn target_table(name: &str, lun_size: &str) -> TargetConfig {
    let text = format!(
        "[[target]]\nname = \"{name}\"\n[target.lun.0]\nsize = \"{lun_size}\"\nbackend = \"memory\"\n"
    );
    Config::parse(&text, "t.toml")
        .expect("table")
        .targets
        .remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_added_live_takes_logins_and_one_removed_loses_its_sessions() {
    tokio::time::timeout(T, async {
        let (addr, target) = start().await;
        assert!(login_as(addr, B, None).await.is_err(), "B is not there yet");
        let a = login(addr, A).await;
        target
            .add_target(target_table(B, "2MiB"))
            .await
            .expect("B added");
        let e = target
            .add_target(target_table(B, "2MiB"))
            .await
            .unwrap_err();
        assert!(e.contains("defined twice"), "{e}");
        let b = login(addr, B).await;
        assert_eq!(b.report_luns().await.unwrap(), vec![0]);
        assert_eq!(b.capacity(0).await.unwrap().bytes(), 2 << 20);
        assert_eq!(target.running_config().targets.len(), 2);

        target.remove_target(B).await.expect("B removed");
        assert!(target.luns(B).is_none());
        assert!(
            b.raw(0, &TUR, 0, Bytes::new()).await.is_err(),
            "B's session was closed"
        );
        assert!(login_as(addr, B, None).await.is_err(), "B is gone");
        assert!(target
            .remove_target(B)
            .await
            .unwrap_err()
            .contains("no target"));
        // A carried on unaware.
        assert_eq!(sense_of(&a, 0, &TUR, 0, Bytes::new()).await, None);
        assert_eq!(target.sessions().len(), 1);
        a.logout().await.expect("logout");
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_change_refuses_new_logins_and_drops_the_sessions_it_leaves_out() {
    tokio::time::timeout(T, async {
        let (addr, target) = start().await;
        let allowed = "iqn.2026-11.org.ironsan:allowed";
        let other = "iqn.2026-11.org.ironsan:other";
        let kept = login_as(addr, A, Some(allowed)).await.expect("login");
        let dropped = login_as(addr, A, Some(other)).await.expect("login");
        target
            .set_initiators(A, vec![allowed.to_string()])
            .await
            .expect("ACL set");
        assert!(login_as(addr, A, Some(other)).await.is_err(), "refused now");
        assert!(
            dropped.raw(0, &TUR, 0, Bytes::new()).await.is_err(),
            "dropped"
        );
        assert_eq!(sense_of(&kept, 0, &TUR, 0, Bytes::new()).await, None);
        let second = login_as(addr, A, Some(allowed))
            .await
            .expect("still allowed");
        let e = target.remove_initiator(A, allowed).await.unwrap_err();
        assert!(e.contains("last name"), "{e}");
        assert_eq!(
            target.running_config().targets[0].initiators,
            vec![allowed.to_string()]
        );
        second.logout().await.unwrap();
        kept.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_made_read_only_refuses_writes_and_reports_wp() {
    tokio::time::timeout(T, async {
        let (addr, target) = start().await;
        let s = login(addr, A).await;
        let write = |lba: u8| {
            let mut c = [0u8; 10];
            c[0] = 0x2A;
            c[5] = lba;
            c[8] = 1;
            c
        };
        let block = Bytes::from(vec![7u8; 512]);
        assert_eq!(sense_of(&s, 0, &write(1), 0, block.clone()).await, None);
        target
            .set_lun_read_only(A, 0, true)
            .await
            .expect("read-only");
        assert_eq!(
            sense_of(&s, 0, &write(2), 0, block.clone()).await,
            Some((0x07, 0x27, 0x00)),
            "DATA PROTECT, WRITE PROTECTED"
        );
        // MODE SENSE(6): the device-specific parameter's WP bit.
        let mode_sense = [0x1A, 0, 0x3F, 0, 255, 0];
        let r = s.raw(0, &mode_sense, 255, Bytes::new()).await.unwrap();
        assert_eq!(r.status, 0);
        assert_eq!(r.data[2] & 0x80, 0x80, "WP set");
        assert!(target.running_config().targets[0].lun["0"].read_only);
        target
            .set_lun_read_only(A, 0, false)
            .await
            .expect("writable");
        assert_eq!(sense_of(&s, 0, &write(2), 0, block).await, None);
        let r = s.raw(0, &mode_sense, 255, Bytes::new()).await.unwrap();
        assert_eq!(r.data[2] & 0x80, 0, "WP clear");
        s.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resized_lun_tells_other_sessions_and_reports_its_new_size() {
    tokio::time::timeout(T, async {
        let (addr, target) = start().await;
        let one = login(addr, A).await;
        let other = login(addr, A).await;
        let data = Bytes::from(vec![0x5Au8; 4096]);
        one.write(0, 0, 512, data.clone()).await.unwrap();
        let written: u64 = target
            .sessions()
            .iter()
            .flat_map(|s| s.connections.iter().map(|c| c.bytes_written))
            .sum();
        assert_eq!(written, 4096, "the write is counted");
        target.resize_lun(A, 0, 8 << 20).await.expect("grown");
        assert_eq!(
            sense_of(&other, 0, &TUR, 0, Bytes::new()).await,
            Some((0x06, 0x2A, 0x09)),
            "CAPACITY DATA HAS CHANGED"
        );
        let r = other
            .raw(0, &READ_CAPACITY_10, 8, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 0);
        let last = u32::from_be_bytes(r.data[0..4].try_into().unwrap());
        assert_eq!(u64::from(last) + 1, (8 << 20) / 512);
        // The data stayed; the new blocks read as zeroes.
        assert_eq!(other.read(0, 0, 8, 512).await.unwrap(), data);
        let tail = other.read(0, (6 << 20) / 512, 8, 512).await.unwrap();
        assert!(tail.iter().all(|&b| b == 0));
        let e = target.resize_lun(A, 0, 1000).await.unwrap_err().to_string();
        assert!(e.contains("multiple"), "{e}");
        let e = target
            .resize_lun(A, 0, 1 << 40)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot resize"), "{e}");
        assert_eq!(
            target.running_config().targets[0].lun["0"].size,
            Some(scsi::ByteSize(8 << 20))
        );
        one.logout().await.unwrap();
        other.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_one_asked_to_log_out_hears_it() {
    use test_support::raw_tcp::{plain_keys, RawConn};
    tokio::time::timeout(T, async {
        test_support::target::log_from_env();
        let text = test_support::one_lun_config(
            "[\"127.0.0.1:0\"]",
            "",
            test_support::raw_tcp::IQN,
            "",
            "size = \"1MiB\"\nbackend = \"memory\"",
        );
        let (addr, target) =
            test_support::target::serve(Config::parse(&text, "t.toml").unwrap()).await;
        let mut c = RawConn::connect(addr).await;
        c.login(1, &plain_keys()).await;
        // The connection joins its session just after its Login Response leaves.
        let mut sessions = target.sessions();
        for _ in 0..200 {
            if sessions.first().is_some_and(|s| !s.connections.is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            sessions = target.sessions();
        }
        assert_eq!(sessions.len(), 1);
        let s = &sessions[0];
        assert_eq!(s.target_name.as_deref(), Some(test_support::raw_tcp::IQN));
        assert_eq!(s.initiator_name, test_support::raw_tcp::INITIATOR);
        assert_eq!(s.isid, "800000123456");
        assert_eq!(s.session_type, "Normal");
        assert_eq!(s.connections.len(), 1);
        let conn = &s.connections[0];
        assert_eq!(conn.peer.ip().to_string(), "127.0.0.1");
        assert_ne!(conn.peer.port(), addr.port());
        assert_eq!(conn.local, addr);
        assert_eq!(conn.transport, "iSCSI/TCP");
        assert!(!conn.header_digest);
        assert_eq!(
            (conn.commands, conn.bytes_written, conn.bytes_read),
            (0, 0, 0)
        );

        target
            .logout_session(s.tsih, Duration::from_secs(1))
            .await
            .expect("asked");
        let msg = c.recv().await;
        assert_eq!(msg.opcode(), 0x32, "Async Message");
        assert_eq!(msg.bhs[36], 1, "AsyncEvent 1: logout requested");
        // Not logged out: dropped once the grace time has passed.
        assert!(c.closed_by_target(4).await);
        assert!(target.sessions().is_empty());
        assert!(target
            .drop_session(s.tsih)
            .unwrap_err()
            .contains("no session"));
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconfigure_applies_the_difference_or_nothing() {
    tokio::time::timeout(T, async {
        let (addr, target) = start().await;
        let a = login(addr, A).await;
        let before = target.running_config();
        // A new target whose LUN cannot open, besides a LUN that could be added: refused
        // whole, nothing changed.
        let bad = format!(
            "{CONFIG}[target.lun.1]\nsize = \"1MiB\"\nbackend = \"memory\"\n\
             [[target]]\nname = \"{B}\"\n[target.lun.0]\n\
             backend = {{ type = \"file\", path = \"/nonexistent/dir/lun.img\" }}\n"
        );
        let e = target
            .reconfigure(Config::parse(&bad, "bad.toml").unwrap())
            .await
            .unwrap_err();
        assert!(e.contains(B) && e.contains("LUN 0"), "{e}");
        assert_eq!(target.running_config(), before);
        assert_eq!(target.luns(A), Some(vec![0]));

        let good = format!(
            "memory_mib = 4096\n{}[target.lun.1]\nsize = \"1MiB\"\nbackend = \"memory\"\n\
             read_only = true\n[[target]]\nname = \"{B}\"\n[target.lun.0]\nsize = \"1MiB\"\n\
             backend = \"memory\"\n",
            CONFIG.replace("size = \"4MiB\"", "size = \"6MiB\"")
        );
        let new = Config::parse(&good, "good.toml").unwrap();
        let changes = target.reconfigure(new.clone()).await.expect("applied");
        let has = |s: &str| changes.iter().any(|c| c.contains(s));
        assert!(has("memory_mib = 4096: needs a restart"), "{changes:?}");
        assert!(has(&format!("target {B}: added")), "{changes:?}");
        assert!(has(&format!("target {A} LUN 1: added")), "{changes:?}");
        assert!(
            has(&format!("target {A} LUN 0: resized to 6291456")),
            "{changes:?}"
        );
        assert_eq!(target.luns(A), Some(vec![0, 1]));
        assert_eq!(a.capacity(0).await.unwrap().bytes(), 6 << 20);
        login(addr, B).await.logout().await.unwrap();
        // Applied again, it changes nothing but what needs a restart.
        let again = target.reconfigure(new).await.expect("applied");
        assert_eq!(again.len(), 1, "{again:?}");
        a.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

const THREE_LUNS: &str = r#"
portals = ["127.0.0.1:0"]
[[target]]
name = "iqn.2026-11.org.ironsan:admin-a"
[target.lun.0]
size = "8MiB"
backend = "memory"
[target.lun.1]
size = "4MiB"
backend = "memory"
[target.lun.2]
size = "4MiB"
backend = "memory"
"#;

/// Every unit attention queued for `s` on `lun`, in order, drained with TEST UNIT READY.
async fn unit_attentions(s: &Session, lun: u16) -> Vec<(u8, u8)> {
    let mut seen = Vec::new();
    for _ in 0..8 {
        match sense_of(s, lun, &TUR, 0, Bytes::new()).await {
            Some((0x06, asc, ascq)) => seen.push((asc, ascq)),
            Some(other) => panic!("TEST UNIT READY: sense {other:?}"),
            None => break,
        }
    }
    seen
}

/// The issue's scenario: while a verifying workload runs on LUN 0, a target and a LUN are
/// added, an ACL changed, LUN 1 resized and LUN 2 removed. The workload sees no error (its
/// initiator retries the unit attentions, as initiators do); another session of the same
/// target hears exactly REPORTED LUNS DATA HAS CHANGED and CAPACITY DATA HAS CHANGED; a
/// session of the added target is untouched by the changes to the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_while_a_verifying_workload_runs_leave_it_unharmed() {
    tokio::time::timeout(Duration::from_secs(60), async {
        test_support::target::log_from_env();
        let config = Config::parse(THREE_LUNS, "test.toml").expect("config");
        let (addr, target) = test_support::target::serve(config).await;
        let verifier = Arc::new(login(addr, A).await);
        let watcher = login(addr, A).await;
        assert!(
            unit_attentions(&watcher, 1).await.len() <= 1,
            "the login's own"
        );
        let cap = verifier.capacity(0).await.expect("capacity");
        let w = bench::workload::Workload {
            rw: bench::workload::Rw::Mixed { read_pct: 50 },
            pattern: bench::workload::Pattern::Rand,
            size: 4096,
            qd: 4,
            duration: Some(Duration::from_secs(4)),
            count: None,
            span: None,
            verify: true,
            seed: 7,
        };
        let running = tokio::spawn({
            let verifier = verifier.clone();
            async move {
                let progress = Arc::new(bench::workload::Progress::default());
                bench::workload::run(&[verifier], 0, cap, &w, progress).await
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        target
            .add_target(target_table(B, "2MiB"))
            .await
            .expect("target added");
        let b_host = "iqn.2026-11.org.example:b-host";
        let b_session = login_as(addr, B, Some(b_host)).await.expect("login to B");
        target
            .add_lun(A, 3, lun_table("1MiB"))
            .await
            .expect("LUN added");
        target.add_initiator(B, b_host).await.expect("ACL changed");
        target.resize_lun(A, 1, 8 << 20).await.expect("resized");
        target.remove_lun(A, 2).await.expect("removed");

        let summary = running.await.expect("workload task").expect("no error");
        assert!(summary.verified_bytes > 0 && summary.ops > 0, "{summary:?}");

        // The other session of A: REPORTED LUNS DATA HAS CHANGED (once for both LUN
        // changes, or once each) and, on the resized LUN, CAPACITY DATA HAS CHANGED.
        let seen = unit_attentions(&watcher, 1).await;
        assert!(
            seen.contains(&(0x2A, 0x09)),
            "CAPACITY DATA HAS CHANGED: {seen:?}"
        );
        assert!(
            seen.contains(&(0x3F, 0x0E)),
            "REPORTED LUNS DATA HAS CHANGED: {seen:?}"
        );
        assert!(
            seen.iter()
                .all(|ua| [(0x2A, 0x09), (0x3F, 0x0E)].contains(ua)),
            "nothing else: {seen:?}"
        );
        assert_eq!(
            watcher.report_luns().await.expect("REPORT LUNS"),
            vec![0, 1, 3]
        );
        assert_eq!(
            watcher.capacity(1).await.expect("capacity").bytes(),
            8 << 20
        );
        // B's ACL now names only b_host: its session carries on, another initiator is
        // refused.
        let refused = login_as(addr, B, Some("iqn.2026-11.org.example:other")).await;
        assert!(refused.is_err(), "the ACL refuses other initiators");
        assert!(
            unit_attentions(&b_session, 0).await.len() <= 1,
            "only its login's"
        );
        assert_eq!(
            b_session
                .read(0, 0, 1, 512)
                .await
                .expect("B still serves")
                .len(),
            512
        );
        let verifier = Arc::into_inner(verifier).expect("the workload let go of its session");
        verifier.logout().await.unwrap();
        watcher.logout().await.unwrap();
    })
    .await
    .expect("in time");
}

fn lun_table(size: &str) -> scsi::LunConfig {
    let text = format!(
        "[[target]]\nname = \"iqn.2026-11.org.ironsan:x\"\n[target.lun.0]\nsize = \"{size}\"\nbackend = \"memory\"\n"
    );
    Config::parse(&text, "t.toml").expect("table").targets[0].lun["0"].clone()
}
