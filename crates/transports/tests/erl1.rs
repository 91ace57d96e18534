//! ErrorRecoveryLevel 1 on the target, driven by a raw initiator over loopback: digest
//! errors are mended inside the connection (a Reject and a recovery R2T for lost write data,
//! a discarded PDU for a bad header), and SNACKs have status, Data-In and R2Ts sent again as
//! first sent. Every scenario ends with the data read back intact on the same connection.
//! At level 0 the same faults still end the connection, and SNACK is refused.

use test_support::raw_tcp::*;

const ERL1: &str = "[[target]]\nname = \"iqn.2026-11.org.ironsan.test:erl1\"\nerror_recovery_level = 1\n[target.lun.0]\nsize = \"16MiB\"\nbackend = \"memory\"\n";

/// Logs in to the level 1 target at `addr` (ISID byte `seed`) offering `keys`, both
/// digests on from full feature phase; returns the session and the target's answers.
async fn login_erl1_target(
    addr: std::net::SocketAddr,
    seed: u8,
    keys: &[(&str, &str)],
) -> (RawConn, std::collections::HashMap<String, String>) {
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = seed;
    c.target_name = "iqn.2026-11.org.ironsan.test:erl1".into();
    let got = c.login(1, keys).await;
    c.header_digest = true;
    c.data_digest = true;
    (c, got)
}

/// The target of `start_target` plus one at ErrorRecoveryLevel 1; a session to the latter
/// with both digests, 8 KiB segments each way and R2T for every write.
async fn erl1_session(seed: u8) -> RawConn {
    let addr = start_target(ERL1).await;
    let (c, got) = login_erl1_target(addr, seed, &keys("1")).await;
    assert_eq!(got.get("ErrorRecoveryLevel").map(String::as_str), Some("1"));
    c
}

fn keys(erl: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("HeaderDigest", "CRC32C"),
        ("DataDigest", "CRC32C"),
        ("ImmediateData", "No"),
        ("InitialR2T", "Yes"),
        ("MaxRecvDataSegmentLength", "8192"),
        ("MaxBurstLength", "65536"),
        ("FirstBurstLength", "65536"),
        ("ErrorRecoveryLevel", erl),
    ]
}

/// A SNACK Request (opcode 0x10) of `kind` for `itt`, BegRun and RunLength.
fn snack(c: &RawConn, kind: u8, itt: u32, beg_run: u32, run_length: u32) -> [u8; 48] {
    let mut b = bhs(0x10, 0x80 | kind, 0, itt);
    b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    b[28..32].copy_from_slice(&c.exp_stat_sn.to_be_bytes());
    b[40..44].copy_from_slice(&beg_run.to_be_bytes());
    b[44..48].copy_from_slice(&run_length.to_be_bytes());
    b
}

/// A Data-Out (opcode 0x05) header.
fn data_out_bhs(
    c: &RawConn,
    itt: u32,
    ttt: u32,
    data_sn: u32,
    offset: u32,
    len: usize,
    last: bool,
) -> [u8; 48] {
    let mut b = bhs(0x05, if last { 0x80 } else { 0 }, len, itt);
    b[20..24].copy_from_slice(&ttt.to_be_bytes());
    b[28..32].copy_from_slice(&c.exp_stat_sn.to_be_bytes());
    b[36..40].copy_from_slice(&data_sn.to_be_bytes());
    b[40..44].copy_from_slice(&offset.to_be_bytes());
    b
}

/// Sends a WRITE(10) of `data` at `lba` (solicited data only) and takes its first R2T:
/// returns the ITT and the R2T's TTT.
async fn start_write(c: &mut RawConn, lba: u32, data: &[u8]) -> (u32, u32) {
    let b = c.scsi_bhs(
        &write10(lba, (data.len() / 512) as u16),
        0,
        data.len() as u32,
        0,
    );
    let itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.opcode(), 0x31, "R2T");
    (itt, r2t.field32(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_data_out_is_rejected_and_asked_for_again_by_recovery_r2t() {
    let mut c = erl1_session(1).await;
    let data = pattern(65536, 3);
    let (itt, ttt) = start_write(&mut c, 10, &data).await;
    // Eight 8 KiB Data-Outs; the third's payload arrives with a wrong data digest.
    for sn in 0..8u32 {
        let off = sn * 8192;
        let h = data_out_bhs(&c, itt, ttt, sn, off, 8192, sn == 7);
        if sn == 2 {
            c.corrupt_next = Some(Corrupt::Data);
        }
        c.send(&h, &data[off as usize..off as usize + 8192]).await;
    }
    // The Reject (a status, through the iSCSI layer) and the recovery R2T (from the
    // transport) may come in either order.
    let (a, b) = (c.recv().await, c.recv().await);
    let (reject, again) = if a.opcode() == 0x3f { (a, b) } else { (b, a) };
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x02),
        "Reject, data digest error"
    );
    assert_eq!(
        be32(&reject.data[36..40]),
        2,
        "the rejected header is the DataSN 2 Data-Out"
    );
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    assert_eq!(again.opcode(), 0x31, "recovery R2T");
    assert_eq!(
        (again.field32(36), again.field32(40), again.field32(44)),
        (1, 16384, 8192),
        "R2TSN 1 for the lost 8 KiB at 16384"
    );
    assert_ne!(again.field32(20), ttt, "a new TTT");
    let (st, _, _) = {
        c.data_out(itt, again.field32(20), 16384, &data[16384..24576])
            .await;
        c.finish(itt, &data).await
    };
    assert_eq!(st, 0, "WRITE completes after the recovery R2T");
    read_back(&mut c, 10, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_out_lost_to_a_header_digest_error_leaves_a_gap_that_is_asked_for_again() {
    let mut c = erl1_session(2).await;
    let data = pattern(32768, 4);
    let (itt, ttt) = start_write(&mut c, 200, &data).await;
    for sn in 0..4u32 {
        let off = sn * 8192;
        if sn == 1 {
            c.corrupt_next = Some(Corrupt::Header);
        }
        let h = data_out_bhs(&c, itt, ttt, sn, off, 8192, sn == 3);
        c.send(&h, &data[off as usize..off as usize + 8192]).await;
    }
    let again = c.recv().await;
    assert_eq!(again.opcode(), 0x31, "recovery R2T after the DataSN gap");
    assert_eq!((again.field32(40), again.field32(44)), (8192, 8192));
    c.data_out(itt, again.field32(20), 8192, &data[8192..16384])
        .await;
    let (st, _, _) = c.finish(itt, &data).await;
    assert_eq!(st, 0);
    // A NOP-Out ping with a bad header is dropped without an answer; the next is answered.
    c.corrupt_next = Some(Corrupt::Header);
    let itt = c.itt();
    let p = c.nop_out(itt, 0);
    c.send(&p, &[]).await;
    let pong = c.ping(b"after").await;
    assert_eq!(pong.data, b"after");
    read_back(&mut c, 200, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_final_data_out_is_asked_for_again_after_the_sequence_reception_timeout() {
    let mut c = erl1_session(9).await;
    let data = pattern(16384, 11);
    let (itt, ttt) = start_write(&mut c, 700, &data).await;
    c.send(
        &data_out_bhs(&c, itt, ttt, 0, 0, 8192, false),
        &data[..8192],
    )
    .await;
    // The final Data-Out's header is damaged: the target discards it and nothing follows.
    c.corrupt_next = Some(Corrupt::Header);
    c.send(
        &data_out_bhs(&c, itt, ttt, 1, 8192, 8192, true),
        &data[8192..],
    )
    .await;
    let again = c.recv().await; // within WAIT (10 s); the timeout is 5 s
    assert_eq!(again.opcode(), 0x31, "recovery R2T after the timeout");
    assert_eq!((again.field32(40), again.field32(44)), (8192, 8192));
    c.data_out(itt, again.field32(20), 8192, &data[8192..])
        .await;
    let (st, _, _) = c.finish(itt, &data).await;
    assert_eq!(st, 0);
    read_back(&mut c, 700, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_with_corrupted_immediate_data_is_rejected_and_can_be_retried() {
    let addr = start_target(ERL1).await;
    let mut k = keys("1");
    k.retain(|(key, _)| *key != "ImmediateData");
    k.push(("ImmediateData", "Yes"));
    let (mut c, _) = login_erl1_target(addr, 3, &k).await;
    let data = pattern(4096, 5);
    let b = c.scsi_bhs(&write10(300, 8), 0, 4096, 4096);
    c.corrupt_next = Some(Corrupt::Data);
    c.send(&b, &data).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x02),
        "Reject, data digest error"
    );
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    // The command was discarded: the same command again (same ITT and CmdSN) runs.
    c.send(&b, &data).await;
    let (st, _, _) = c.finish(be32(&b[16..20]), &data).await;
    assert_eq!(st, 0, "the retried WRITE");
    read_back(&mut c, 300, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_snack_resends_the_response_with_its_statsn() {
    let mut c = erl1_session(4).await;
    let (st, _, _) = c.command(&write10(400, 8), 0, &pattern(4096, 6)).await;
    assert_eq!(st, 0);
    // The initiator "lost" that response: ask for it again without acknowledging it.
    let lost = c.exp_stat_sn.wrapping_sub(1);
    c.exp_stat_sn = lost;
    let s = snack(&c, 1, u32::MAX, lost, 1);
    c.send(&s, &[]).await;
    let again = c.recv().await;
    assert_eq!(again.opcode(), 0x21, "SCSI Response again");
    assert_eq!(
        (again.field32(24), again.bhs[3]),
        (lost, 0),
        "same StatSN, GOOD"
    );
    // A StatSN never sent is refused.
    let s = snack(&c, 1, u32::MAX, lost.wrapping_add(5), 1);
    c.send(&s, &[]).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x04),
        "Reject, protocol error"
    );
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    read_back(&mut c, 400, &pattern(4096, 6)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_snack_resends_data_in_as_first_sent_until_the_status_is_acknowledged() {
    let mut c = erl1_session(5).await;
    let data = pattern(65536, 7);
    let (st, _, _) = c.command(&write10(500, 128), 0, &data).await;
    assert_eq!(st, 0);
    // A 64 KiB READ: eight 8 KiB Data-In, status in the last.
    let b = c.scsi_bhs(&read10(500, 128), 65536, 0, 0);
    let itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    let mut first = Vec::new();
    for _ in 0..8 {
        let d = c.recv().await;
        assert_eq!(d.opcode(), 0x25);
        first.push(d);
    }
    let status_sn = first[7].field32(24);
    assert!(first[7].bhs[1] & 0x01 != 0, "status in the last Data-In");
    // DataSN 3 and 4 "lost": asked for again while the status is not acknowledged.
    c.exp_stat_sn = status_sn;
    let s = snack(&c, 0, itt, 3, 2);
    c.send(&s, &[]).await;
    for sn in [3usize, 4] {
        let d = c.recv().await;
        assert_eq!(d.opcode(), 0x25);
        assert_eq!(d.field32(36), sn as u32, "DataSN");
        assert_eq!(d.field32(40), first[sn].field32(40), "buffer offset");
        assert!(d.data == first[sn].data, "the same bytes");
    }
    // RunLength 0: from DataSN 6 to the end, the status again in the last with its StatSN.
    let s = snack(&c, 0, itt, 6, 0);
    c.send(&s, &[]).await;
    let (d6, d7) = (c.recv().await, c.recv().await);
    assert_eq!((d6.field32(36), d7.field32(36)), (6, 7));
    assert_eq!(
        (d7.bhs[1] & 0x01, d7.field32(24)),
        (0x01, status_sn),
        "status and StatSN as first sent"
    );
    // Acknowledged (ExpStatSN past the status): the data is no longer kept.
    c.exp_stat_sn = status_sn.wrapping_add(1);
    c.ping(b"ack").await;
    let s = snack(&c, 0, itt, 0, 0);
    c.send(&s, &[]).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x04),
        "Reject, protocol error"
    );
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    read_back(&mut c, 500, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_data_in_of_a_sequence_asks_for_a_dataack_which_frees_what_came_before() {
    let mut c = erl1_session(9).await;
    let data = pattern(131072, 3);
    let (st, _, _) = c.command(&write10(900, 256), 0, &data).await;
    assert_eq!(st, 0);
    // A 128 KiB READ in 64 KiB bursts of 8 KiB Data-In: the last of the first sequence
    // (DataSN 7) asks for acknowledgement with the A bit and a tag; the last of all carries
    // the status and asks nothing (the status's acknowledgement covers it).
    let b = c.scsi_bhs(&read10(900, 256), 131072, 0, 0);
    let itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    let mut got = Vec::new();
    for _ in 0..16 {
        let d = c.recv().await;
        assert_eq!(d.opcode(), 0x25);
        got.push(d);
    }
    let acks: Vec<_> = got.iter().filter(|d| d.bhs[1] & 0x40 != 0).collect();
    assert_eq!(acks.len(), 1, "one acknowledgement request");
    assert_eq!(
        acks[0].field32(36),
        7,
        "on the last Data-In of the first sequence"
    );
    let tag = acks[0].field32(20);
    assert_ne!(tag, u32::MAX, "with a tag to echo");
    assert!(got[15].bhs[1] & 0x01 != 0 && got[15].bhs[1] & 0x40 == 0);
    c.exp_stat_sn = got[15].field32(24);
    // DataACK (SNACK type 2, ITT reserved, the tag, BegRun 8): DataSN 0-7 are no longer
    // kept; 8 on still are, until the status is acknowledged.
    let mut ack = snack(&c, 2, u32::MAX, 8, 0);
    ack[20..24].copy_from_slice(&tag.to_be_bytes());
    c.send(&ack, &[]).await;
    c.send(&snack(&c, 0, itt, 3, 1), &[]).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x04),
        "an acknowledged Data-In is not sent again"
    );
    c.send(&snack(&c, 0, itt, 9, 1), &[]).await;
    let d = c.recv().await;
    assert_eq!((d.opcode(), d.field32(36)), (0x25, 9));
    assert!(d.data == got[9].data, "the same bytes");
    c.exp_stat_sn = c.exp_stat_sn.wrapping_add(1);
    read_back(&mut c, 900, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_smaller_max_recv_data_segment_length_an_r_data_snack_resends_the_read_cut_anew() {
    let mut c = erl1_session(12).await;
    let data = pattern(65536, 11);
    let (st, _, _) = c.command(&write10(600, 128), 0, &data).await;
    assert_eq!(st, 0);
    // A 64 KiB READ in 8 KiB Data-In, status in the last; the status stays unacknowledged.
    let b = c.scsi_bhs(&read10(600, 128), 65536, 0, 0);
    let itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    let mut status_sn = 0;
    for _ in 0..8 {
        let d = c.recv().await;
        assert_eq!((d.opcode(), d.data.len()), (0x25, 8192));
        status_sn = d.field32(24);
    }
    // The initiator now takes 4 KiB segments (a Text negotiation in full feature phase).
    let keys = key_values(&[("MaxRecvDataSegmentLength", "4096")]);
    let mut t = bhs(0x04, 0x80, keys.len(), c.itt());
    t[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    t[24..28].copy_from_slice(&c.cmd_sn.to_be_bytes());
    t[28..32].copy_from_slice(&status_sn.to_be_bytes());
    c.cmd_sn = c.cmd_sn.wrapping_add(1);
    c.send(&t, &keys).await;
    let r = c.recv().await;
    assert_eq!(r.opcode(), 0x24, "Text Response");
    assert!(parse_keys(&r.data).contains_key("MaxRecvDataSegmentLength"));
    c.exp_stat_sn = status_sn;
    // R-Data SNACK (type 3, the SNACK Tag in the TTT field): all 16 Data-In again at 4 KiB,
    // none with status, then a SCSI Response with the tag, the status's StatSN and
    // ExpDataSN 16.
    let mut rd = snack(&c, 3, itt, 0, 0);
    rd[20..24].copy_from_slice(&0x5eed_0001u32.to_be_bytes());
    c.send(&rd, &[]).await;
    let mut got = Vec::new();
    for sn in 0..16 {
        let d = c.recv().await;
        assert_eq!(d.opcode(), 0x25);
        assert_eq!(
            (d.field32(36), d.field32(40)),
            (sn, sn * 4096),
            "DataSN, offset"
        );
        assert_eq!(d.data.len(), 4096);
        assert_eq!(d.bhs[1] & 0x01, 0, "no status in a resent Data-In");
        got.extend_from_slice(&d.data);
    }
    assert!(got == data, "the same bytes, cut anew");
    let rsp = c.recv().await;
    assert_eq!(rsp.opcode(), 0x21, "SCSI Response");
    assert_eq!(
        (
            rsp.bhs[3],
            rsp.field32(20),
            rsp.field32(24),
            rsp.field32(36)
        ),
        (0, 0x5eed_0001, status_sn, 16),
        "GOOD, SNACK Tag, StatSN as first sent, ExpDataSN"
    );
    // A Status SNACK now gets that Response, tag and all.
    c.send(&snack(&c, 1, u32::MAX, status_sn, 1), &[]).await;
    let again = c.recv().await;
    assert_eq!((again.opcode(), again.field32(20)), (0x21, 0x5eed_0001));
    // BegRun and RunLength must be 0 in an R-Data SNACK.
    let mut bad = snack(&c, 3, itt, 1, 0);
    bad[20..24].copy_from_slice(&7u32.to_be_bytes());
    c.send(&bad, &[]).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x04),
        "Reject, protocol error"
    );
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    read_back(&mut c, 600, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2t_snack_resends_an_outstanding_r2t() {
    let mut c = erl1_session(6).await;
    let data = pattern(16384, 8);
    let b = c.scsi_bhs(&write10(600, 32), 0, data.len() as u32, 0);
    let itt = be32(&b[16..20]);
    c.send(&b, &[]).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.opcode(), 0x31);
    let s = snack(&c, 0, itt, 0, 1);
    c.send(&s, &[]).await;
    let again = c.recv().await;
    assert_eq!(again.opcode(), 0x31, "the R2T again");
    assert_eq!(
        again.bhs[20..48],
        r2t.bhs[20..48],
        "TTT, R2TSN, offset and length as first sent"
    );
    let s = snack(&c, 0, itt, 1, 1);
    c.send(&s, &[]).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x04),
        "R2TSN 1 was never sent"
    );
    assert_eq!(reject.field32(36), 1, "the Reject names the run's start");
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    c.data_out(itt, r2t.field32(20), 0, &data).await;
    let (st, _, _) = c.finish(itt, &data).await;
    assert_eq!(st, 0);
    read_back(&mut c, 600, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_level_0_a_snack_is_refused_and_a_digest_error_ends_the_connection() {
    let addr = start_target(ERL1).await;
    // The ERL 1 target, but the initiator offers 0.
    let (mut c, got) = login_erl1_target(addr, 7, &keys("0")).await;
    assert_eq!(got.get("ErrorRecoveryLevel").map(String::as_str), Some("0"));
    let s = snack(&c, 1, u32::MAX, 0, 0);
    c.send(&s, &[]).await;
    let reject = c.recv().await;
    assert_eq!(
        (reject.opcode(), reject.bhs[2]),
        (0x3f, 0x03),
        "Reject, SNACK reject"
    );
    c.exp_stat_sn = reject.field32(24).wrapping_add(1);
    c.corrupt_next = Some(Corrupt::Data);
    let itt = c.itt();
    let mut p = bhs(0x40, 0x80, 4, itt);
    p[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    p[24..28].copy_from_slice(&c.cmd_sn.to_be_bytes());
    c.send(&p, b"ping").await;
    assert!(
        c.closed_by_target(1).await,
        "ERL 0: a data digest error ends the connection"
    );
    // The default target (level 0) answers an offer of 2 with 0.
    let mut d = RawConn::connect(addr).await;
    d.isid[5] = 8;
    let got = d.login(1, &keys("2")).await;
    assert_eq!(got.get("ErrorRecoveryLevel").map(String::as_str), Some("0"));
}
