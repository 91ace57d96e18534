use super::*;
use iscsi_wire::{R2t, ScsiResponse};
use proptest::prelude::*;

type Core = SessionCore<u32>;

fn limits(immediate: bool, initial_r2t: bool) -> SessionLimits {
    SessionLimits {
        immediate_data: immediate,
        initial_r2t,
        first_burst_length: 16384,
        max_burst_length: 65536,
    }
}

fn core(l: SessionLimits) -> Core {
    let mut c = Core::new(l, 1, 1, 32);
    c.add_connection(5, 8192);
    c
}

fn sends(c: &mut Core) -> Vec<(usize, OutPdu)> {
    let mut out = Vec::new();
    let mut rest = Vec::new();
    for a in c.actions.drain(..) {
        match a {
            Action::Send { conn, pdu } => out.push((conn, pdu)),
            other => rest.push(other),
        }
    }
    c.actions = rest;
    out
}

fn completions(c: &mut Core) -> Vec<(u32, Result<Reply, TaskError>)> {
    let mut out = Vec::new();
    let mut rest = Vec::new();
    for a in c.actions.drain(..) {
        match a {
            Action::Complete { token, result } => out.push((token, result)),
            other => rest.push(other),
        }
    }
    c.actions = rest;
    out
}

fn response(itt: u32, stat_sn: u32, max: u32) -> Bhs {
    Bhs::ScsiResponse(ScsiResponse {
        itt,
        stat_sn,
        exp_cmd_sn: 2,
        max_cmd_sn: max,
        ..Default::default()
    })
}

#[test]
fn read_assembles_data_in_and_phase_collapsed_status() {
    let mut c = core(limits(true, false));
    let itt = c.submit(7, CommandRequest::read(0, vec![0x28; 10], 10000));
    let s = sends(&mut c);
    assert_eq!(s.len(), 1);
    let Bhs::ScsiCommand(cmd) = &s[0].1.bhs else {
        panic!()
    };
    assert!(cmd.read && !cmd.write && cmd.final_);
    assert_eq!(
        (cmd.cmd_sn, cmd.exp_stat_sn, cmd.expected_data_len),
        (1, 5, 10000)
    );
    let payload: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
    let d1 = DataIn {
        itt,
        data_sn: 0,
        buffer_offset: 0,
        ..Default::default()
    };
    c.on_data_in(0, &d1, &Bytes::copy_from_slice(&payload[..6000]), None)
        .unwrap();
    assert!(completions(&mut c).is_empty());
    let d2 = DataIn {
        itt,
        data_sn: 1,
        buffer_offset: 6000,
        final_: true,
        status_present: true,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 40,
        ..Default::default()
    };
    c.on_data_in(0, &d2, &Bytes::copy_from_slice(&payload[6000..]), None)
        .unwrap();
    let done = completions(&mut c);
    assert_eq!(done.len(), 1);
    let (tok, Ok(Reply::Scsi(r))) = &done[0] else {
        panic!("{done:?}")
    };
    assert_eq!(*tok, 7);
    assert_eq!(r.status, 0);
    assert_eq!(&r.data[..], &payload[..]);
    assert_eq!(c.exp_stat_sn(0), 6);
    assert_eq!(c.window(), (2, 40));
    assert_eq!(c.outstanding(), 0);
}

#[test]
fn data_digest_is_checked_during_the_copy() {
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 6));
    sends(&mut c);
    let payload = &Bytes::from_static(b"abcdef");
    let pad = [0u8; 2];
    let good = digest::crc32c_append(digest::crc32c(payload), &pad);
    let d = DataIn {
        itt,
        ..Default::default()
    };
    let e = c
        .on_data_in(0, &d, payload, Some((good ^ 1, &pad)))
        .unwrap_err();
    assert!(e.0.contains("data digest"), "{e}");
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 6));
    let d = DataIn {
        itt,
        ..Default::default()
    };
    c.on_data_in(0, &d, payload, Some((good, &pad))).unwrap();
}

#[test]
fn write_sends_immediate_then_unsolicited_then_answers_r2t() {
    let mut c = core(limits(true, false));
    let data = Bytes::from((0..40000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let itt = c.submit(1, CommandRequest::write(0, vec![0x2a; 10], data.clone()));
    let s = sends(&mut c);
    // Command with 8192 immediate (MaxRecvDataSegmentLength), then Data-Out to FirstBurst.
    let Bhs::ScsiCommand(cmd) = &s[0].1.bhs else {
        panic!()
    };
    assert!(!cmd.final_ && cmd.write);
    assert_eq!(s[0].1.data.len(), 8192);
    let outs: Vec<_> = s[1..]
        .iter()
        .map(|(_, p)| match &p.bhs {
            Bhs::DataOut(d) => (d.ttt, d.data_sn, d.buffer_offset, p.data.len(), d.final_),
            _ => panic!(),
        })
        .collect();
    assert_eq!(outs, vec![(RESERVED_TAG, 0, 8192, 8192, true)]);
    // The target asks for the rest.
    let r2t = Bhs::R2t(R2t {
        itt,
        ttt: 77,
        buffer_offset: 16384,
        desired_len: 23616,
        exp_cmd_sn: 2,
        max_cmd_sn: 32,
        ..Default::default()
    });
    c.on_pdu(0, r2t, Bytes::new()).unwrap();
    let s = sends(&mut c);
    let mut at = 16384usize;
    for (i, (_, p)) in s.iter().enumerate() {
        let Bhs::DataOut(d) = &p.bhs else { panic!() };
        assert_eq!(
            (d.ttt, d.data_sn, d.buffer_offset as usize),
            (77, i as u32, at)
        );
        assert_eq!(&p.data[..], &data[at..at + p.data.len()]);
        at += p.data.len();
        assert_eq!(d.final_, i == s.len() - 1);
    }
    assert_eq!(at, 40000);
    c.on_pdu(0, response(itt, 5, 33), Bytes::new()).unwrap();
    assert!(matches!(&completions(&mut c)[..], [(1, Ok(Reply::Scsi(r)))] if r.status == 0));
}

#[test]
fn initial_r2t_without_immediate_data_sends_only_the_command() {
    let mut c = core(limits(false, true));
    c.submit(
        1,
        CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![1u8; 4096])),
    );
    let s = sends(&mut c);
    assert_eq!(s.len(), 1);
    let Bhs::ScsiCommand(cmd) = &s[0].1.bhs else {
        panic!()
    };
    assert!(cmd.final_ && s[0].1.data.is_empty());
}

#[test]
fn window_holds_commands_until_max_cmd_sn_moves() {
    let mut c = Core::new(limits(true, false), 1, 1, 2);
    c.add_connection(1, 8192);
    let a = c.submit(1, CommandRequest::none(0, vec![0; 6]));
    c.submit(2, CommandRequest::none(0, vec![0; 6]));
    c.submit(3, CommandRequest::none(0, vec![0; 6]));
    assert_eq!(sends(&mut c).len(), 2);
    assert_eq!(c.queued(), 1);
    c.on_pdu(0, response(a, 1, 3), Bytes::new()).unwrap();
    let s = sends(&mut c);
    assert_eq!(s.len(), 1);
    let Bhs::ScsiCommand(cmd) = &s[0].1.bhs else {
        panic!()
    };
    assert_eq!((cmd.cmd_sn, cmd.exp_stat_sn), (3, 2));
}

#[test]
fn commands_spread_over_connections() {
    let mut c = Core::new(limits(true, false), 1, 1, 100);
    for _ in 0..4 {
        c.add_connection(1, 8192);
    }
    for i in 0..8 {
        c.submit(i, CommandRequest::none(0, vec![0; 6]));
    }
    let mut per = [0; 4];
    for (conn, _) in sends(&mut c) {
        per[conn] += 1;
    }
    assert_eq!(per, [2, 2, 2, 2]);
}

#[test]
fn check_condition_carries_sense_and_residual() {
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    let mut sense = vec![0, 18];
    let mut fixed = vec![0u8; 18];
    fixed[0] = 0x70;
    fixed[2] = 5;
    fixed[12] = 0x21;
    sense.extend_from_slice(&fixed);
    let r = Bhs::ScsiResponse(ScsiResponse {
        itt,
        status: 2,
        underflow: true,
        residual: 512,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 33,
        ..Default::default()
    });
    c.on_pdu(0, r, Bytes::from(sense)).unwrap();
    let done = completions(&mut c);
    let [(_, Ok(Reply::Scsi(r)))] = &done[..] else {
        panic!()
    };
    assert_eq!(r.status, 2);
    assert_eq!(r.residual, Residual::Underflow(512));
    assert!(r.data.is_empty());
    assert_eq!(crate::scsi::Sense::parse(&r.sense).unwrap().asc, 0x21);
}

#[test]
fn target_nop_in_is_answered_and_ping_completes() {
    let mut c = core(limits(true, false));
    let nop = Bhs::NopIn(NopIn {
        itt: RESERVED_TAG,
        ttt: 9,
        stat_sn: 5,
        exp_cmd_sn: 1,
        max_cmd_sn: 32,
        ..Default::default()
    });
    c.on_pdu(0, nop, Bytes::new()).unwrap();
    let s = sends(&mut c);
    let Bhs::NopOut(n) = &s[0].1.bhs else {
        panic!()
    };
    assert_eq!((n.ttt, n.itt, n.immediate), (9, RESERVED_TAG, true));
    let itt = c.ping(0, 4).unwrap();
    sends(&mut c);
    let nop = Bhs::NopIn(NopIn {
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 5,
        exp_cmd_sn: 1,
        max_cmd_sn: 32,
        ..Default::default()
    });
    c.on_pdu(0, nop, Bytes::new()).unwrap();
    assert!(matches!(&completions(&mut c)[..], [(4, Ok(Reply::Nop(_)))]));
}

#[test]
fn abort_task_fails_the_command() {
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    sends(&mut c);
    let tmf_itt = c.abort_task(itt, 2).unwrap();
    let s = sends(&mut c);
    let Bhs::TaskMgmtRequest(t) = &s[0].1.bhs else {
        panic!()
    };
    assert_eq!(
        (t.function, t.ref_task_tag, t.ref_cmd_sn),
        (tmf::ABORT_TASK, itt, 1)
    );
    let rsp = Bhs::TaskMgmtResponse(iscsi_wire::TaskMgmtResponse {
        itt: tmf_itt,
        response: 0,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 33,
    });
    c.on_pdu(0, rsp, Bytes::new()).unwrap();
    let done = completions(&mut c);
    assert!(done
        .iter()
        .any(|(t, r)| *t == 1 && *r == Err(TaskError::Aborted)));
    assert!(done.iter().any(|(t, r)| *t == 2 && *r == Ok(Reply::Tmf(0))));
}

#[test]
fn connection_loss_fails_or_requeues() {
    let mut c = core(limits(true, false));
    c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    c.on_connection_lost(0, "reset by peer", false);
    let done = completions(&mut c);
    assert!(matches!(&done[..], [(1, Err(TaskError::ConnectionLost(m)))] if m == "reset by peer"));

    let mut c = core(limits(true, false));
    c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    c.submit(2, CommandRequest::read(0, vec![0x28; 10], 512));
    sends(&mut c);
    c.on_connection_lost(0, "gone", true);
    assert!(completions(&mut c).is_empty());
    assert_eq!(c.queued(), 2);
    c.reset_session(limits(true, false), 10, 10, 40);
    c.add_connection(1, 8192);
    let s = sends(&mut c);
    let sns: Vec<u32> = s
        .iter()
        .map(|(_, p)| match &p.bhs {
            Bhs::ScsiCommand(x) => x.cmd_sn,
            _ => 0,
        })
        .collect();
    assert_eq!(sns, vec![10, 11]);
}

#[test]
fn malformed_target_pdus_are_errors() {
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    // Overrun.
    let d = DataIn {
        itt,
        buffer_offset: 500,
        ..Default::default()
    };
    assert!(c
        .on_data_in(0, &d, &Bytes::from(vec![0u8; 100]), None)
        .is_err());
    // Unknown ITT in a response.
    assert!(c.on_pdu(0, response(999, 1, 2), Bytes::new()).is_err());
    // R2T beyond the write.
    let w = c.submit(
        2,
        CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![0u8; 512])),
    );
    let r2t = Bhs::R2t(R2t {
        itt: w,
        ttt: 1,
        buffer_offset: 0,
        desired_len: 4096,
        ..Default::default()
    });
    assert!(c.on_pdu(0, r2t, Bytes::new()).is_err());
    // A request opcode from the target.
    assert!(c
        .on_pdu(0, Bhs::NopOut(NopOut::default()), Bytes::new())
        .is_err());
}

proptest! {
    #[test]
    fn random_target_pdus_never_panic(
        raw in proptest::collection::vec(proptest::array::uniform32(any::<u8>()), 1..20),
        data in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut c = core(limits(true, false));
        let r = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 4096));
        let w = c.submit(2, CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![1u8; 70000])));
        for chunk in raw {
            let mut head = [0u8; 48];
            head[..32].copy_from_slice(&chunk);
            head[16..20].copy_from_slice(&(if chunk[0] & 1 == 0 { r } else { w }).to_be_bytes());
            let Ok(d) = iscsi_wire::Bhs::decode(&head) else { continue };
            let _ = match d.bhs {
                Bhs::DataIn(di) => c.on_data_in(0, &di, &Bytes::from(data.clone()), None),
                other => c.on_pdu(0, other, Bytes::from(data.clone())),
            };
            c.actions.clear();
        }
    }
}

/// A read carried whole by one Data-In is handed over as the very bytes received (no copy);
/// more data for it afterwards (a resent range) still assembles correctly.
#[test]
fn a_whole_read_in_one_data_in_is_not_copied() {
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 4096));
    sends(&mut c);
    let payload = Bytes::from((0..4096u32).map(|i| (i * 3) as u8).collect::<Vec<_>>());
    let d = DataIn {
        itt,
        final_: true,
        status_present: true,
        ..Default::default()
    };
    c.on_data_in(0, &d, &payload, None).unwrap();
    let done = completions(&mut c);
    let (_, Ok(Reply::Scsi(r))) = &done[0] else {
        panic!("{done:?}")
    };
    assert_eq!(r.data, payload);
    assert_eq!(
        r.data.as_ptr(),
        payload.as_ptr(),
        "the received bytes themselves"
    );

    let itt = c.submit(2, CommandRequest::read(0, vec![0x28; 10], 4096));
    sends(&mut c);
    let d0 = DataIn {
        itt,
        ..Default::default()
    };
    c.on_data_in(0, &d0, &payload, None).unwrap();
    let mut again = payload.to_vec();
    again[..10].fill(0xEE);
    let d1 = DataIn {
        itt,
        data_sn: 1,
        final_: true,
        status_present: true,
        ..Default::default()
    };
    c.on_data_in(0, &d1, &Bytes::from(again[..10].to_vec()), None)
        .unwrap();
    let done = completions(&mut c);
    let (_, Ok(Reply::Scsi(r))) = &done[0] else {
        panic!("{done:?}")
    };
    assert_eq!(
        &r.data[..],
        &again[..],
        "the later range overwrote the start"
    );
}
