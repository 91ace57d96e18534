//! ErrorRecoveryLevel 2 on the target, driven by a raw initiator over loopback: a failed
//! connection's tasks wait for TASK REASSIGN on another connection of the session (a new
//! CID after a Logout for recovery, or the same CID reinstated), and finish there — a write
//! cut short asks for all its data again by R2T, a read sends its data and status again —
//! with the bytes read back intact. What may not be reassigned is refused with the response
//! RFC 7143 gives: a task whose connection lives, an unknown task, a task kept past
//! DefaultTime2Retain, and any task below level 2.

use std::time::Duration;
use test_support::raw_tcp::*;

const TARGET: &str = "iqn.2026-11.org.ironsan.test:erl2";

fn config(erl: u8) -> String {
    format!("[[target]]\nname = \"{TARGET}\"\nerror_recovery_level = {erl}\n[target.lun.0]\nsize = \"16MiB\"\nbackend = \"memory\"\n")
}

/// Session keys for the leading connection: R2T for every write, 8 KiB segments.
fn leading_keys(erl: &'static str, retain: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("ImmediateData", "No"),
        ("InitialR2T", "Yes"),
        ("MaxRecvDataSegmentLength", "8192"),
        ("MaxBurstLength", "65536"),
        ("FirstBurstLength", "65536"),
        ("MaxConnections", "4"),
        ("DefaultTime2Retain", retain),
        ("ErrorRecoveryLevel", erl),
    ]
}

/// Keys of a connection joining the session (no session-wide ones).
const JOIN_KEYS: [(&str, &str); 3] = [
    ("HeaderDigest", "None"),
    ("DataDigest", "None"),
    ("MaxRecvDataSegmentLength", "8192"),
];

/// A session at level `erl` to a target at level `erl` (ISID byte `seed`).
async fn session(erl: u8, seed: u8, retain: &'static str) -> RawConn {
    let addr = start_target(&config(erl)).await;
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = seed;
    c.target_name = TARGET.into();
    let level: &'static str = ["0", "1", "2"][erl as usize];
    let got = c.login(0, &leading_keys(level, retain)).await;
    assert_eq!(
        got.get("ErrorRecoveryLevel").map(String::as_str),
        Some(level)
    );
    c
}

/// Logs connection `cid` in to `c`'s session (its TSIH), continuing its CmdSN.
async fn join(c: &RawConn, cid: u16) -> RawConn {
    let addr = c.stream.peer_addr().expect("peer");
    let mut n = RawConn::connect(addr).await;
    n.isid = c.isid;
    n.tsih = c.tsih;
    n.cmd_sn = c.cmd_sn;
    n.next_itt = c.next_itt + 1000;
    n.target_name = TARGET.into();
    n.login(cid, &JOIN_KEYS).await;
    assert_eq!(n.tsih, c.tsih, "joined the same session");
    n
}

/// An immediate TASK REASSIGN of `ref_itt` (first sent with CmdSN `ref_cmd_sn`); the
/// response code.
async fn task_reassign(c: &mut RawConn, ref_itt: u32, ref_cmd_sn: u32) -> u8 {
    let itt = c.itt();
    let mut b = bhs(0x42, 0x80 | 8, 0, itt);
    b[20..24].copy_from_slice(&ref_itt.to_be_bytes());
    b[24..28].copy_from_slice(&c.cmd_sn.to_be_bytes());
    b[28..32].copy_from_slice(&c.exp_stat_sn.to_be_bytes());
    b[32..36].copy_from_slice(&ref_cmd_sn.to_be_bytes());
    // ExpDataSN 0: no Data-In was acknowledged.
    c.send(&b, &[]).await;
    let r = c.recv().await;
    assert_eq!(
        (r.opcode(), r.itt()),
        (0x22, itt),
        "TMF response to the reassign"
    );
    c.exp_stat_sn = r.field32(24).wrapping_add(1);
    r.bhs[2]
}

/// An immediate Logout of connection `cid` for `reason`; the response code.
async fn logout_cid(c: &mut RawConn, cid: u16, reason: u8) -> u8 {
    let itt = c.itt();
    let mut b = bhs(0x46, 0x80 | reason, 0, itt);
    b[20..22].copy_from_slice(&cid.to_be_bytes());
    b[24..28].copy_from_slice(&c.cmd_sn.to_be_bytes());
    b[28..32].copy_from_slice(&c.exp_stat_sn.to_be_bytes());
    c.send(&b, &[]).await;
    let r = c.recv().await;
    assert_eq!((r.opcode(), r.itt()), (0x26, itt), "Logout Response");
    c.exp_stat_sn = r.field32(24).wrapping_add(1);
    r.bhs[2]
}

/// Sends a WRITE(10) of `data` at `lba` with no data; returns its ITT, CmdSN and first R2T.
async fn start_write(c: &mut RawConn, lba: u32, data: &[u8]) -> (u32, u32, Rx) {
    let cmd_sn = c.cmd_sn;
    let b = c.scsi_bhs(
        &write10(lba, (data.len() / 512) as u16),
        0,
        data.len() as u32,
        0,
    );
    c.send(&b, &[]).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.opcode(), 0x31, "R2T");
    (be32(&b[16..20]), cmd_sn, r2t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_by_its_lost_connection_finishes_on_the_reinstated_one() {
    let mut c = session(2, 1, "20").await;
    let data = pattern(65536, 7);
    let (itt, cmd_sn, r2t) = start_write(&mut c, 100, &data).await;
    assert_eq!((r2t.field32(40), r2t.field32(44)), (0, 65536));
    // Half the data (not the final Data-Out), then the connection breaks.
    for (sn, off) in (0..32768u32).step_by(8192).enumerate() {
        let mut b = bhs(0x05, 0, 8192, itt);
        b[20..24].copy_from_slice(&r2t.field32(20).to_be_bytes());
        b[36..40].copy_from_slice(&(sn as u32).to_be_bytes());
        b[40..44].copy_from_slice(&off.to_be_bytes());
        c.send(&b, &data[off as usize..off as usize + 8192]).await;
    }
    let mut n = {
        let old = c;
        let n = join(&old, 0).await; // the same CID: connection reinstatement
        drop(old);
        n
    };
    assert_eq!(
        task_reassign(&mut n, itt, cmd_sn).await,
        0,
        "Function complete"
    );
    // All of it is asked for again on the new connection, and the write completes.
    let (st, sense, _) = n.finish(itt, &data).await;
    assert_eq!(
        st, 0,
        "WRITE status on the new connection (sense {sense:02x?})"
    );
    read_back(&mut n, 100, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_status_was_lost_is_sent_again_after_a_logout_for_recovery() {
    let mut c = session(2, 2, "20").await;
    let data = pattern(65536, 9);
    let (st, _, _) = c.command(&write10(300, 128), 0, &data).await;
    assert_eq!(st, 0);
    // A READ whose Data-In and status go out on a connection the initiator stops reading.
    let cmd_sn = c.cmd_sn;
    let b = c.scsi_bhs(&read10(300, 128), 65536, 0, 0);
    let itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    let mut n = join(&c, 1).await;
    // The first connection is still up: the task cannot move yet.
    assert_eq!(
        task_reassign(&mut n, itt, cmd_sn).await,
        3,
        "Task still allegiant"
    );
    assert_eq!(
        logout_cid(&mut n, 0, 2).await,
        0,
        "connection 0 removed for recovery"
    );
    assert_eq!(
        task_reassign(&mut n, itt, cmd_sn).await,
        0,
        "Function complete"
    );
    let (st, _, got) = n.finish(itt, &[]).await;
    assert_eq!(st, 0, "READ status, sent again");
    assert!(got == data, "the read's data, sent again in full");
    // The session goes on: nothing more to reassign, and new commands run.
    assert_eq!(
        task_reassign(&mut n, itt, cmd_sn).await,
        1,
        "acknowledged: no such task"
    );
    roundtrip(&mut n, 500, 16, 3).await;
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_outlives_its_only_connection_for_reassignment_within_time2retain() {
    let mut c = session(2, 3, "2").await;
    let data = pattern(16384, 5);
    let (itt, cmd_sn, _) = start_write(&mut c, 40, &data).await;
    let addr = c.stream.peer_addr().expect("peer");
    let (isid, tsih, next_cmd_sn) = (c.isid, c.tsih, c.cmd_sn);
    drop(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // No connection left: a login with the TSIH still finds the session.
    let mut n = RawConn::connect(addr).await;
    (n.isid, n.tsih, n.cmd_sn, n.next_itt) = (isid, tsih, next_cmd_sn, 5000);
    n.target_name = TARGET.into();
    n.login(0, &JOIN_KEYS).await;
    assert_eq!(task_reassign(&mut n, itt, cmd_sn).await, 0);
    let (st, _, _) = n.finish(itt, &data).await;
    assert_eq!(st, 0);
    read_back(&mut n, 40, &data).await;
    // A write cut short past DefaultTime2Retain (2 s) is gone.
    let (itt2, cmd_sn2, _) = start_write(&mut n, 80, &data).await;
    let mut m = join(&n, 1).await;
    assert_eq!(logout_cid(&mut m, 0, 2).await, 0);
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(
        task_reassign(&mut m, itt2, cmd_sn2).await,
        1,
        "Task does not exist"
    );
    roundtrip(&mut m, 600, 16, 4).await;
    drop(n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_reassign_below_level_2_or_of_an_unknown_task_is_refused() {
    let mut c = session(1, 4, "20").await;
    let sn = c.cmd_sn;
    assert_eq!(
        task_reassign(&mut c, 0x77, sn).await,
        4,
        "not supported at level 1"
    );
    let mut c = session(2, 5, "20").await;
    let sn = c.cmd_sn;
    assert_eq!(task_reassign(&mut c, 0x77, sn).await, 1, "no such task");
    // A logout for recovery of a CID the session never had.
    assert_eq!(logout_cid(&mut c, 9, 2).await, 1, "CID not found");
    roundtrip(&mut c, 700, 16, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_its_turn_in_cmdsn_order_is_reassigned_too() {
    let mut c = session(2, 6, "20").await;
    let data = pattern(16384, 8);
    // CmdSN N is skipped: the WRITE with N+1 waits in the window, its data not asked for.
    let missing = c.cmd_sn;
    c.cmd_sn = missing.wrapping_add(1);
    let write_cmd_sn = c.cmd_sn;
    let b = c.scsi_bhs(&write10(900, 32), 0, data.len() as u32, 0);
    let write_itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    // The answer to an immediate ping shows the WRITE was taken in (PDUs are handled in
    // order) before the connection is reinstated.
    c.ping(b"taken").await;
    let mut n = join(&c, 0).await; // reinstated
    drop(c);
    assert_eq!(n.cmd_sn, missing, "the target still waits for CmdSN N");
    assert_eq!(
        task_reassign(&mut n, write_itt, write_cmd_sn).await,
        0,
        "found while queued"
    );
    // CmdSN N arrives (TEST UNIT READY): both run, the WRITE's data asked for here.
    let tur = n.scsi_bhs(&[0u8; 6], 0, 0, 0);
    let tur_itt = be32(&tur[16..20]);
    n.send(&tur, &[]).await;
    n.cmd_sn = write_cmd_sn.wrapping_add(1);
    let mut done = Vec::new();
    for _ in 0..100 {
        let r = n.recv().await;
        match r.opcode() {
            0x31 => {
                assert_eq!(r.itt(), write_itt, "R2T for the reassigned WRITE");
                let (ttt, off, len) = (r.field32(20), r.field32(40), r.field32(44));
                n.data_out(
                    write_itt,
                    ttt,
                    off,
                    &data[off as usize..(off + len) as usize],
                )
                .await;
            }
            0x21 => {
                assert_eq!(r.bhs[3], 0, "GOOD");
                n.exp_stat_sn = r.field32(24).wrapping_add(1);
                done.push(r.itt());
                if done.len() == 2 {
                    break;
                }
            }
            op => panic!("unexpected opcode 0x{op:02x}"),
        }
    }
    done.sort();
    let mut want = vec![tur_itt, write_itt];
    want.sort();
    assert_eq!(done, want, "both commands completed");
    read_back(&mut n, 900, &data).await;
}
