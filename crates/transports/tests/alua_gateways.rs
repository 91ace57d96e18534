//! Two gateways (`[gateway]`, ALUA) in one process on two loopback ports, exporting one
//! file LUN whose ownership a shared lock file decides: writes through A, A stopped, writes
//! through B (B takes the LUN over, as REPORT TARGET PORT GROUPS shows), everything read back
//! equal; a host writing through both alternately converges on one gateway after one
//! takeover; and a single-path session rides over its gateway's hold-down (04h/0Ah sent again).
//! takeover; and a preferred gateway fails back on its own while hosts write through both,
//! one transition per flip, no write lost, no ping-pong when a host insists on the other.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iscsi_initiator::scsi::Sense;
use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use iscsi_target::{Config, Target};
use scsi::AccessState;

const IQN: &str = "iqn.2026-11.org.ironsan:shared";
const T: Duration = Duration::from_secs(60);
const BS: usize = 512;
const BLOCKS: usize = 2048;

/// Gateway `me` (group and port `id`) with peer `peer` (group and port `peer_id`).
fn config(dir: &Path, me: &str, id: u16, peer: &str, peer_id: u16) -> Config {
    config_with(
        dir,
        (me, id),
        (peer, peer_id, false),
        "hold_down_ms = 4000\n",
    )
}

/// [`config`] with `extra` lines in `[gateway]`, and the peer marked preferred or not.
fn config_with(
    dir: &Path,
    (me, id): (&str, u16),
    (peer, peer_id, peer_preferred): (&str, u16, bool),
    extra: &str,
) -> Config {
    let text = format!(
        r#"
portals = ["127.0.0.1:0"]
[gateway]
group = "pair"
name = "{me}"
port_group = {id}
relative_port = {id}
check_interval_ms = 50
{extra}[[gateway.peer]]
name = "{peer}"
port_group = {peer_id}
relative_port = {peer_id}
preferred = {peer_preferred}
[[target]]
name = "{IQN}"
[target.lun.0]
backend = {{ type = "file", path = "{image}" }}
owner_lock = "{lock}"
wwn = "0x6001405abcdef0123456789abcdef012"
serial = "shared-lun-0"
"#,
        image = dir.join("lun.img").display(),
        lock = dir.join("lun.owner").display(),
    );
    Config::parse(&text, &format!("{me}.toml")).expect("config")
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-alua-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lun.img"), vec![0u8; BS * BLOCKS]).unwrap();
    dir
}

async fn login(addr: SocketAddr) -> Session {
    let url = IscsiUrl::parse_lun(&format!("iscsi://{addr}/{IQN}/0")).unwrap();
    transports::connect_session(&url, SessionConfig::from_url(&url))
        .await
        .expect("login")
}

fn state_of(t: &Target) -> scsi::AluaStatus {
    t.alua_status(IQN).expect("target").remove(0).1
}

async fn wait_for(t: &Target, what: &str, done: impl Fn(&scsi::AluaStatus) -> bool) {
    for _ in 0..1000 {
        if done(&state_of(t)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: still {:?}", state_of(t));
}

fn write10(lba: u32) -> [u8; 10] {
    let mut c = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c
}

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// What a command came to: GOOD, or (key, ASC, ASCQ).
async fn send(s: &Session, cdb: &[u8], read_len: u32, out: Bytes) -> Result<Bytes, (u8, u8, u8)> {
    let r = s.raw(0, cdb, read_len, out).await.expect("answered");
    if r.status == 0 {
        return Ok(r.data);
    }
    assert_eq!(r.status, 2, "CHECK CONDITION");
    let sense = Sense::parse(&r.sense).expect("sense data");
    Err((sense.key, sense.asc, sense.ascq))
}

/// A host's retries: a unit attention is sent again on the same path; NOT READY,
/// transitioning makes it try the next path. Returns the path index that took the command.
async fn write_via(paths: &[&Session], first: usize, lba: u32, block: &[u8]) -> usize {
    let mut at = first;
    for _ in 0..200 {
        match send(paths[at], &write10(lba), 0, Bytes::copy_from_slice(block)).await {
            Ok(_) => return at,
            Err((6, 0x2A, 0x06)) | Err((6, 0x29, _)) => {}
            Err((2, 0x04, 0x0A)) => {
                at = (at + 1) % paths.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("write of LBA {lba} through path {at}: {other:x?}"),
        }
    }
    panic!("write of LBA {lba} never went through");
}

/// RTPG's (group id, state) pairs.
async fn port_groups(s: &Session) -> Vec<(u16, u8)> {
    let cdb = [0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    let mut data = None;
    for _ in 0..5 {
        match send(s, &cdb, 1024, Bytes::new()).await {
            Ok(d) => {
                data = Some(d);
                break;
            }
            Err((6, _, _)) => continue,
            Err(other) => panic!("RTPG: {other:x?}"),
        }
    }
    let d = data.expect("RTPG answered");
    assert_eq!(d[4], 0x10, "extended header");
    d[8..]
        .chunks(12)
        .map(|g| (u16::from_be_bytes([g[2], g[3]]), g[0] & 0x0F))
        .collect()
}

fn block(n: u32) -> Vec<u8> {
    (0..BS).map(|i| (n as usize * 31 + i) as u8).collect()
}

async fn start(
    dir: &Path,
    me: &str,
    id: u16,
    peer: &str,
    peer_id: u16,
) -> (SocketAddr, Arc<Target>) {
    test_support::target::serve(config(dir, me, id, peer, peer_id)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_gateways_lun_is_taken_over_with_every_write_kept() {
    test_support::target::log_from_env();
    tokio::time::timeout(T, async {
        let dir = scratch("failover");
        let (addr_a, a) = start(&dir, "gw-a", 1, "gw-b", 2).await;
        wait_for(&a, "A owns", |s| s.state == AccessState::ActiveOptimized).await;
        let (addr_b, b) = start(&dir, "gw-b", 2, "gw-a", 1).await;
        wait_for(&b, "B sees A", |s| s.owner.as_deref() == Some("gw-a")).await;
        let (sa, sb) = (login(addr_a).await, login(addr_b).await);
        assert_eq!(
            port_groups(&sb).await,
            vec![(1, 0), (2, 1)],
            "A optimized, B not"
        );

        for lba in 0..32 {
            assert_eq!(write_via(&[&sa], 0, lba, &block(lba)).await, 0);
        }
        a.shutdown(Duration::from_millis(500)).await;
        assert_eq!(state_of(&a).state, AccessState::Unavailable);
        for lba in 16..64 {
            assert_eq!(write_via(&[&sb], 0, lba, &block(lba + 1000)).await, 0);
        }
        let s = state_of(&b);
        assert_eq!((s.state, s.acquired), (AccessState::ActiveOptimized, 1));
        assert_eq!(
            port_groups(&sb).await,
            vec![(1, 1), (2, 0)],
            "B optimized now"
        );
        let data = send(&sb, &read10(0, 64), 64 * BS as u32, Bytes::new())
            .await
            .unwrap();
        for lba in 0..64u32 {
            let want = if lba < 16 {
                block(lba)
            } else {
                block(lba + 1000)
            };
            let at = lba as usize * BS;
            assert_eq!(&data[at..at + BS], &want[..], "LBA {lba}");
        }
        b.shutdown(Duration::from_millis(200)).await;
    })
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_both_gateways_converge_after_one_takeover() {
    test_support::target::log_from_env();
    tokio::time::timeout(T, async {
        let dir = scratch("alternate");
        let (addr_a, a) = start(&dir, "gw-a", 1, "gw-b", 2).await;
        wait_for(&a, "A owns", |s| s.state == AccessState::ActiveOptimized).await;
        let (addr_b, b) = start(&dir, "gw-b", 2, "gw-a", 1).await;
        wait_for(&b, "B sees A", |s| s.owner.as_deref() == Some("gw-a")).await;
        let (sa, sb) = (login(addr_a).await, login(addr_b).await);
        let paths = [&sa, &sb];
        // The host flips to B once, then (briefly) sends on both paths alternately.
        let mut took = [0usize; 2];
        for lba in 0..60u32 {
            let first = if lba == 0 { 1 } else { lba as usize % 2 };
            took[write_via(&paths, first, lba, &block(lba)).await] += 1;
        }
        let (sa_, sb_) = (state_of(&a), state_of(&b));
        assert_eq!((sa_.acquired, sa_.lost), (1, 1), "A: {sa_:?}");
        assert_eq!((sb_.acquired, sb_.lost), (1, 0), "B: {sb_:?}");
        assert_eq!(sb_.state, AccessState::ActiveOptimized);
        assert_eq!(took[0], 0, "A took no write after it lost the LUN");
        assert_eq!(took[1], 60);
        let data = send(&sb, &read10(0, 60), 60 * BS as u32, Bytes::new())
            .await
            .unwrap();
        for lba in 0..60u32 {
            let at = lba as usize * BS;
            assert_eq!(&data[at..at + BS], &block(lba)[..], "LBA {lba}");
        }
        a.shutdown(Duration::from_millis(200)).await;
        b.shutdown(Duration::from_millis(200)).await;
    })
    .await
    .expect("in time");
}

/// A single-path session's write to a gateway in its hold-down (it just lost the LUN) is
/// refused as in transition and sent again by `execute_past_unit_attentions` until the
/// hold-down ends and the gateway takes the LUN back: GOOD, not an error, and in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_path_write_waits_out_the_gateways_hold_down() {
    test_support::target::log_from_env();
    tokio::time::timeout(T, async {
        let dir = scratch("hold-down");
        let (addr_a, a) = start(&dir, "gw-a", 1, "gw-b", 2).await;
        wait_for(&a, "A owns", |s| s.state == AccessState::ActiveOptimized).await;
        let (addr_b, b) = start(&dir, "gw-b", 2, "gw-a", 1).await;
        wait_for(&b, "B sees A", |s| s.owner.as_deref() == Some("gw-a")).await;
        let (sa, sb) = (login(addr_a).await, login(addr_b).await);
        assert_eq!(write_via(&[&sb], 0, 1, &block(1)).await, 0, "B takes over");
        wait_for(&a, "A in its hold-down", |s| {
            s.state == AccessState::Transitioning && s.lost == 1
        })
        .await;
        let started = std::time::Instant::now();
        let req = iscsi_initiator::CommandRequest::write(0, write10(2).to_vec(), block(2).into());
        let r = sa
            .execute_past_unit_attentions(req)
            .await
            .expect("answered");
        assert_eq!(
            r.status, 0,
            "GOOD after the hold-down, sense {:x?}",
            r.sense
        );
        assert!(
            started.elapsed() > Duration::from_secs(1),
            "it waited for the hold-down: {:?}",
            started.elapsed()
        );
        assert_eq!(state_of(&a).acquired, 2, "A took the LUN back");
        let req = iscsi_initiator::CommandRequest::read(0, read10(2, 1).to_vec(), BS as u32);
        let r = sa
            .execute_past_unit_attentions(req)
            .await
            .expect("answered");
        assert_eq!((r.status, &r.data[..]), (0, &block(2)[..]));
        a.shutdown(Duration::from_millis(200)).await;
        b.shutdown(Duration::from_millis(200)).await;
    })
    .await
    .expect("in time");
}

/// libiscsi's `iscsi-inq` (Debian: libiscsi-bin), an independent decoder, reads this
/// gateway's TPGS and its target port designators.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iscsi_inq_decodes_the_tpgs_and_the_target_port_designators() {
    let Ok(found) = std::process::Command::new("sh")
        .args(["-c", "command -v iscsi-inq"])
        .output()
    else {
        return;
    };
    if !found.status.success() {
        eprintln!("skipped: iscsi-inq is not installed (Debian package libiscsi-bin)");
        return;
    }
    tokio::time::timeout(T, async {
        let dir = scratch("inq");
        let (addr, a) = start(&dir, "gw-a", 3, "gw-b", 9).await;
        wait_for(&a, "A owns", |s| s.state == AccessState::ActiveOptimized).await;
        let url = format!("iscsi://{addr}/{IQN}/0");
        let inq = |args: Vec<String>| async move {
            let out = tokio::process::Command::new("iscsi-inq")
                .args(args)
                .output()
                .await
                .expect("iscsi-inq runs");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let standard = inq(vec![url.clone()]).await;
        println!("{standard}");
        assert!(standard.contains("TPGS:1"), "{standard}");
        let page = inq(vec![
            "-e".into(),
            "1".into(),
            "-c".into(),
            "131".into(),
            url,
        ])
        .await;
        println!("{page}");
        // Each designator as libiscsi decodes it: protocol, PIV, association, type.
        for kind in ["(4) RELATIVE_TARGET_PORT", "(5) TARGET_PORT_GROUP"] {
            let at = page.find(kind).unwrap_or_else(|| panic!("{kind}: {page}"));
            let before = &page[..at];
            let desc = &before[before.rfind("DEVICE DESIGNATOR").expect("a designator")..];
            assert!(desc.contains("Protocol Identifier:(5) ISCSI"), "{desc}");
            assert!(desc.contains("PIV:1"), "{desc}");
            assert!(desc.contains("Association:(1) TARGET_PORT"), "{desc}");
        }
        a.shutdown(Duration::from_millis(200)).await;
    })
    .await
    .expect("in time");
}

/// A host's writer that starts on path `start` and stays on the path that took its last
/// write (as dm-multipath's failover policy does), or with `insist` always tries `start`
/// first. Writes LBAs from
/// `base` up until `done` holds (checked after each write; at most 450 writes), recording
/// into `log` which path took each. Returns the LBAs written.
async fn writer(
    paths: [&Session; 2],
    base: u32,
    start: usize,
    insist: bool,
    log: &std::sync::Mutex<Vec<(u32, usize)>>,
    done: impl Fn() -> bool,
) -> std::ops::Range<u32> {
    let mut at = start;
    let mut lba = base;
    while lba < base + 450 {
        let first = if insist { start } else { at };
        at = write_via(&paths, first, lba, &block(lba)).await;
        log.lock().unwrap().push((lba, at));
        lba += 1;
        if done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    base..lba
}

/// Reads `lbas` through `s` and compares each with what [`block`] wrote there.
async fn verify(s: &Session, lbas: std::ops::Range<u32>) {
    for chunk in lbas.clone().step_by(64) {
        let n = (lbas.end - chunk).min(64);
        let mut data = Err((0, 0, 0));
        for _ in 0..5 {
            data = send(s, &read10(chunk, n as u16), n * BS as u32, Bytes::new()).await;
            if !matches!(data, Err((6, _, _))) {
                break;
            }
        }
        let data = data.expect("read back");
        for i in 0..n {
            let at = i as usize * BS;
            let lba = chunk + i;
            assert_eq!(&data[at..at + BS], &block(lba)[..], "LBA {lba} lost");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preferred_gateway_fails_back_once_while_hosts_write_through_both() {
    test_support::target::log_from_env();
    tokio::time::timeout(T, async {
        let dir = scratch("failback");
        let quick = "hold_down_ms = 1500\n";
        let (addr_b, b) =
            test_support::target::serve(config_with(&dir, ("gw-b", 2), ("gw-a", 1, true), quick))
                .await;
        wait_for(&b, "B owns", |s| s.state == AccessState::ActiveOptimized).await;
        let a_conf = format!("{quick}preferred = true\nfailback_delay_ms = 400\n");
        let (addr_a, a) = test_support::target::serve(config_with(
            &dir,
            ("gw-a", 1),
            ("gw-b", 2, false),
            &a_conf,
        ))
        .await;
        wait_for(&a, "A sees B", |s| s.owner.as_deref() == Some("gw-b")).await;
        let (sa, sb) = (login(addr_a).await, login(addr_b).await);
        let owns = |t: &Target| state_of(t).state == AccessState::ActiveOptimized;

        // Two hosts' writers on B; A fails back on its own, they follow it to A.
        let log = std::sync::Mutex::new(Vec::new());
        let on_a = |log: &std::sync::Mutex<Vec<(u32, usize)>>| {
            log.lock().unwrap().iter().filter(|w| w.1 == 1).count()
        };
        let (x, y) = tokio::join!(
            writer([&sb, &sa], 0, 0, false, &log, || on_a(&log) >= 40),
            writer([&sb, &sa], 500, 0, false, &log, || on_a(&log) >= 40),
        );
        assert!(owns(&a), "A fails back: {:?}", state_of(&a));
        let (sa_, sb_) = (state_of(&a), state_of(&b));
        assert_eq!(
            (sa_.acquired, sa_.lost, sa_.failbacks),
            (1, 0, 1),
            "A: {sa_:?}"
        );
        assert_eq!((sb_.acquired, sb_.lost), (1, 1), "B: {sb_:?}");
        // Each writer: first on B, then on A, never back (one transition).
        for base in [0, 500] {
            let paths: Vec<usize> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|w| (base..base + 450).contains(&w.0))
                .map(|w| w.1)
                .collect();
            let flips = paths.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(flips <= 1, "writer {base}: paths {paths:?}");
        }

        // A host insists on B while another stays on A: B takes the LUN over after its
        // hold-down, the one on A follows, and A does not take it back again.
        log.lock().unwrap().clear();
        let on_b = |log: &std::sync::Mutex<Vec<(u32, usize)>>| {
            log.lock().unwrap().iter().filter(|w| w.1 == 0).count()
        };
        let (z, w) = tokio::join!(
            writer([&sb, &sa], 1000, 0, true, &log, || on_b(&log) >= 60),
            writer([&sb, &sa], 1500, 1, false, &log, || on_b(&log) >= 60),
        );
        assert!(owns(&b), "B took it over again: {:?}", state_of(&b));
        let paths: Vec<usize> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.0 >= 1500)
            .map(|w| w.1)
            .collect();
        let flips = paths.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(flips, 1, "the writer on A follows B once: {paths:?}");
        tokio::time::sleep(Duration::from_millis(1500 + 3 * 400)).await;
        let (sa_, sb_) = (state_of(&a), state_of(&b));
        assert_eq!(
            (sa_.acquired, sa_.lost, sa_.failbacks),
            (1, 1, 1),
            "A: {sa_:?}"
        );
        assert_eq!((sb_.acquired, sb_.lost), (2, 1), "B: {sb_:?}");
        assert_eq!(sb_.state, AccessState::ActiveOptimized);
        for lbas in [x, y, z, w] {
            verify(&sb, lbas).await;
        }
        a.shutdown(Duration::from_millis(200)).await;
        b.shutdown(Duration::from_millis(200)).await;
    })
    .await
    .expect("in time");
}
