//! Attacks on the target's memory and liveness, each by a raw client on loopback as a hostile
//! peer would send them, with a victim session beside it that must keep its data and its
//! answers: WRITEs announcing 64 MiB in a discovery session, immediate and windowed WRITEs
//! whose data never comes, a window of large READs never read, a peer that never reads, a
//! LUN reset sent to another target, a write whose unsolicited data finds no room, and
//! statuses (at ErrorRecoveryLevel 2, whole responses) never acknowledged.
//! Its own test binary, so the address space and resident set measured are the target's
//! (and this test's); the tests run one at a time (`SERIAL`), and the attacks that measure
//! memory one after another in one test.

use test_support::raw_tcp::*;

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The budgets the attacks run against: 64 MiB a connection (the largest write), 128 MiB a
/// session and 192 MiB for the target; writes wait 5 s for room; data asked for must come
/// within 3 s; a peer must take what is sent within 2 s.
const LIMITS: &str = "queue_depth = 128\nconnection_memory_mib = 64\nsession_memory_mib = 128\n\
                      memory_mib = 192\ndata_out_timeout_secs = 3\nnop_timeout_secs = 2\n\
                      max_immediate_commands = 4";

const BIG_WRITE: u32 = 64 << 20;

/// Held by each test for its whole run: memory measured by one is not another's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// (VmSize, VmRSS) of this process in MiB.
fn memory_mib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).expect(name);
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib >> 10
    };
    (field("VmSize:"), field("VmRSS:"))
}

/// Logs in a discovery session (no target name, no credentials).
async fn discovery(addr: SocketAddr) -> RawConn {
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = 0xd1;
    c.login_discovery().await;
    c
}

/// A WRITE(10) of `len` bytes with F and W set and no data (the data to come by R2T).
fn empty_write(c: &mut RawConn, len: u32, immediate: bool) -> [u8; 48] {
    let mut b = c.scsi_bhs(&write10(0, (len / 512).min(0xffff) as u16), 0, len, 0);
    if immediate {
        // Immediate: I bit, the current CmdSN, not advanced.
        b[0] |= 0x40;
        c.cmd_sn = c.cmd_sn.wrapping_sub(1);
    }
    b
}

/// Reads what the target sends for up to `wait`, counting Rejects by reason and SCSI
/// Responses by status; true when the target closed the connection.
async fn drain(
    c: &mut RawConn,
    wait: Duration,
    rejects: &mut std::collections::BTreeMap<u8, usize>,
    statuses: &mut std::collections::BTreeMap<u8, usize>,
) -> bool {
    let end = Instant::now() + wait;
    while Instant::now() < end {
        match tokio::time::timeout(end - Instant::now(), c.try_recv()).await {
            Err(_) => return false,
            Ok(None) => return true,
            Ok(Some(r)) => match r.opcode() {
                0x3f => *rejects.entry(r.bhs[2]).or_default() += 1,
                0x21 => *statuses.entry(r.bhs[3]).or_default() += 1,
                _ => {}
            },
        }
    }
    false
}

/// What the victim session saw while an attack ran, and the memory the process peaked at.
struct Beside {
    /// Verified 32 KiB write + read-back round trips per second, as MB/s of data moved.
    victim_mb_s: f64,
    worst_round_trip: Duration,
    peak: (u64, u64),
}

/// Runs `attack` (spawned) while the victim writes and reads back 32 KiB at a time, each
/// verified, until the attack ends; memory is sampled between round trips.
async fn beside_victim<T: Send + 'static>(
    victim: &mut RawConn,
    attack: impl std::future::Future<Output = T> + Send + 'static,
) -> (T, Beside) {
    let attack = tokio::spawn(attack);
    let start = Instant::now();
    let (mut trips, mut worst, mut peak) = (0u32, Duration::ZERO, memory_mib());
    while !attack.is_finished() && start.elapsed() < Duration::from_secs(30) {
        // Clear of the LBAs the attacks read (a read's range stays locked while its data
        // waits to be sent).
        let lba = 100_000 + (trips % 16) * 64;
        let trip = Instant::now();
        roundtrip(victim, lba, 64, trips as u8).await;
        worst = worst.max(trip.elapsed());
        trips += 1;
        let now = memory_mib();
        peak = (peak.0.max(now.0), peak.1.max(now.1));
    }
    let secs = start.elapsed().as_secs_f64();
    let result = attack.await.expect("the attack ran");
    let beside = Beside {
        victim_mb_s: f64::from(trips) * 2.0 * 32768.0 / secs / 1e6,
        worst_round_trip: worst,
        peak,
    };
    (result, beside)
}

/// The address space and the resident set peaked less than `vm_mib` and `rss_mib` above
/// `before`.
fn memory_stayed_under(before: (u64, u64), b: &Beside, vm_mib: u64, rss_mib: u64) {
    let grew = (
        b.peak.0.saturating_sub(before.0),
        b.peak.1.saturating_sub(before.1),
    );
    assert!(grew.0 < vm_mib, "the address space grew {} MiB", grew.0);
    assert!(grew.1 < rss_mib, "the resident set grew {} MiB", grew.1);
}

/// The victim kept moving verified data, each round trip within 2 s.
fn victim_was_served(b: &Beside) {
    assert!(
        b.victim_mb_s > 0.0,
        "the victim moved no data beside the attack"
    );
    assert!(
        b.worst_round_trip < Duration::from_secs(2),
        "a victim round trip took {:?} beside the attack",
        b.worst_round_trip
    );
}

/// One row of the table the flood test prints.
fn report(what: &str, before: (u64, u64), b: &Beside, outcome: &str) {
    println!(
        "| {what} | {} -> {} | {} -> {} | {:.1} | {:?} | {outcome} |",
        before.0, b.peak.0, before.1, b.peak.1, b.victim_mb_s, b.worst_round_trip
    );
}

/// Sends `burst` from `attacker`, then reads what comes back for up to `wait` (or until
/// `enough` Rejects came): (Rejects by reason, statuses, closed by the target).
async fn attack(
    mut attacker: RawConn,
    burst: Vec<u8>,
    wait: Duration,
    enough: usize,
) -> (Counts, Counts, bool) {
    attacker.send_raw(&burst).await;
    let (mut rejects, mut statuses) = (Counts::new(), Counts::new());
    let end = Instant::now() + wait;
    let mut closed = false;
    while !closed && Instant::now() < end && rejects.values().sum::<usize>() < enough {
        closed = drain(
            &mut attacker,
            Duration::from_millis(500),
            &mut rejects,
            &mut statuses,
        )
        .await;
    }
    (rejects, statuses, closed)
}

type Counts = std::collections::BTreeMap<u8, usize>;

/// A normal session logged in for an attack, its ISID's last byte `tag`.
async fn attacker(addr: SocketAddr, tag: u8) -> RawConn {
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = tag;
    c.login(1, &plain_keys()).await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_announced_writes_cost_their_budget_not_their_length() {
    let _serial = SERIAL.lock().await;
    let addr = start_target(LIMITS).await;
    let mut victim = attacker(addr, 0x77).await;
    let (_, alone) = beside_victim(&mut victim, tokio::time::sleep(Duration::from_secs(2))).await;
    let before = memory_mib();
    println!("| attack | VmSize MiB | VmRSS MiB | victim MB/s | victim worst round trip | target's answer |");
    println!("|---|---|---|---|---|---|");
    report("none (the victim alone)", before, &alone, "-");
    victim_was_served(&alone);

    // 1. A discovery session sends 2,000 WRITEs of 64 MiB each (128 GiB announced).
    let mut a = discovery(addr).await;
    let burst: Vec<u8> = (0..2000)
        .flat_map(|_| empty_write(&mut a, BIG_WRITE, false))
        .collect();
    let ((rejects, _, _), b) =
        beside_victim(&mut victim, attack(a, burst, Duration::from_secs(10), 2000)).await;
    report(
        "discovery session, 2,000 WRITEs of 64 MiB",
        before,
        &b,
        &format!("Rejects {rejects:?}"),
    );
    victim_was_served(&b);
    assert_eq!(
        rejects.get(&0x04),
        Some(&2000),
        "every SCSI command in a discovery session is Rejected (protocol error)"
    );
    memory_stayed_under(before, &b, 256, 256);

    // 2. A normal session sends 500 immediate WRITEs of 64 MiB and never their data.
    let mut a = attacker(addr, 0xa2).await;
    let burst: Vec<u8> = (0..500)
        .flat_map(|_| empty_write(&mut a, BIG_WRITE, true))
        .collect();
    let ((rejects, statuses, closed), b) = beside_victim(
        &mut victim,
        attack(a, burst, Duration::from_secs(15), usize::MAX),
    )
    .await;
    report(
        "500 immediate WRITEs of 64 MiB, no data",
        before,
        &b,
        &format!("Rejects {rejects:?}, statuses {statuses:?}, closed {closed}"),
    );
    victim_was_served(&b);
    let refused = rejects.get(&0x06).copied().unwrap_or(0);
    assert!(
        refused >= 500 - 4,
        "past max_immediate_commands each is Rejected with 0x06 ({refused})"
    );
    assert!(
        closed,
        "the write that never got its data ended the connection"
    );
    memory_stayed_under(before, &b, 384, 256);

    // 3. A normal session fills its window with 128 WRITEs of 64 MiB and sends no data:
    // one has its 64 MiB reserved and asked for, the others wait for room, and the
    // connection ends when the data does not come.
    let mut a = attacker(addr, 0xa3).await;
    let burst: Vec<u8> = (0..128)
        .flat_map(|_| empty_write(&mut a, BIG_WRITE, false))
        .collect();
    let ((_, statuses, closed), b) = beside_victim(
        &mut victim,
        attack(a, burst, Duration::from_secs(15), usize::MAX),
    )
    .await;
    report(
        "a window of 128 WRITEs of 64 MiB, no data",
        before,
        &b,
        &format!("statuses {statuses:?}, closed {closed}"),
    );
    victim_was_served(&b);
    assert!(
        closed,
        "the write that never got its data ended the connection"
    );
    memory_stayed_under(before, &b, 384, 256);

    // 4. A session fills its window with 128 READs of 32 MiB (4 GiB) and reads nothing:
    // read data is reserved before it is produced, so the connection holds its 64 MiB
    // until the target drops it for taking nothing.
    let mut a = attacker(addr, 0xa4).await;
    let burst: Vec<u8> = (0..128)
        .flat_map(|_| a.scsi_bhs(&read10(0, 0xffff), 0xffff * 512, 0, 0))
        .collect();
    let never_reads = async move {
        let mut a = a;
        a.send_raw(&burst).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        a.closed_by_target(100_000).await
    };
    let (closed, b) = beside_victim(&mut victim, never_reads).await;
    report(
        "a window of 128 READs of 32 MiB, never read",
        before,
        &b,
        &format!("closed {closed}"),
    );
    victim_was_served(&b);
    assert!(closed, "the peer that takes nothing lost its connection");
    memory_stayed_under(before, &b, 384, 256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_budget_ends_with_task_set_full_and_runs_when_room_is_back() {
    let _serial = SERIAL.lock().await;
    // The default data-out timeout (30 s): the first write may wait for its data.
    let addr = start_target("connection_memory_mib = 64\nsession_memory_mib = 128").await;
    let mut c = RawConn::connect(addr).await;
    c.login(1, &plain_keys()).await;
    // The first write takes the connection's whole budget and waits for its data.
    let first = empty_write(&mut c, BIG_WRITE, false);
    c.send(&first, &[]).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.opcode(), 0x31, "an R2T for the first write");
    // The second cannot get room within 5 s: TASK SET FULL, unexecuted.
    let data = pattern(4096, 9);
    let second = c.scsi_bhs(&write10(7, 8), 0, 4096, 0);
    let itt = be32(&second[16..20]);
    let start = Instant::now();
    c.send(&second, &[]).await;
    let rsp = c.recv().await;
    assert_eq!(
        (rsp.opcode(), rsp.itt()),
        (0x21, itt),
        "the second write's response"
    );
    assert_eq!(rsp.bhs[3], 0x28, "TASK SET FULL");
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "it waited for room first"
    );
    c.exp_stat_sn = rsp.field32(24).wrapping_add(1);
    // The first write's data comes; then the same write runs.
    let first_itt = be32(&first[16..20]);
    let whole = vec![0x5a; BIG_WRITE as usize];
    let (st, _, _) = c.finish_after_r2t(first_itt, r2t, &whole).await;
    assert_eq!(st, 0, "the first write");
    let (st, _, _) = c.command(&write10(7, 8), 0, &data).await;
    assert_eq!(st, 0, "the same write once room is back");
    read_back(&mut c, 7, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_unsolicited_data_finds_no_room_gets_task_set_full_and_its_data_is_swallowed()
{
    let _serial = SERIAL.lock().await;
    let addr = start_target("connection_memory_mib = 64\nsession_memory_mib = 128").await;
    let mut c = RawConn::connect(addr).await;
    let keys = plain_keys_with(&[("ImmediateData", "Yes"), ("InitialR2T", "No")]);
    let got = c.login(1, &keys).await;
    assert_eq!(got.get("InitialR2T").map(String::as_str), Some("No"));
    // The first write takes the connection's whole budget and waits for its data.
    let first = empty_write(&mut c, BIG_WRITE, false);
    c.send(&first, &[]).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.opcode(), 0x31, "an R2T for the first write");
    // The second brings 16 KiB immediate and 16 KiB unsolicited data: no room even for
    // that, held at its arrival.
    let data = pattern(32768, 5);
    let unsolicited_write = |c: &mut RawConn| {
        let mut b = c.scsi_bhs(&write10(9, 64), 0, 32768, 16384);
        b[1] &= !0x80; // unsolicited Data-Out follows
        b
    };
    let second = unsolicited_write(&mut c);
    let itt = be32(&second[16..20]);
    let start = Instant::now();
    c.send(&second, &data[..16384]).await;
    c.data_out(itt, u32::MAX, 16384, &data[16384..]).await;
    let rsp = c.recv().await;
    assert_eq!(
        (rsp.opcode(), rsp.itt()),
        (0x21, itt),
        "the second write's response"
    );
    assert_eq!(rsp.bhs[3], 0x28, "TASK SET FULL");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "refused at once: its unsolicited data had no room when it came"
    );
    c.exp_stat_sn = rsp.field32(24).wrapping_add(1);
    // Its Data-Out were swallowed: no Reject, no R2T, and the connection goes on.
    assert!(
        c.recv_within(Duration::from_millis(500)).await.is_none(),
        "nothing more for the refused write"
    );
    let first_itt = be32(&first[16..20]);
    let whole = vec![0x5a; BIG_WRITE as usize];
    let (st, _, _) = c.finish_after_r2t(first_itt, r2t, &whole).await;
    assert_eq!(st, 0, "the first write");
    // The same write, unsolicited data and all, runs once room is back.
    let again = unsolicited_write(&mut c);
    let itt = be32(&again[16..20]);
    c.send(&again, &data[..16384]).await;
    c.data_out(itt, u32::MAX, 16384, &data[16384..]).await;
    let (st, _, _) = c.finish(itt, &data).await;
    assert_eq!(st, 0, "the same write once room is back");
    read_back(&mut c, 9, &data).await;
}

/// A READ(10) of 1 MiB less 1 KiB: with the 1 KiB a task kept at ErrorRecoveryLevel 2
/// counts, 64 of them take a 64 MiB connection budget exactly.
const KEPT_READ_BLOCKS: u16 = 2046;

/// Sends `n` READs of `blocks` without acknowledging any status, and reads their answers:
/// their SCSI statuses, the time the last took, and the highest StatSN.
async fn reads_of_never_acknowledged(
    c: &mut RawConn,
    n: usize,
    blocks: u16,
) -> (Counts, Duration, u32) {
    let len = u32::from(blocks) * 512;
    let burst: Vec<u8> = (0..n)
        .flat_map(|i| c.scsi_bhs(&read10(i as u32 * 4096, blocks), len, 0, 0))
        .collect();
    let start = Instant::now();
    c.send_raw(&burst).await;
    let (mut statuses, mut stat_sn) = (Counts::new(), 0);
    while statuses.values().sum::<usize>() < n {
        let r = c.recv().await;
        let status_in_data_in = r.opcode() == 0x25 && r.bhs[1] & 0x01 != 0;
        if r.opcode() == 0x21 || status_in_data_in {
            *statuses.entry(r.bhs[3]).or_default() += 1;
            stat_sn = stat_sn.max(r.field32(24));
        }
    }
    (statuses, start.elapsed(), stat_sn)
}

/// [`reads_of_never_acknowledged`] of [`KEPT_READ_BLOCKS`] each.
async fn reads_never_acknowledged(c: &mut RawConn, n: usize) -> (Counts, Duration, u32) {
    reads_of_never_acknowledged(c, n, KEPT_READ_BLOCKS).await
}

/// Sends `n` NOP-Out pings without acknowledging any status, and reads their NOP-Ins (each
/// a status); the highest StatSN.
async fn pings_never_acknowledged(c: &mut RawConn, n: usize) -> u32 {
    let burst: Vec<u8> = (0..n)
        .flat_map(|_| {
            let itt = c.itt();
            c.nop_out(itt, 0)
        })
        .collect();
    c.send_raw(&burst).await;
    let (mut answered, mut stat_sn) = (0, 0);
    while answered < n {
        let r = c.recv().await;
        if r.opcode() == 0x20 && r.itt() != u32::MAX {
            answered += 1;
            stat_sn = stat_sn.max(r.field32(24));
        }
    }
    stat_sn
}

/// A session at ErrorRecoveryLevel `erl` with a target of its own (a 512 MiB RAM LUN;
/// budgets of 64 MiB a connection, 128 MiB a session, 192 MiB in all).
async fn erl_session(erl: u8) -> RawConn {
    let addr = start_target_with(
        "connection_memory_mib = 64\nsession_memory_mib = 128\nmemory_mib = 192",
        &format!("error_recovery_level = {erl}"),
        "size = \"512MiB\"\nbackend = \"memory\"",
    )
    .await;
    let mut c = RawConn::connect(addr).await;
    let erl = erl.to_string();
    let got = c
        .login(1, &plain_keys_with(&[("ErrorRecoveryLevel", &erl)]))
        .await;
    assert_eq!(got.get("ErrorRecoveryLevel"), Some(&erl));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_kept_at_erl_2_for_an_initiator_that_never_acknowledges_stay_in_its_budget() {
    let _serial = SERIAL.lock().await;
    let mut c = erl_session(2).await;
    let before = memory_mib();

    // 64 READs fill the connection's budget with what is kept for them.
    let (statuses, _, _) = reads_never_acknowledged(&mut c, 64).await;
    assert_eq!(
        statuses.get(&0),
        Some(&64),
        "the budget holds 64: {statuses:?}"
    );
    // More find no room even to be kept: TASK SET FULL at once, whatever the window says.
    let (statuses, took, last_stat_sn) = reads_never_acknowledged(&mut c, 16).await;
    assert_eq!(
        statuses.get(&0x28),
        Some(&16),
        "TASK SET FULL: {statuses:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "refused as they came, not after waiting for room ({took:?})"
    );
    let grew = memory_mib().1.saturating_sub(before.1);
    println!("resident set grew {grew} MiB while 64 MiB of responses were kept");
    assert!(grew < 128, "the resident set grew {grew} MiB");

    // An acknowledgement (a NOP-Out's ExpStatSN) gives the room back.
    c.exp_stat_sn = last_stat_sn.wrapping_add(1);
    c.ping(b"ack").await;
    let (statuses, _, _) = reads_never_acknowledged(&mut c, 64).await;
    assert_eq!(
        statuses.get(&0),
        Some(&64),
        "served again once acknowledged: {statuses:?}"
    );

    // Statuses pushed out of retention unacknowledged (1,024 are kept) can never be
    // acknowledged: what they ended is forgotten, and its room given back.
    pings_never_acknowledged(&mut c, 1100).await;
    let (statuses, _, last_stat_sn) = reads_never_acknowledged(&mut c, 64).await;
    assert_eq!(
        statuses.get(&0),
        Some(&64),
        "room given back by statuses no longer retained: {statuses:?}"
    );
    c.exp_stat_sn = last_stat_sn.wrapping_add(1);
    roundtrip(&mut c, 200_000, 64, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_data_kept_at_erl_1_goes_when_acknowledged_though_no_read_can_be_sent() {
    let _serial = SERIAL.lock().await;
    let mut c = erl_session(1).await;
    // 64 READs of 1 MiB, kept for Data SNACK, fill the connection's budget.
    let (statuses, _, last_stat_sn) = reads_of_never_acknowledged(&mut c, 64, 2048).await;
    assert_eq!(statuses.get(&0), Some(&64), "{statuses:?}");
    // Acknowledged by a NOP-Out: the data goes though no read was sent since.
    c.exp_stat_sn = last_stat_sn.wrapping_add(1);
    c.ping(b"ack").await;
    let (statuses, took, _) = reads_of_never_acknowledged(&mut c, 64, 2048).await;
    assert_eq!(
        statuses.get(&0),
        Some(&64),
        "served once acknowledged: {statuses:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "without waiting for room ({took:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_kept_for_an_initiator_that_never_acknowledges_hold_their_bytes_only() {
    let _serial = SERIAL.lock().await;
    let addr = start_target(LIMITS).await;
    let mut c = attacker(addr, 0xa5).await;
    let before = memory_mib();
    // 1,024 rounds of 248 KiB of Data-Out for no task (discarded) and an 8 KiB ping, each
    // round read by the target into a buffer of its own; the NOP-In echoing each ping is a
    // status kept until acknowledged, which never comes.
    let segment = pattern(8192, 1);
    let mut padding = Vec::new();
    for i in 0..31u32 {
        let mut b = bhs(0x05, 0x80, segment.len(), 0x7000_0000);
        b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        b[40..44].copy_from_slice(&(i * 8192).to_be_bytes());
        padding.extend_from_slice(&b);
        padding.extend_from_slice(&segment);
    }
    for _ in 0..1024 {
        c.send_raw(&padding).await;
        c.ping(&segment).await;
    }
    let grew = memory_mib().1.saturating_sub(before.1);
    println!("resident set grew {grew} MiB for 1,024 unacknowledged NOP-In echoes of 8 KiB");
    assert!(
        grew < 64,
        "a kept echo holds its 8 KiB, not the receive buffer it came in ({grew} MiB)"
    );
    c.exp_stat_sn = c.ping(b"ack").await.field32(24).wrapping_add(1);
    roundtrip(&mut c, 4096, 64, 4).await;

    // 1,024 pings of 256 KiB (the target's MaxRecvDataSegmentLength), echoed whole to a
    // peer that takes segments as large: 256 MiB of echoes kept, if nothing counted them.
    let mut big = RawConn::connect(addr).await;
    big.isid[5] = 0xa6;
    let keys = plain_keys_with(&[("MaxRecvDataSegmentLength", "262144")]);
    big.login(1, &keys).await;
    let ping = pattern(262_144, 2);
    let mut last = None;
    for _ in 0..1024 {
        let echo = big.ping(&ping).await;
        assert_eq!(echo.data.len(), ping.len(), "echoed whole");
        last = Some(echo.field32(24));
        let now = memory_mib();
        let grew = now.1.saturating_sub(before.1);
        assert!(
            grew < 160,
            "kept echoes count in the connection's 64 MiB budget ({grew} MiB)"
        );
    }
    big.exp_stat_sn = last.expect("echoes").wrapping_add(1);
    big.ping(b"ack").await;
    roundtrip(&mut big, 8192, 64, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_reads_nothing_is_dropped_whatever_it_sends() {
    let _serial = SERIAL.lock().await;
    let addr = start_target(LIMITS).await;
    let mut c = RawConn::connect(addr).await;
    c.login(1, &plain_keys()).await;
    // Pings with 64 KiB payloads, never reading the echoes: the target's answers fill the
    // socket, and the peer keeps "proving" it is alive.
    let payload = vec![0xab; 65536];
    let start = Instant::now();
    let mut sent = 0usize;
    let mut refused = false;
    while start.elapsed() < Duration::from_secs(20) {
        let itt = c.itt();
        let b = c.nop_out(itt, payload.len());
        let mut pdu = b.to_vec();
        pdu.extend_from_slice(&payload);
        let write = tokio::time::timeout(Duration::from_secs(1), c.stream.write_all(&pdu)).await;
        match write {
            Ok(Ok(())) => sent += 1,
            Ok(Err(_)) => {
                refused = true;
                break;
            }
            // The target reads no more either: wait and try again.
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    println!(
        "{sent} pings sent; the target ended the connection after {:?}",
        start.elapsed()
    );
    let closed = refused || c.closed_by_target(100_000).await;
    assert!(closed, "the non-reading peer's connection was dropped");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "within the stall timeout and a margin"
    );
    healthy_session(addr, 300, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_data_never_comes_ends_its_connection_though_pings_go_on() {
    let _serial = SERIAL.lock().await;
    let addr = start_target("data_out_timeout_secs = 2").await;
    let mut c = RawConn::connect(addr).await;
    c.login(1, &plain_keys()).await;
    let w = c.scsi_bhs(&write10(0, 8), 0, 4096, 0);
    c.send(&w, &[]).await;
    assert_eq!(c.recv().await.opcode(), 0x31, "an R2T");
    let start = Instant::now();
    let mut closed = false;
    while start.elapsed() < Duration::from_secs(10) {
        // Immediate pings, answered: the peer is alive, but sends no data.
        let itt = c.itt();
        let b = c.nop_out(itt, 0);
        if c.stream.write_all(&b).await.is_err() {
            closed = true;
            break;
        }
        match tokio::time::timeout(Duration::from_millis(800), c.try_recv()).await {
            Ok(None) => {
                closed = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    assert!(closed, "no data for 2 s ended the connection");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(6),
        "after {took:?}"
    );
    healthy_session(addr, 400, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_reset_touches_only_the_target_it_was_sent_to() {
    let _serial = SERIAL.lock().await;
    log_from_env();
    let other = "iqn.2026-11.org.ironsan.test:other";
    let text = format!(
        "portals = [\"127.0.0.1:0\"]\n\
         [[target]]\nname = \"{IQN}\"\n[target.lun.0]\nsize = \"16MiB\"\nbackend = \"memory\"\n\
         [[target]]\nname = \"{other}\"\n[target.lun.0]\nsize = \"16MiB\"\nbackend = \"memory\"\n"
    );
    let addr = test_support::start_target(&text).await;

    // On the other target, a write waits for its data.
    let mut victim = RawConn::connect(addr).await;
    victim.target_name = other.to_string();
    victim.isid[5] = 0x01;
    victim.login(1, &plain_keys()).await;
    let data = pattern(4096, 4);
    let w = victim.scsi_bhs(&write10(5, 8), 0, 4096, 0);
    let itt = be32(&w[16..20]);
    victim.send(&w, &[]).await;
    let r2t = victim.recv().await;
    assert_eq!(r2t.opcode(), 0x31, "an R2T");

    // A session on the first target resets its LUN 0.
    let mut resetter = RawConn::connect(addr).await;
    resetter.isid[5] = 0x02;
    resetter.login(1, &plain_keys()).await;
    let ritt = resetter.itt();
    let mut tmf = bhs(0x02, 0x80 | 5, 0, ritt); // LOGICAL UNIT RESET
    tmf[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    tmf[24..28].copy_from_slice(&resetter.cmd_sn.to_be_bytes());
    tmf[28..32].copy_from_slice(&resetter.exp_stat_sn.to_be_bytes());
    resetter.cmd_sn = resetter.cmd_sn.wrapping_add(1);
    resetter.send(&tmf, &[]).await;
    let rsp = resetter.recv().await;
    assert_eq!(
        (rsp.opcode(), rsp.bhs[2]),
        (0x22, 0),
        "LOGICAL UNIT RESET: function complete"
    );

    // The other target's write goes on: its data is taken and it ends GOOD.
    let (st, _, _) = victim.finish_after_r2t(itt, r2t, &data).await;
    assert_eq!(st, 0, "the other target's write");
    read_back(&mut victim, 5, &data).await;
}

#[test]
fn budgets_that_do_not_nest_or_cannot_take_a_write_are_config_errors_naming_the_line() {
    let error = |text: &str| iscsi_target::Config::parse(text, "x.toml").unwrap_err().0;
    let e = error("queue_depth = 8\nconnection_memory_mib = 32\n");
    assert!(
        e.starts_with("x.toml:2:") && e.contains("at least 64"),
        "{e}"
    );
    let e = error("session_memory_mib = 128\nconnection_memory_mib = 256\n");
    assert!(
        e.starts_with("x.toml:2:") && e.contains("at most session_memory_mib = 128"),
        "{e}"
    );
    // The session's default (256) does not fit: the line of the key that is set.
    let e = error("memory_mib = 100\n");
    assert!(
        e.starts_with("x.toml:1:") && e.contains("memory_mib"),
        "{e}"
    );
    let e = error("\ndata_out_timeout_secs = 0\n");
    assert!(
        e.starts_with("x.toml:2:") && e.contains("at least 1"),
        "{e}"
    );
    let e = error("max_sessions = 70000\n");
    assert!(e.starts_with("x.toml:1:") && e.contains("65535"), "{e}");
}
