//! The initiator's TCP data path (`datamover_tcp::initiator::DataPath`), sans IO: target
//! PDUs encoded by the codec (digests from the reference CRC32C) go in as bytes; Data-Out,
//! notices and errors come out.

use bytes::{Bytes, BytesMut};
use datamover::{InitiatorFfpConfig, InitiatorNotice, Resume};
use datamover_tcp::initiator::DataPath;
use iscsi_wire::{Bhs, DataIn, Digests, NopIn, Pdu, R2t, ScsiResponse};
use proptest::prelude::*;

mod common;

use common::{DIGESTS, PLAIN};

fn path(digests: Digests) -> DataPath {
    path_at(digests, 0)
}

fn path_at(digests: Digests, error_recovery_level: u8) -> DataPath {
    DataPath::new(InitiatorFfpConfig {
        digests,
        max_recv_data_segment_length: 8192,
        max_send_data_segment_length: 4096,
        max_burst_length: 65536,
        exp_stat_sn: 5,
        max_outstanding_unexpected_pdus: 0,
        error_recovery_level,
    })
}

fn command(p: &mut DataPath, itt: u32, read_len: u32, write: Bytes, solicited_from: u32) {
    let mut cmd = datamover::conformance::initiator::command(itt, read_len, write, solicited_from);
    if let Bhs::ScsiCommand(c) = &mut cmd.pdu.bhs {
        c.lun = 0x0001_0000_0000_0000;
    }
    p.command(&cmd);
}

fn wire(bhs: Bhs, data: &[u8], digests: Digests) -> Vec<u8> {
    common::encode(&Pdu::new(bhs, Bytes::copy_from_slice(data)), digests)
}

/// Feeds `bytes` and handles every complete PDU: (Data-Out sent, notices, first error).
fn feed(p: &mut DataPath, bytes: &[u8]) -> (Vec<Pdu>, Vec<InitiatorNotice>, Option<String>) {
    let mut buf = BytesMut::from(bytes);
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..1000 {
        match p.receive(&mut buf, &mut out, &mut notices) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return (out, notices, Some(e)),
        }
    }
    notices.extend(p.take_window());
    (out, notices, None)
}

fn data_in(itt: u32, data_sn: u32, offset: u32, status: bool) -> DataIn {
    DataIn {
        itt,
        data_sn,
        buffer_offset: offset,
        final_: status,
        status_present: status,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 40,
        ..Default::default()
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i % 251) as u8).collect()
}

#[test]
fn read_data_is_assembled_and_arrives_with_the_collapsed_status() {
    for digests in [PLAIN, DIGESTS] {
        let mut p = path(digests);
        command(&mut p, 7, 10000, Bytes::new(), 0);
        let payload = pattern(10000);
        let mut bytes = wire(
            Bhs::DataIn(data_in(7, 0, 0, false)),
            &payload[..6000],
            digests,
        );
        let (_, notices, err) = feed(&mut p, &bytes);
        assert!(err.is_none());
        assert!(
            matches!(
                &notices[..],
                [InitiatorNotice::Window {
                    exp_cmd_sn: 2,
                    max_cmd_sn: 40
                }]
            ),
            "{notices:?}"
        );
        bytes = wire(
            Bhs::DataIn(data_in(7, 1, 6000, true)),
            &payload[6000..],
            digests,
        );
        let (_, notices, err) = feed(&mut p, &bytes);
        assert!(err.is_none());
        let [InitiatorNotice::Status { pdu, read }] = &notices[..] else {
            panic!("{notices:?}")
        };
        assert!(matches!(&pdu.bhs, Bhs::DataIn(d) if d.status_present && d.itt == 7));
        assert_eq!(&read[..], &payload[..]);
        assert_eq!(p.in_flight(), 0);
    }
}

#[test]
fn a_data_digest_error_ends_the_connection() {
    let mut p = path(DIGESTS);
    command(&mut p, 1, 6, Bytes::new(), 0);
    let mut bytes = wire(Bhs::DataIn(data_in(1, 0, 0, true)), b"abcdef", DIGESTS);
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    let (_, notices, err) = feed(&mut p, &bytes);
    assert!(notices.is_empty());
    assert!(err.unwrap().contains("data digest"));
    // The same bytes unharmed are accepted.
    let mut p = path(DIGESTS);
    command(&mut p, 1, 6, Bytes::new(), 0);
    let bytes = wire(Bhs::DataIn(data_in(1, 0, 0, true)), b"abcdef", DIGESTS);
    let (_, notices, err) = feed(&mut p, &bytes);
    assert!(err.is_none());
    assert!(
        matches!(&notices[..], [InitiatorNotice::Status { read, .. }] if &read[..] == b"abcdef")
    );
}

/// The read data of the Status notice among `notices`, if one is there.
fn status_read(notices: &[InitiatorNotice]) -> Option<&Bytes> {
    notices.iter().find_map(|n| match n {
        InitiatorNotice::Status { read, .. } => Some(read),
        _ => None,
    })
}

/// The SNACKs among `out`: (ITT, BegRun, RunLength, ExpStatSN).
fn snacks(out: &[Pdu]) -> Vec<(u32, u32, u32, u32)> {
    out.iter()
        .filter_map(|p| match &p.bhs {
            Bhs::SnackRequest(s) if s.snack_type == 0 => {
                Some((s.itt, s.beg_run, s.run_length, s.exp_stat_sn))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn at_erl1_a_corrupted_data_in_is_asked_for_again_and_the_status_waits_for_it() {
    let mut p = path_at(DIGESTS, 1);
    let payload = pattern(12000);
    command(&mut p, 9, 12000, Bytes::new(), 0);
    let pdu = |sn: u32, off: usize, len: usize, status: bool| {
        wire(
            Bhs::DataIn(data_in(9, sn, off as u32, status)),
            &payload[off..off + len],
            DIGESTS,
        )
    };
    // DataSN 1 arrives corrupted (a payload byte flipped), 0 and 2 (with status) intact.
    let mut bytes = pdu(0, 0, 4000, false);
    let mut bad = pdu(1, 4000, 4000, false);
    bad[48 + 4 + 100] ^= 0x40;
    bytes.extend_from_slice(&bad);
    bytes.extend_from_slice(&pdu(2, 8000, 4000, true));
    let (out, notices, err) = feed(&mut p, &bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        snacks(&out),
        [(9, 1, 1, 5)],
        "a Data SNACK for DataSN 1, status not acknowledged"
    );
    assert!(
        status_read(&notices).is_none(),
        "the status waits for DataSN 1"
    );
    // The Data-In asked for comes again: the command ends with every byte right.
    let (out, notices, err) = feed(&mut p, &pdu(1, 4000, 4000, false));
    assert!(err.is_none() && out.is_empty());
    let read = status_read(&notices).expect("the command ends");
    assert!(read[..] == payload[..], "every byte right");
    assert_eq!(p.in_flight(), 0);
}

#[test]
fn at_erl1_a_datasn_gap_is_asked_for_and_a_lost_status_in_data_in_comes_again() {
    let mut p = path_at(DIGESTS, 1);
    let payload = pattern(12000);
    command(&mut p, 4, 12000, Bytes::new(), 0);
    let pdu = |sn: u32, off: usize, len: usize, status: bool| {
        wire(
            Bhs::DataIn(data_in(4, sn, off as u32, status)),
            &payload[off..off + len],
            DIGESTS,
        )
    };
    // DataSN 0 never came (a header digest error dropped it); 1 shows the gap. The last,
    // with status, is corrupted: asked for again too, status included.
    let mut bytes = pdu(1, 4000, 4000, false);
    let mut bad = pdu(2, 8000, 4000, true);
    bad[48 + 4 + 7] ^= 1;
    bytes.extend_from_slice(&bad);
    let (out, notices, err) = feed(&mut p, &bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(snacks(&out), [(4, 0, 1, 5), (4, 2, 1, 5)]);
    assert!(status_read(&notices).is_none(), "the status waits");
    let mut again = pdu(2, 8000, 4000, true);
    again.extend_from_slice(&pdu(0, 0, 4000, false));
    let (_, notices, err) = feed(&mut p, &again);
    assert!(err.is_none(), "{err:?}");
    let read = status_read(&notices).expect("the command ends");
    assert!(read[..] == payload[..], "every byte right");
}

#[test]
fn at_erl1_a_link_that_corrupts_every_resend_ends_the_connection() {
    let mut p = path_at(DIGESTS, 1);
    command(&mut p, 2, 6, Bytes::new(), 0);
    let mut bad = wire(Bhs::DataIn(data_in(2, 0, 0, true)), b"abcdef", DIGESTS);
    let n = bad.len();
    bad[n - 1] ^= 1;
    let mut err = None;
    for _ in 0..40 {
        let (_, _, e) = feed(&mut p, &bad);
        if e.is_some() {
            err = e;
            break;
        }
    }
    assert!(err.unwrap().contains("SNACKs"), "bounded");
}

/// The Status SNACKs among `out`: (BegRun, RunLength, ExpStatSN).
fn status_snacks(out: &[Pdu]) -> Vec<(u32, u32, u32)> {
    out.iter()
        .filter_map(|p| match &p.bhs {
            Bhs::SnackRequest(s) if s.snack_type == 1 => {
                assert_eq!(s.itt, 0xffff_ffff, "a Status SNACK's ITT is reserved");
                Some((s.beg_run, s.run_length, s.exp_stat_sn))
            }
            _ => None,
        })
        .collect()
}

fn response(itt: u32, stat_sn: u32, exp_data_sn: u32) -> Vec<u8> {
    let rsp = Bhs::ScsiResponse(ScsiResponse {
        itt,
        stat_sn,
        exp_data_sn,
        exp_cmd_sn: 2,
        max_cmd_sn: 40,
        ..Default::default()
    });
    wire(rsp, &[], DIGESTS)
}

#[test]
fn a_pdu_whose_header_digest_fails_is_left_for_the_reader_to_discard_at_erl1_only() {
    let mut bad = response(1, 5, 0);
    bad[20] ^= 0x10;
    for erl in [0, 1] {
        let mut p = path_at(DIGESTS, erl);
        command(&mut p, 1, 0, Bytes::new(), 0);
        let mut buf = BytesMut::from(&bad[..]);
        let r = p.receive(&mut buf, &mut Vec::new(), &mut Vec::new());
        if erl == 0 {
            assert!(
                r.unwrap_err().contains("header digest"),
                "level 0 ends the connection"
            );
        } else {
            assert_eq!(r, Ok(false), "left at the front");
            assert_eq!(buf.len(), bad.len(), "nothing consumed");
            let mut notices = Vec::new();
            for _ in 0..4 {
                p.header_digest_discarded(&mut notices).unwrap();
            }
            assert!(matches!(notices[0], InitiatorNotice::HeaderDigestDiscarded));
            let e = p.header_digest_discarded(&mut notices).unwrap_err();
            assert!(e.contains("in a row"), "{e}");
        }
    }
}

#[test]
fn at_erl1_a_statsn_gap_is_asked_for_with_a_status_snack_and_expstatsn_waits_for_it() {
    let mut p = path_at(DIGESTS, 1);
    for itt in [1, 2, 3] {
        command(&mut p, itt, 0, Bytes::new(), 0);
    }
    let (out, notices, err) = feed(&mut p, &response(1, 5, 0));
    assert!(err.is_none() && out.is_empty() && status_read(&notices).is_some());
    assert_eq!(p.ack_stat_sn(), 6);
    // StatSN 6 (command 2's status) was discarded: 7 shows the gap.
    let (out, notices, err) = feed(&mut p, &response(3, 7, 0));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        status_snacks(&out),
        [(6, 1, 6)],
        "a Status SNACK for StatSN 6"
    );
    assert!(notices.iter().any(|n| matches!(
        n,
        InitiatorNotice::SnackSent {
            what: datamover::SnackFor::Status,
            beg_run: 6,
            run_length: 1,
            ..
        }
    )));
    assert!(status_read(&notices).is_some(), "command 3 ends");
    assert_eq!(
        p.ack_stat_sn(),
        6,
        "status 6 is not acknowledged before it comes"
    );
    // The SNACK (or its answer) is lost too: a few quiet ticks later it is asked for again.
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert_eq!(status_snacks(&out), [(6, 1, 6)], "asked for again");
    // It comes again: command 2 ends and ExpStatSN moves past both.
    let (out, notices, err) = feed(&mut p, &response(2, 6, 0));
    assert!(err.is_none() && out.is_empty());
    assert!(status_read(&notices).is_some(), "command 2 ends");
    assert_eq!((p.ack_stat_sn(), p.in_flight()), (8, 0));
    // At level 0 the same gap is not asked for.
    let mut p = path_at(DIGESTS, 0);
    command(&mut p, 3, 0, Bytes::new(), 0);
    let (out, _, err) = feed(&mut p, &response(3, 7, 0));
    assert!(err.is_none() && out.is_empty());
}

#[test]
fn at_erl1_a_response_counting_more_data_in_than_came_asks_for_the_rest() {
    let mut p = path_at(DIGESTS, 1);
    let payload = pattern(8000);
    command(&mut p, 6, 8000, Bytes::new(), 0);
    let pdu = |sn: u32, off: usize| {
        wire(
            Bhs::DataIn(data_in(6, sn, off as u32, false)),
            &payload[off..off + 4000],
            DIGESTS,
        )
    };
    // DataSN 1 was discarded; the SCSI Response says two were sent.
    let mut bytes = pdu(0, 0);
    bytes.extend_from_slice(&response(6, 5, 2));
    let (out, notices, err) = feed(&mut p, &bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(snacks(&out), [(6, 1, 1, 5)], "a Data SNACK for DataSN 1");
    assert!(status_read(&notices).is_none(), "the status waits");
    let (_, notices, err) = feed(&mut p, &pdu(1, 4000));
    assert!(err.is_none(), "{err:?}");
    let read = status_read(&notices).expect("the command ends");
    assert!(read[..] == payload[..], "every byte right");
}

fn r2t(itt: u32, r2t_sn: u32, offset: u32, len: u32) -> Vec<u8> {
    let r = Bhs::R2t(R2t {
        itt,
        ttt: 100 + r2t_sn,
        r2t_sn,
        buffer_offset: offset,
        desired_len: len,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 32,
        ..Default::default()
    });
    wire(r, &[], DIGESTS)
}

#[test]
fn at_erl1_an_r2tsn_gap_and_a_write_left_waiting_are_asked_for_with_r2t_snacks() {
    let mut p = path_at(DIGESTS, 1);
    let data = Bytes::from(pattern(12000));
    command(&mut p, 8, 0, data.clone(), 0);
    // R2TSN 0 (bytes 0..4000) was discarded: R2TSN 1 is answered and shows the gap.
    let (out, _, err) = feed(&mut p, &r2t(8, 1, 4000, 4000));
    assert!(err.is_none(), "{err:?}");
    assert!(out
        .iter()
        .any(|p| matches!(&p.bhs, Bhs::DataOut(d) if d.buffer_offset == 4000)));
    assert_eq!(snacks(&out), [(8, 0, 1, 5)], "an R2T SNACK for R2TSN 0");
    // The resent R2T 0 is answered; the last, R2TSN 2, is lost for good: after a few quiet
    // ticks the probe asks for every R2T from 2 on.
    let (out, _, _) = feed(&mut p, &r2t(8, 0, 0, 4000));
    assert!(out
        .iter()
        .any(|p| matches!(&p.bhs, Bhs::DataOut(d) if d.buffer_offset == 0)));
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    let mut stalled = false;
    for _ in 0..4 {
        stalled |= p.probe(&mut out, &mut notices).unwrap();
    }
    assert!(stalled);
    assert_eq!(
        snacks(&out),
        [(8, 2, 0, 5)],
        "R2T SNACK from R2TSN 2, run 0: all"
    );
    // Answered: the write is whole and the probe asks nothing more.
    let (out, _, _) = feed(&mut p, &r2t(8, 2, 8000, 4000));
    assert!(out
        .iter()
        .any(|p| matches!(&p.bhs, Bhs::DataOut(d) if d.buffer_offset == 8000)));
    let mut out = Vec::new();
    for _ in 0..8 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert!(snacks(&out).is_empty(), "nothing owed: no SNACK, {out:?}");
}

#[test]
fn at_erl1_a_recovery_r2t_does_not_count_twice_and_unanswered_r2t_snacks_end_the_connection() {
    let mut p = path_at(DIGESTS, 1);
    let data = Bytes::from(pattern(12000));
    command(&mut p, 8, 0, data, 0);
    // R2TSN 0 and 1 ask for bytes 0..8000; a damaged Data-Out brings recovery R2TSN 2 for
    // 4000..8000 again. 4,000 bytes are still owed, though the R2Ts' lengths add up to 12,000.
    for (sn, off) in [(0, 0), (1, 4000), (2, 4000)] {
        let (_, _, err) = feed(&mut p, &r2t(8, sn, off, 4000));
        assert!(err.is_none(), "{err:?}");
    }
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert_eq!(
        snacks(&out),
        [(8, 3, 0, 5), (8, 3, 0, 5)],
        "R2T SNACKs from R2TSN 3"
    );
    // A target that lost track of the write answers none: the third quiet probe gives the
    // connection up (connection recovery takes the write over at level 2).
    let err = (0..4)
        .map(|_| p.probe(&mut out, &mut notices))
        .find_map(Result::err)
        .expect("the connection is given up");
    assert!(err.contains("no R2T for the 4000 bytes"), "{err}");
}

#[test]
fn at_erl1_a_write_the_target_has_not_taken_up_in_cmdsn_order_is_owed_no_r2t_yet() {
    let mut p = path_at(DIGESTS, 1);
    let mut cmd = datamover::conformance::initiator::command(9, 0, Bytes::from(pattern(8000)), 0);
    if let Bhs::ScsiCommand(c) = &mut cmd.pdu.bhs {
        c.cmd_sn = 7;
    }
    p.command(&cmd);
    let nop_in = |exp_cmd_sn| {
        let n = NopIn {
            itt: 0xffff_ffff,
            ttt: 0xffff_ffff,
            stat_sn: 5,
            exp_cmd_sn,
            max_cmd_sn: exp_cmd_sn + 32,
            ..Default::default()
        };
        wire(Bhs::NopIn(n), &[], DIGESTS)
    };
    // ExpCmdSN stays at 7 (CmdSN 6 went with another connection): the target holds the
    // write, and an R2T SNACK would ask for R2Ts it never sent.
    feed(&mut p, &nop_in(7));
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert!(snacks(&out).is_empty(), "{out:?}");
    // Once ExpCmdSN passes it, a write that heard nothing asks for its R2Ts.
    feed(&mut p, &nop_in(8));
    for _ in 0..4 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert_eq!(snacks(&out), [(9, 0, 0, 5)]);
}

fn resume_at(exp_data_sn: u32) -> Resume {
    Resume {
        exp_data_sn,
        read_prefix: Bytes::new(),
    }
}

/// The R-Data SNACKs among `out`: (ITT, SNACK Tag, BegRun, RunLength).
fn r_data_snacks(out: &[Pdu]) -> Vec<(u32, u32, u32, u32)> {
    out.iter()
        .filter_map(|p| match &p.bhs {
            Bhs::SnackRequest(s) if s.snack_type == 3 => {
                Some((s.itt, s.ttt, s.beg_run, s.run_length))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn at_erl1_data_in_lost_after_max_recv_data_segment_length_changed_takes_an_r_data_snack() {
    let mut p = path_at(DIGESTS, 1);
    let payload = pattern(24000);
    command(&mut p, 11, 24000, Bytes::new(), 0);
    let pdu = |sn: u32, off: usize, len: usize, status: bool| {
        wire(
            Bhs::DataIn(data_in(11, sn, off as u32, status)),
            &payload[off..off + len],
            DIGESTS,
        )
    };
    let (_, _, err) = feed(&mut p, &pdu(0, 0, 8000, false));
    assert!(err.is_none(), "{err:?}");
    // 4 KiB segments from now on (the Text Request is out): DataSN 1, still cut at 8000,
    // arrives damaged. It was cut the old way: an R-Data SNACK asks for the read again.
    p.set_max_recv_data_segment_length(4096, false);
    let mut bad = pdu(1, 8000, 8000, false);
    bad[48 + 4 + 100] ^= 0x40;
    let (out, _, err) = feed(&mut p, &bad);
    assert!(err.is_none(), "{err:?}");
    let asked = r_data_snacks(&out);
    assert_eq!(asked.len(), 1, "{out:?}");
    let (itt, tag, beg_run, run_length) = asked[0];
    assert_eq!(
        (itt, beg_run, run_length),
        (11, 0, 0),
        "all of it, from BegRun 0"
    );
    assert!(snacks(&out).is_empty(), "no plain Data SNACK");
    // The old last Data-In with status was on its way: its status is not the one awaited.
    let (_, notices, err) = feed(&mut p, &pdu(2, 16000, 8000, true));
    assert!(err.is_none(), "{err:?}");
    assert!(status_read(&notices).is_none(), "the old status is dropped");
    // Negotiated: the resent read in 4000-byte Data-In, then the Response with the tag.
    p.set_max_recv_data_segment_length(4096, true);
    let mut resent = Vec::new();
    for sn in 0..6 {
        resent.extend_from_slice(&pdu(sn, sn as usize * 4000, 4000, false));
    }
    let (_, notices, err) = feed(&mut p, &resent);
    assert!(err.is_none() && status_read(&notices).is_none(), "{err:?}");
    let untagged = response(11, 5, 6);
    let (_, notices, _) = feed(&mut p, &untagged);
    assert!(
        status_read(&notices).is_none(),
        "a Response without the tag is not it"
    );
    let tagged = wire(
        Bhs::ScsiResponse(ScsiResponse {
            itt: 11,
            snack_tag: tag,
            stat_sn: 5,
            exp_data_sn: 6,
            exp_cmd_sn: 2,
            max_cmd_sn: 40,
            ..Default::default()
        }),
        &[],
        DIGESTS,
    );
    let (_, notices, err) = feed(&mut p, &tagged);
    assert!(err.is_none(), "{err:?}");
    let read = status_read(&notices).expect("the tagged Response ends the command");
    assert!(read[..] == payload[..], "every byte right");
    // The new limit holds: an 8000-byte Data-In is refused now.
    command(&mut p, 12, 8000, Bytes::new(), 0);
    let big = wire(
        Bhs::DataIn(data_in(12, 0, 0, true)),
        &payload[..8000],
        DIGESTS,
    );
    let (_, _, err) = feed(&mut p, &big);
    assert!(
        err.is_some(),
        "a segment over 4096 bytes is a protocol error"
    );
}

#[test]
fn at_erl1_an_r_data_resend_that_misses_bytes_is_asked_for_again() {
    let mut p = path_at(DIGESTS, 1);
    let payload = pattern(16000);
    command(&mut p, 13, 16000, Bytes::new(), 0);
    let pdu = |sn: u32, off: usize, len: usize| {
        wire(
            Bhs::DataIn(data_in(13, sn, off as u32, false)),
            &payload[off..off + len],
            DIGESTS,
        )
    };
    p.set_max_recv_data_segment_length(4096, true);
    let mut bad = pdu(0, 0, 4000);
    bad[48 + 4 + 10] ^= 1;
    let (out, _, _) = feed(&mut p, &bad);
    let (_, tag, _, _) = r_data_snacks(&out)[0];
    // Only three of the four resent Data-In come through; the tagged Response then asks
    // for all of it again under a new tag.
    let mut resent = pdu(0, 0, 4000);
    resent.extend_from_slice(&pdu(1, 4000, 4000));
    resent.extend_from_slice(&pdu(3, 12000, 4000));
    feed(&mut p, &resent);
    let tagged = |tag: u32| {
        wire(
            Bhs::ScsiResponse(ScsiResponse {
                itt: 13,
                snack_tag: tag,
                stat_sn: 5,
                exp_data_sn: 4,
                exp_cmd_sn: 2,
                max_cmd_sn: 40,
                ..Default::default()
            }),
            &[],
            DIGESTS,
        )
    };
    let (out, notices, _) = feed(&mut p, &tagged(tag));
    assert!(status_read(&notices).is_none());
    let again = r_data_snacks(&out);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].1, tag, "a new tag");
    let mut all = Vec::new();
    for sn in 0..4 {
        all.extend_from_slice(&pdu(sn, sn as usize * 4000, 4000));
    }
    all.extend_from_slice(&tagged(again[0].1));
    let (_, notices, err) = feed(&mut p, &all);
    assert!(err.is_none(), "{err:?}");
    assert!(status_read(&notices).expect("done")[..] == payload[..]);
}

#[test]
fn at_erl1_a_data_in_asking_for_acknowledgement_is_answered_with_a_dataack() {
    let payload = pattern(8000);
    let asking = |sn: u32, off: usize| {
        let mut d = data_in(3, sn, off as u32, false);
        d.final_ = true;
        d.ack = true;
        d.ttt = 0x77;
        d.lun = 0x0001_0000_0000_0000;
        wire(Bhs::DataIn(d), &payload[off..off + 4000], DIGESTS)
    };
    let dataacks = |out: &[Pdu]| -> Vec<(u32, u32, u32, u32)> {
        out.iter()
            .filter_map(|p| match &p.bhs {
                Bhs::SnackRequest(s) if s.snack_type == 2 => {
                    Some((s.itt, s.ttt, s.beg_run, s.run_length))
                }
                _ => None,
            })
            .collect()
    };
    let mut p = path_at(DIGESTS, 1);
    command(&mut p, 3, 8000, Bytes::new(), 0);
    let (out, _, err) = feed(&mut p, &asking(0, 0));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        dataacks(&out),
        [(0xffff_ffff, 0x77, 1, 0)],
        "DataSN 0 acknowledged"
    );
    // DataSN 1 lost (asked for with a Data SNACK): DataSN 2's request is not answered, as
    // that would acknowledge DataSN 1 too.
    let (out, _, _) = feed(&mut p, &asking(2, 4000));
    assert_eq!(snacks(&out), [(3, 1, 1, 5)]);
    assert!(dataacks(&out).is_empty());
    // At level 0 the A bit is not answered.
    let mut p = path_at(DIGESTS, 0);
    command(&mut p, 3, 8000, Bytes::new(), 0);
    let (out, _, err) = feed(&mut p, &asking(0, 0));
    assert!(err.is_none() && dataacks(&out).is_empty());
}

#[test]
fn at_erl2_a_read_resumes_after_the_data_in_it_acknowledged() {
    let payload = pattern(16000);
    let piece = |sn: u32, ack: bool, status: bool| {
        let off = sn as usize * 4000;
        let mut d = data_in(3, sn, off as u32, status);
        d.final_ |= ack;
        d.ack = ack;
        d.ttt = if ack { 0x77 } else { 0xffff_ffff };
        wire(Bhs::DataIn(d), &payload[off..off + 4000], DIGESTS)
    };
    let mut p = path_at(DIGESTS, 2);
    command(&mut p, 3, 16000, Bytes::new(), 0);
    assert_eq!(
        p.resume_point(3),
        Resume::default(),
        "nothing acknowledged yet"
    );
    for (sn, ack) in [(0, false), (1, true), (2, false)] {
        let (_, _, err) = feed(&mut p, &piece(sn, ack, false));
        assert!(err.is_none(), "{err:?}");
    }
    // DataSN 0 and 1 were acknowledged (DataSN 2 came after): TASK REASSIGN will say
    // ExpDataSN 2, and the first 8,000 bytes are kept.
    let resume = p.resume_point(3);
    assert_eq!(resume.exp_data_sn, 2);
    assert!(resume.read_prefix[..] == payload[..8000]);
    // On the new connection the target resends from DataSN 2.
    let mut q = path_at(DIGESTS, 2);
    let cmd = datamover::conformance::initiator::command(3, 16000, Bytes::new(), 0);
    q.adopt(&cmd, resume);
    let (_, _, err) = feed(&mut q, &piece(2, false, false));
    assert!(err.is_none(), "{err:?}");
    let (_, notices, err) = feed(&mut q, &piece(3, false, true));
    assert!(err.is_none(), "{err:?}");
    let read = status_read(&notices).expect("the read ends");
    assert!(read[..] == payload[..], "every byte right");
}

#[test]
fn at_erl1_a_write_whose_data_out_was_rejected_and_then_hears_nothing_is_given_up_as_lost() {
    let stalled = |notices: &[InitiatorNotice]| -> Vec<u32> {
        notices
            .iter()
            .filter_map(|n| match n {
                InitiatorNotice::Stalled { itt } => Some(*itt),
                _ => None,
            })
            .collect()
    };
    let mut p = path_at(DIGESTS, 1);
    command(&mut p, 8, 0, Bytes::from(pattern(4000)), 0);
    command(&mut p, 9, 0, Bytes::from(pattern(4000)), 0);
    for itt in [8, 9] {
        let (out, _, err) = feed(&mut p, &r2t(itt, 0, 0, 4000));
        assert!(err.is_none() && !out.is_empty(), "{err:?}");
    }
    // The target Rejects write 8's Data-Out (data digest), then answers nothing more:
    // neither a recovery R2T nor a status. Write 9 is only slow.
    let rejected = Bhs::DataOut(iscsi_wire::DataOut {
        itt: 8,
        ..Default::default()
    })
    .encode(0, 4000);
    let reject = Bhs::Reject(iscsi_wire::Reject {
        reason: iscsi_wire::reject::DATA_DIGEST_ERROR,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 32,
        data_sn: 0,
    });
    let (_, notices, err) = feed(&mut p, &wire(reject, &rejected, DIGESTS));
    assert!(err.is_none(), "{err:?}");
    assert!(stalled(&notices).is_empty());
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..23 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert!(stalled(&notices).is_empty(), "not before six seconds");
    for _ in 0..8 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert_eq!(stalled(&notices), [8], "only the write in recovery");
    assert!(snacks(&out).is_empty(), "{out:?}");
    // Its state is gone: a late PDU for it is not placed.
    assert_eq!(p.resume_point(8), Resume::default());
}

#[test]
fn at_erl2_an_adopted_write_takes_r2ts_from_what_task_reassign_said_came() {
    let mut p = path_at(DIGESTS, 2);
    let data = Bytes::from(pattern(12000));
    let mut cmd = datamover::conformance::initiator::command(8, 0, data, 0);
    if let Bhs::ScsiCommand(c) = &mut cmd.pdu.bhs {
        c.lun = 0x0001_0000_0000_0000;
    }
    // R2TSN 0 and 1 came on the failed connection: the target re-issues from 2.
    p.adopt(&cmd, resume_at(2));
    let (out, _, err) = feed(&mut p, &r2t(8, 2, 8000, 4000));
    assert!(err.is_none(), "{err:?}");
    assert!(out
        .iter()
        .any(|p| matches!(&p.bhs, Bhs::DataOut(d) if d.buffer_offset == 8000)));
    assert!(snacks(&out).is_empty(), "no gap below R2TSN 2: {out:?}");
    // An R2T came since the reassignment: the probe asks for none.
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert!(snacks(&out).is_empty(), "{out:?}");
    // One that hears nothing at all after TASK REASSIGN asks, after 4 s, from the R2TSN the
    // reassignment named (never below it: LIO calls that a protocol error).
    let mut cmd = datamover::conformance::initiator::command(9, 0, Bytes::from(pattern(8000)), 0);
    if let Bhs::ScsiCommand(c) = &mut cmd.pdu.bhs {
        c.lun = 0x0001_0000_0000_0000;
    }
    p.adopt(&cmd, resume_at(1));
    let mut out = Vec::new();
    for _ in 0..15 {
        p.probe(&mut out, &mut notices).unwrap();
    }
    assert!(snacks(&out).is_empty(), "not before 4 s: {out:?}");
    p.probe(&mut out, &mut notices).unwrap();
    assert_eq!(snacks(&out), [(9, 1, 0, 5)]);
}

#[test]
fn an_r2t_is_answered_with_a_data_out_sequence() {
    let mut p = path(PLAIN);
    let data = Bytes::from(pattern(40000));
    command(&mut p, 3, 0, data.clone(), 16384);
    let r2t = Bhs::R2t(R2t {
        itt: 3,
        ttt: 77,
        buffer_offset: 16384,
        desired_len: 23616,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 32,
        ..Default::default()
    });
    let (out, notices, err) = feed(&mut p, &wire(r2t, &[], PLAIN));
    assert!(err.is_none());
    assert!(matches!(
        &notices[..],
        [InitiatorNotice::Window { max_cmd_sn: 32, .. }]
    ));
    let mut at = 16384usize;
    for (i, pdu) in out.iter().enumerate() {
        let Bhs::DataOut(d) = &pdu.bhs else { panic!() };
        assert_eq!(
            (
                d.ttt,
                d.data_sn,
                d.buffer_offset as usize,
                d.lun,
                d.exp_stat_sn
            ),
            (77, i as u32, at, 0x0001_0000_0000_0000, 5)
        );
        assert!(pdu.data.len() <= 4096);
        assert_eq!(&pdu.data[..], &data[at..at + pdu.data.len()]);
        at += pdu.data.len();
        assert_eq!(d.final_, i == out.len() - 1);
    }
    assert_eq!(at, 40000);
    // TASK REASSIGN's ExpDataSN for it would be 1: R2TSN 0 came.
    assert_eq!(
        (p.resume_point(3).exp_data_sn, p.resume_point(99)),
        (1, Resume::default())
    );
    // The status ends the task; its StatSN moves the Data-Out's ExpStatSN on.
    let rsp = Bhs::ScsiResponse(ScsiResponse {
        itt: 3,
        stat_sn: 5,
        ..Default::default()
    });
    let (_, notices, _) = feed(&mut p, &wire(rsp, &[], PLAIN));
    assert!(matches!(&notices[..], [InitiatorNotice::Status { read, .. }] if read.is_empty()));
    assert_eq!(p.in_flight(), 0);
}

#[test]
fn protocol_errors_from_the_target_end_the_connection() {
    let cases: Vec<(&str, Bhs, Vec<u8>)> = vec![
        (
            "overruns",
            Bhs::DataIn(data_in(1, 0, 500, false)),
            vec![0; 100],
        ),
        ("DataSN", Bhs::DataIn(data_in(1, 3, 0, false)), vec![0; 4]),
        (
            "of a 512-byte write",
            Bhs::R2t(R2t {
                itt: 2,
                desired_len: 4096,
                ..Default::default()
            }),
            vec![],
        ),
        (
            "exceeds MaxBurstLength",
            Bhs::R2t(R2t {
                itt: 3,
                desired_len: 65536 + 512,
                ..Default::default()
            }),
            vec![],
        ),
        (
            "unknown ITT",
            Bhs::R2t(R2t {
                itt: 99,
                desired_len: 512,
                ..Default::default()
            }),
            vec![],
        ),
        (
            "without the F bit",
            Bhs::DataIn(DataIn {
                final_: false,
                ..data_in(1, 0, 0, true)
            }),
            vec![0; 4],
        ),
    ];
    for (why, bhs, data) in cases {
        let mut p = path(PLAIN);
        command(&mut p, 1, 512, Bytes::new(), 0);
        command(&mut p, 2, 0, Bytes::from(vec![0u8; 512]), 0);
        command(&mut p, 3, 0, Bytes::from(vec![0u8; 200_000]), 0);
        let (_, _, err) = feed(&mut p, &wire(bhs, &data, PLAIN));
        let err = err.unwrap_or_else(|| panic!("no error for {why}"));
        assert!(err.contains(why), "{err} (wanted {why})");
    }
}

#[test]
fn data_for_a_forgotten_task_is_dropped_and_other_pdus_pass_up() {
    let mut p = path(PLAIN);
    command(&mut p, 1, 512, Bytes::new(), 0);
    p.forget(1);
    let mut bytes = wire(Bhs::DataIn(data_in(1, 0, 0, false)), &[9; 512], PLAIN);
    let nop = Bhs::NopIn(NopIn {
        itt: 0xffff_ffff,
        ttt: 4,
        stat_sn: 5,
        ..Default::default()
    });
    bytes.extend(wire(nop, b"ping", PLAIN));
    let (out, notices, err) = feed(&mut p, &bytes);
    assert!(err.is_none() && out.is_empty());
    assert!(
        matches!(&notices[..], [InitiatorNotice::Control(pdu), InitiatorNotice::Window { .. }] if &pdu.data[..] == b"ping"),
        "{notices:?}"
    );
}

/// A read carried whole by one Data-In is handed over as the very bytes received (no copy);
/// more data for it afterwards (a resent range) still assembles correctly.
#[test]
fn a_whole_read_in_one_data_in_is_not_copied() {
    let mut p = path(PLAIN);
    command(&mut p, 1, 4096, Bytes::new(), 0);
    let payload = pattern(4096);
    let mut buf = BytesMut::from(&wire(Bhs::DataIn(data_in(1, 0, 0, true)), &payload, PLAIN)[..]);
    let payload_at = buf.as_ptr() as usize + 48;
    let (mut out, mut notices) = (Vec::new(), Vec::new());
    assert!(p.receive(&mut buf, &mut out, &mut notices).unwrap());
    let [InitiatorNotice::Status { read, .. }] = &notices[..] else {
        panic!("{notices:?}")
    };
    assert_eq!(&read[..], &payload[..]);
    assert_eq!(
        read.as_ptr() as usize,
        payload_at,
        "the received bytes themselves"
    );

    command(&mut p, 2, 4096, Bytes::new(), 0);
    let mut again = payload.clone();
    again[..10].fill(0xEE);
    let mut bytes = wire(Bhs::DataIn(data_in(2, 0, 0, false)), &payload, PLAIN);
    bytes.extend(wire(
        Bhs::DataIn(data_in(2, 1, 0, true)),
        &again[..10],
        PLAIN,
    ));
    let (_, notices, err) = feed(&mut p, &bytes);
    assert!(err.is_none());
    let [InitiatorNotice::Status { read, .. }, ..] = &notices[..] else {
        panic!("{notices:?}")
    };
    assert_eq!(&read[..], &again[..], "the later range overwrote the start");
}

proptest! {
    #[test]
    fn random_target_bytes_never_panic(
        raw in proptest::collection::vec(proptest::array::uniform32(any::<u8>()), 1..20),
        data in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut p = path(PLAIN);
        command(&mut p, 1, 4096, Bytes::new(), 0);
        command(&mut p, 2, 0, Bytes::from(vec![1u8; 70000]), 8192);
        for chunk in raw {
            let mut head = [0u8; 48];
            head[..32].copy_from_slice(&chunk);
            head[16..20].copy_from_slice(&(1 + u32::from(chunk[0] & 1)).to_be_bytes());
            let Ok(d) = Bhs::decode(&head) else { continue };
            let _ = feed(&mut p, &wire(d.bhs, &data, PLAIN));
        }
    }
}
