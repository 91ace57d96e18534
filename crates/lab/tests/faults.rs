//! Fault scenarios through the fault-injecting proxy (`lab::proxy` with `faults`): a
//! connection cut mid-write, mid-read and mid-login, a corrupted data digest each way (at
//! ErrorRecoveryLevel 0 a reconnect, at 1 a resend inside the connection), and a target
//! that stalls past the NOP timeout. After each, every command the initiator (with
//! reconnect) acknowledged is read back intact straight from the target; without reconnect,
//! commands fail with a clear error and what was acknowledged is still intact.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi_initiator::{scsi, CommandRequest, IscsiUrl, Session, SessionConfig};
use lab::fault::Fault;
use lab::proxy::{DelayProxy, ProxyConfig};
use test_support::random_bytes;

const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]

[[target]]
name = "iqn.2026-11.org.ironsan:plain"
[target.lun.0]
size = "32MiB"
backend = "memory"

[[target]]
name = "iqn.2026-11.org.ironsan:digests"
header_digest = "required"
data_digest = "required"
[target.lun.0]
size = "32MiB"
backend = "memory"

[[target]]
name = "iqn.2026-11.org.ironsan:erl1"
header_digest = "required"
data_digest = "required"
error_recovery_level = 1
[target.lun.0]
size = "32MiB"
backend = "memory"

[[target]]
name = "iqn.2026-11.org.ironsan:erl2"
error_recovery_level = 2
[target.lun.0]
size = "32MiB"
backend = "memory"
"#;

const MIB: usize = 1 << 20;
const BLOCK: u32 = 512;
/// Commands per scenario, each 1 MiB at its own place on the LUN, all in flight at once.
const COMMANDS: usize = 8;

/// The targets "digests" and "erl1" require both digests: their URLs ask for them, and
/// for ErrorRecoveryLevel 1 from "erl1".
fn url(addr: SocketAddr, target: &str) -> IscsiUrl {
    let query = match target {
        "digests" => "?header_digest=crc32c&data_digest=crc32c",
        "erl1" => "?header_digest=crc32c&data_digest=crc32c&error_recovery_level=1",
        "erl2" => "?error_recovery_level=2",
        _ => "",
    };
    IscsiUrl::parse_lun(&format!(
        "iscsi://{addr}/iqn.2026-11.org.ironsan:{target}/0{query}"
    ))
    .expect("url")
}

fn lba(i: usize) -> u64 {
    (i * MIB / BLOCK as usize) as u64
}

/// A proxy in front of `target` injecting `faults` (as `ironsan delay-proxy --fault` spells them).
fn proxy(target: SocketAddr, faults: &[&str]) -> DelayProxy {
    let mut cfg = ProxyConfig::new("127.0.0.1:0".parse().unwrap(), target, Duration::ZERO);
    cfg.faults = faults
        .iter()
        .map(|f| f.parse::<Fault>().expect("fault"))
        .collect();
    DelayProxy::start(cfg).expect("proxy")
}

/// The faults `p` has fired, as spelled on the command line (without the connection).
fn fired(p: &DelayProxy) -> Vec<String> {
    p.fired().iter().map(|f| f.to_string()).collect()
}

async fn session(addr: SocketAddr, target: &str, reconnect: bool) -> Session {
    let u = url(addr, target);
    let cfg = SessionConfig {
        reconnect,
        // Level 2 recovers one connection of several.
        connections: if target == "erl2" { 2 } else { 1 },
        // A stalled connection is found within a few seconds.
        nop_interval: Some(Duration::from_millis(500)),
        nop_timeout: Duration::from_secs(2),
        ..SessionConfig::from_url(&u)
    };
    transports::connect_session(&u, cfg).await.expect("login")
}

/// Submits one 1 MiB WRITE per region, all at once; the data of those acknowledged.
async fn write_all(s: &Session, seed: u64) -> Vec<Result<Bytes, String>> {
    let pending: Vec<_> = (0..COMMANDS)
        .map(|i| {
            let data = random_bytes(MIB, seed + i as u64);
            let cdb = scsi::read_write(true, lba(i), (MIB / BLOCK as usize) as u32, false);
            (data.clone(), s.submit(CommandRequest::write(0, cdb, data)))
        })
        .collect();
    let mut out = Vec::new();
    for (data, p) in pending {
        out.push(match p.wait().await {
            Ok(r) if r.status == 0 => Ok(data),
            Ok(r) => Err(format!("status {:#x}", r.status)),
            Err(e) => Err(e.to_string()),
        });
    }
    out
}

/// Submits one 1 MiB READ per region, all at once.
async fn read_all(s: &Session) -> Vec<Result<Bytes, String>> {
    let pending: Vec<_> = (0..COMMANDS)
        .map(|i| {
            let cdb = scsi::read_write(false, lba(i), (MIB / BLOCK as usize) as u32, false);
            s.submit(CommandRequest::read(0, cdb, MIB as u32))
        })
        .collect();
    let mut out = Vec::new();
    for p in pending {
        out.push(match p.wait().await {
            Ok(r) if r.status == 0 => Ok(r.data),
            Ok(r) => Err(format!("status {:#x}", r.status)),
            Err(e) => Err(e.to_string()),
        });
    }
    out
}

/// Reads every region straight from the target (no proxy): each acknowledged write's data
/// must be there.
async fn verify(target: SocketAddr, name: &str, written: &[Result<Bytes, String>]) {
    let s = session(target, name, false).await;
    let back = read_all(&s).await;
    for (i, (w, r)) in written.iter().zip(&back).enumerate() {
        let r = r.as_ref().expect("verify read");
        if let Ok(w) = w {
            assert!(r == w, "region {i}: an acknowledged write was lost");
        }
    }
    s.logout().await.expect("logout");
}

/// Known data in every region, written straight to the target.
async fn fill(target: SocketAddr, name: &str, seed: u64) -> Vec<Bytes> {
    let s = session(target, name, false).await;
    let w = write_all(&s, seed).await;
    s.logout().await.expect("logout");
    w.into_iter().map(|r| r.expect("direct write")).collect()
}

fn all_ok(results: &[Result<Bytes, String>], what: &str) {
    for (i, r) in results.iter().enumerate() {
        if let Err(e) = r {
            panic!("{what}: command {i} failed with reconnect on: {e}");
        }
    }
}

async fn in_time<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(90), f)
        .await
        .expect("in time: no command silently dropped")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_write_loses_no_acknowledged_write() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // 3 MB into the initiator's bytes: the third of eight 1 MiB WRITEs in flight.
        let p = proxy(target, &["up:byte=3000000:reset"]);
        let s = session(p.local_addr(), "plain", true).await;
        let tsih = s.tsih();
        let written = write_all(&s, 100).await;
        all_ok(&written, "cut mid-write");
        assert_eq!(fired(&p), ["up:byte=3000000:reset:conn=0"]);
        assert_ne!(s.tsih(), tsih, "the session was reinstated");
        s.logout().await.expect("logout");
        verify(target, "plain", &written).await;

        // Without reconnect: the commands after the cut fail with a clear error; those
        // acknowledged before it are intact.
        let p = proxy(target, &["up:byte=3000000:reset"]);
        let s = session(p.local_addr(), "plain", false).await;
        let written = write_all(&s, 200).await;
        let failed: Vec<&String> = written.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(!failed.is_empty(), "the cut came before the last write");
        for e in failed {
            assert!(e.contains("connection"), "a clear error: {e}");
        }
        verify(target, "plain", &written).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_read_is_read_again() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        let data = fill(target, "plain", 300).await;
        // Eight 1 MiB READs come back as 32 Data-In PDUs of 256 KiB: cut at the 13th.
        let p = proxy(target, &["down:data-in#13:reset"]);
        let s = session(p.local_addr(), "plain", true).await;
        let tsih = s.tsih();
        let back = read_all(&s).await;
        all_ok(&back, "cut mid-read");
        assert_eq!(fired(&p), ["down:data-in#13:reset:conn=0"]);
        assert_ne!(s.tsih(), tsih, "the session was reinstated");
        for (i, (b, d)) in back.iter().zip(&data).enumerate() {
            assert!(b.as_ref().unwrap() == d, "region {i}: read data differs");
        }
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_cut_is_retried_and_a_first_login_cut_is_a_clear_error() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // The first connection is cut mid-write; the reinstating login (the second
        // connection) is cut at its Login Response; the third attempt goes through.
        let p = proxy(
            target,
            &["up:byte=3000000:reset", "down:login-resp#1:reset:conn=1"],
        );
        let s = session(p.local_addr(), "plain", true).await;
        let tsih = s.tsih();
        let written = write_all(&s, 400).await;
        all_ok(&written, "cut mid-write, then mid-login");
        assert_eq!(
            fired(&p),
            [
                "up:byte=3000000:reset:conn=0",
                "down:login-resp#1:reset:conn=1"
            ]
        );
        assert_ne!(s.tsih(), tsih, "the session was reinstated");
        s.logout().await.expect("logout");
        verify(target, "plain", &written).await;

        let p = proxy(target, &["down:login-resp#1:reset"]);
        let u = url(p.local_addr(), "plain");
        let e = test_support::connect(&u)
            .await
            .err()
            .expect("a login cut before it ended fails")
            .to_string();
        assert!(e.contains("login") || e.contains("connection"), "{e}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_data_digests_end_the_connection_and_the_commands_are_sent_again() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // A Data-Out payload byte flipped: the target's digest check ends the connection
        // (error recovery level 0); the reinstated session sends the WRITEs again.
        let p = proxy(target, &["up:data-out#2:corrupt=data+100"]);
        let s = session(p.local_addr(), "digests", true).await;
        let tsih = s.tsih();
        let written = write_all(&s, 500).await;
        all_ok(&written, "corrupted Data-Out");
        assert_eq!(fired(&p), ["up:data-out#2:corrupt=data+100:conn=0"]);
        assert_ne!(
            s.tsih(),
            tsih,
            "the digest error ended the first session's connection"
        );
        s.logout().await.expect("logout");
        verify(target, "digests", &written).await;

        // A Data-In payload byte flipped: the initiator's digest check ends the connection
        // and the READs are sent again; no corrupted byte reaches the caller.
        let p = proxy(target, &["down:data-in#3:corrupt=data+7"]);
        let s = session(p.local_addr(), "digests", true).await;
        let tsih = s.tsih();
        let back = read_all(&s).await;
        all_ok(&back, "corrupted Data-In");
        assert_eq!(fired(&p), ["down:data-in#3:corrupt=data+7:conn=0"]);
        assert_ne!(
            s.tsih(),
            tsih,
            "the digest error ended the first connection"
        );
        for (i, (b, w)) in back.iter().zip(&written).enumerate() {
            assert!(b.as_ref().unwrap() == w.as_ref().unwrap(), "region {i}");
        }
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl1_corrupted_data_is_sent_again_inside_the_connection() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // Data-Out payload bytes flipped: the target Rejects each and asks for the range
        // again with a recovery R2T. A WRITE's immediate data flipped: the target Rejects
        // the command and the initiator sends it again. The session, without reconnect,
        // never drops.
        let p = proxy(
            target,
            &[
                "up:data-out#2:corrupt=data+100",
                "up:data-out#9:corrupt=data+5",
                "up:scsi-cmd#5:corrupt=data+10",
            ],
        );
        let s = session(p.local_addr(), "erl1", false).await;
        let written = write_all(&s, 900).await;
        all_ok(&written, "corrupted Data-Out at ERL 1");
        assert_eq!(fired(&p).len(), 3, "every fault fired: {:?}", fired(&p));
        // Without reconnect a dropped connection would have failed commands above; the
        // counters show the mending happened inside the connection.
        let r = s.recovery();
        assert!(
            r.data_out_rejects >= 2 && r.command_retries >= 1,
            "Rejects answered in place: {r:?}"
        );
        s.logout().await.expect("logout");
        verify(target, "erl1", &written).await;

        // Data-In payload bytes flipped, one in a Data-In carrying status: each is asked
        // for again with a Data SNACK; the READs complete with every byte right.
        let p = proxy(
            target,
            &[
                "down:data-in#3:corrupt=data+7",
                "down:data-in#8:corrupt=data+9",
            ],
        );
        let s = session(p.local_addr(), "erl1", false).await;
        let back = read_all(&s).await;
        all_ok(&back, "corrupted Data-In at ERL 1");
        assert_eq!(fired(&p).len(), 2, "both faults fired: {:?}", fired(&p));
        assert!(s.recovery().data_snacks >= 2, "{:?}", s.recovery());
        for (i, (b, w)) in back.iter().zip(&written).enumerate() {
            assert!(b.as_ref().unwrap() == w.as_ref().unwrap(), "region {i}");
        }
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl1_a_smaller_max_recv_data_segment_length_mid_read_and_a_damaged_data_in_take_an_r_data_snack(
) {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        let written = fill(target, "erl1", 77).await;
        // Eight 1 MiB READs in flight, then 4 KiB segments declared by Text: the target cuts
        // what is left at 4 KiB. Data-In #200 exists only at the new cut (the old one makes
        // 32 for all eight); it is damaged, and its read, begun before the change, is asked
        // for again with an R-Data SNACK.
        let p = proxy(target, &["down:data-in#200:corrupt=data+7"]);
        let s = session(p.local_addr(), "erl1", false).await;
        let pending: Vec<_> = (0..COMMANDS)
            .map(|i| {
                let cdb = scsi::read_write(false, lba(i), (MIB / BLOCK as usize) as u32, false);
                s.submit(CommandRequest::read(0, cdb, MIB as u32))
            })
            .collect();
        s.set_max_recv_data_segment_length(4096)
            .await
            .expect("MaxRecvDataSegmentLength=4096 by Text");
        for (i, cmd) in pending.into_iter().enumerate() {
            let r = cmd.wait().await.expect("read");
            assert!(r.data == written[i], "region {i}: every byte right");
        }
        assert_eq!(fired(&p).len(), 1, "the fault fired: {:?}", fired(&p));
        let r = s.recovery();
        assert!(r.r_data_snacks >= 1 && r.reinstatements == 0, "{r:?}");
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl1_target_pdus_with_corrupted_headers_are_discarded_and_asked_for_again() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // Header bytes flipped (each PDU fails its header digest and is discarded by the
        // length it claims): an R2T (the write hears nothing more: the probe asks again by
        // R2T SNACK), a SCSI Response in the middle (the next StatSN shows the gap: Status
        // SNACK) and the last one (found by a ping's answer). No reconnect: a dropped
        // connection would fail commands.
        let p = proxy(
            target,
            &[
                "down:r2t#2:corrupt=20",
                "down:scsi-resp#3:corrupt=20",
                "down:scsi-resp#8:corrupt=20",
            ],
        );
        let s = session(p.local_addr(), "erl1", false).await;
        let tsih = s.tsih();
        let written = write_all(&s, 1200).await;
        all_ok(
            &written,
            "corrupted headers of target PDUs during WRITEs at ERL 1",
        );
        assert_eq!(fired(&p).len(), 3, "every fault fired: {:?}", fired(&p));
        let r = s.recovery();
        assert!(
            r.header_digest_discards >= 3 && r.status_snacks >= 2 && r.r2t_snacks >= 1,
            "discarded and asked for again: {r:?}"
        );
        assert_eq!(s.tsih(), tsih, "same session");
        s.logout().await.expect("logout");
        verify(target, "erl1", &written).await;

        // Reads: a Data-In in the middle of a command (the next DataSN shows the gap: Data
        // SNACK) and Data-In that end commands (their status lost with them: the next
        // StatSN shows it, and the resent status's ExpDataSN shows the data missing); the
        // first SNACK is discarded by the target and asked for again after a quiet second.
        let p = proxy(
            target,
            &[
                "down:data-in#5:corrupt=20",
                "down:data-in#16:corrupt=20",
                "down:data-in#32:corrupt=20",
                // The first SNACK is lost on its way (the target discards it): asked again.
                "up:snack#1:corrupt=20",
            ],
        );
        let s = session(p.local_addr(), "erl1", false).await;
        let back = read_all(&s).await;
        all_ok(&back, "corrupted headers of Data-In at ERL 1");
        assert_eq!(fired(&p).len(), 4, "every fault fired: {:?}", fired(&p));
        let r = s.recovery();
        assert!(r.header_digest_discards >= 3 && r.data_snacks >= 1, "{r:?}");
        for (i, (b, w)) in back.iter().zip(&written).enumerate() {
            assert!(b.as_ref().unwrap() == w.as_ref().unwrap(), "region {i}");
        }
        s.logout().await.expect("logout");

        // The first ping is discarded by the target and the second ping's answer by the
        // initiator: a ping unanswered for half the NOP timeout goes again, and the
        // connection outlives both (without reconnect, losing it would fail the reads).
        let p = proxy(
            target,
            &["up:nop-out#1:corrupt=20", "down:nop-in#2:corrupt=20"],
        );
        let s = session(p.local_addr(), "erl1", false).await;
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(fired(&p).len(), 2, "both pings damaged: {:?}", fired(&p));
        let back = read_all(&s).await;
        all_ok(&back, "reads after lost pings at ERL 1");
        // The lost answer was discarded and asked for again (a StatSN gap).
        let r = s.recovery();
        assert!(
            r.header_digest_discards >= 1 && r.status_snacks >= 1,
            "{r:?}"
        );
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_stalled_past_the_nop_timeout_is_left_and_the_commands_finish() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        let data = fill(target, "plain", 600).await;
        // The target's bytes stop for 60 s from the third Data-In: the initiator's NOP-Out
        // goes unanswered for 2 s, it drops the connection and reinstates the session.
        let p = proxy(target, &["down:data-in#3:stall=60"]);
        let s = session(p.local_addr(), "plain", true).await;
        let tsih = s.tsih();
        let start = Instant::now();
        let back = read_all(&s).await;
        let took = start.elapsed();
        all_ok(&back, "stalled target");
        assert_eq!(fired(&p), ["down:data-in#3:stall=60:conn=0"]);
        assert_ne!(s.tsih(), tsih, "the session was reinstated");
        assert!(
            took < Duration::from_secs(20),
            "left the stalled connection after the NOP timeout, not the stall: {took:?}"
        );
        for (i, (b, d)) in back.iter().zip(&data).enumerate() {
            assert!(b.as_ref().unwrap() == d, "region {i}: read data differs");
        }
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl2_a_cut_connection_is_logged_in_again_and_its_commands_reassigned() {
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // One of the session's two connections is cut 3 MB into its WRITEs: it is logged
        // in again with its CID and its commands are reassigned to it (TASK REASSIGN; the
        // target asks for their data again). No reconnect: a session reinstatement or a
        // failed command would show.
        let p = proxy(target, &["up:byte=3000000:reset"]);
        let s = session(p.local_addr(), "erl2", false).await;
        assert_eq!(s.params().error_recovery_level, 2);
        let tsih = s.tsih();
        let written = write_all(&s, 1300).await;
        all_ok(&written, "a cut connection at ERL 2 (writes)");
        assert_eq!(fired(&p), ["up:byte=3000000:reset:conn=0"]);
        let r = s.recovery();
        assert!(
            r.connection_recoveries == 1 && r.task_reassigns >= 1 && r.reinstatements == 0,
            "recovered inside the session: {r:?}"
        );
        // The writes may all complete on the other connection before the cut one is
        // logged in again (after DefaultTime2Wait): wait for it, bounded.
        for _ in 0..100 {
            if s.connection_count() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!((s.tsih(), s.connection_count()), (tsih, 2));
        s.logout().await.expect("logout");
        verify(target, "erl2", &written).await;

        // Cut at the 13th Data-In: the READs on it are reassigned and their data sent again.
        let p = proxy(target, &["down:data-in#13:reset"]);
        let s = session(p.local_addr(), "erl2", false).await;
        let back = read_all(&s).await;
        all_ok(&back, "a cut connection at ERL 2 (reads)");
        assert_eq!(fired(&p).len(), 1);
        assert_eq!(s.recovery().connection_recoveries, 1, "{:?}", s.recovery());
        for (i, (b, w)) in back.iter().zip(&written).enumerate() {
            assert!(b.as_ref().unwrap() == w.as_ref().unwrap(), "region {i}");
        }
        s.logout().await.expect("logout");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_erl2_a_connection_that_cannot_be_recovered_leaves_its_commands_to_the_other_connection()
{
    in_time(async {
        let target = test_support::start_target(CONFIG).await;
        // Connection 0 is cut 3 MB into its WRITEs, and each connection logged in again in
        // its place (accept order 2, 3, 4) is cut at its TASK REASSIGN: after the fourth
        // failure in a row connection recovery is given up, and the commands are aborted on
        // the session's other connection and sent there as new tasks. No reconnect: a
        // session reinstatement or a failed command would show.
        let cut_reassigns = [
            "up:tmf-req#1:reset:conn=2",
            "up:tmf-req#1:reset:conn=3",
            "up:tmf-req#1:reset:conn=4",
        ];
        let mut faults = vec!["up:byte=3000000:reset"];
        faults.extend(cut_reassigns);
        let p = proxy(target, &faults);
        let s = session(p.local_addr(), "erl2", false).await;
        let tsih = s.tsih();
        let written = write_all(&s, 1700).await;
        all_ok(&written, "an unrecoverable connection at ERL 2 (writes)");
        assert_eq!(fired(&p).len(), 4, "{:?}", fired(&p));
        let r = s.recovery();
        assert!(
            r.reissued_commands >= 1 && r.reinstatements == 0,
            "sent again inside the session: {r:?}"
        );
        assert_eq!((s.tsih(), s.connection_count()), (tsih, 1));
        s.logout().await.expect("logout");
        verify(target, "erl2", &written).await;

        // The same with READs cut at their 13th Data-In.
        let mut faults = vec!["down:data-in#13:reset"];
        faults.extend(cut_reassigns);
        let p = proxy(target, &faults);
        let s = session(p.local_addr(), "erl2", false).await;
        let back = read_all(&s).await;
        all_ok(&back, "an unrecoverable connection at ERL 2 (reads)");
        assert_eq!(fired(&p).len(), 4, "{:?}", fired(&p));
        let r = s.recovery();
        assert!(r.reissued_commands >= 1 && r.reinstatements == 0, "{r:?}");
        for (i, (b, w)) in back.iter().zip(&written).enumerate() {
            assert!(b.as_ref().unwrap() == w.as_ref().unwrap(), "region {i}");
        }
        s.logout().await.expect("logout");
    })
    .await;
}
