use super::*;
use iscsi_wire::{DataIn, Pdu, ScsiResponse};
use proptest::prelude::*;

type Core = SessionCore<u32>;

fn limits(immediate: bool, initial_r2t: bool) -> SessionLimits {
    SessionLimits {
        immediate_data: immediate,
        initial_r2t,
        first_burst_length: 16384,
        max_burst_length: 65536,
        unsolicited_only_whole: false,
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
            Action::Command { conn, cmd } => out.push((conn, cmd.pdu)),
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

/// The commands sent, as their datamover gets them.
fn commands(c: &mut Core) -> Vec<CommandOut> {
    let mut out = Vec::new();
    let mut rest = Vec::new();
    for a in c.actions.drain(..) {
        match a {
            Action::Command { cmd, .. } => out.push(cmd),
            other => rest.push(other),
        }
    }
    c.actions = rest;
    out
}

fn status(bhs: Bhs, sense: Vec<u8>, read: Bytes) -> InitiatorNotice {
    InitiatorNotice::Status {
        pdu: Pdu {
            bhs,
            ahs: Bytes::new(),
            data: Bytes::from(sense),
        },
        read,
    }
}

fn control(bhs: Bhs) -> InitiatorNotice {
    InitiatorNotice::Control(Pdu {
        bhs,
        ahs: Bytes::new(),
        data: Bytes::new(),
    })
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
fn a_read_completes_with_the_data_its_datamover_placed() {
    let mut c = core(limits(true, false));
    let itt = c.submit(7, CommandRequest::read(0, vec![0x28; 10], 10000));
    let cmds = commands(&mut c);
    assert_eq!(cmds.len(), 1);
    let Bhs::ScsiCommand(cmd) = &cmds[0].pdu.bhs else {
        panic!()
    };
    assert!(cmd.read && !cmd.write && cmd.final_);
    assert_eq!(
        (cmd.cmd_sn, cmd.exp_stat_sn, cmd.expected_data_len),
        (1, 5, 10000)
    );
    assert_eq!((cmds[0].read_len, cmds[0].write.len()), (10000, 0));
    // A Data-In the datamover consumed opened the window.
    c.on_notice(
        0,
        InitiatorNotice::Window {
            exp_cmd_sn: 2,
            max_cmd_sn: 35,
        },
    )
    .unwrap();
    assert_eq!(c.window(), (2, 35));
    let payload = Bytes::from((0..10000u32).map(|i| i as u8).collect::<Vec<_>>());
    let last = DataIn {
        itt,
        data_sn: 1,
        buffer_offset: 6000,
        final_: true,
        status_present: true,
        underflow: true,
        residual: 1000,
        stat_sn: 5,
        exp_cmd_sn: 2,
        max_cmd_sn: 40,
        ..Default::default()
    };
    c.on_notice(0, status(Bhs::DataIn(last), vec![], payload.clone()))
        .unwrap();
    let done = completions(&mut c);
    let [(7, Ok(Reply::Scsi(r)))] = &done[..] else {
        panic!("{done:?}")
    };
    assert_eq!(r.status, 0);
    assert_eq!(r.residual, Residual::Underflow(1000));
    assert_eq!(r.data, payload.slice(..9000), "shortened by the residual");
    assert_eq!(c.exp_stat_sn(0), 6);
    assert_eq!(c.window(), (2, 40));
    assert_eq!(c.outstanding(), 0);
}

#[test]
fn write_sends_immediate_then_unsolicited_data() {
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
    c.on_notice(0, status(response(itt, 5, 33), vec![], Bytes::new()))
        .unwrap();
    assert!(matches!(&completions(&mut c)[..], [(1, Ok(Reply::Scsi(r)))] if r.status == 0));
}

#[test]
fn the_datamover_gets_the_whole_write_and_where_solicited_data_begins() {
    let mut c = core(limits(true, false));
    let data = Bytes::from(vec![7u8; 40000]);
    c.submit(1, CommandRequest::write(0, vec![0x2a; 10], data.clone()));
    let cmds = commands(&mut c);
    assert_eq!(cmds[0].write, data);
    assert_eq!((cmds[0].solicited_from, cmds[0].read_len), (16384, 0));
    let mut c = core(limits(false, true));
    c.submit(1, CommandRequest::write(0, vec![0x2a; 10], data));
    assert_eq!(commands(&mut c)[0].solicited_from, 0);
}

#[test]
fn only_whole_writes_go_unsolicited_when_the_transport_fetches_the_rest() {
    // ImmediateData=Yes, InitialR2T=No, FirstBurstLength 16 KiB, 8 KiB segments: a write
    // that fits the command PDU goes whole as immediate data; a larger one goes with none,
    // F set and no Data-Out, and the datamover is told all of it is solicited.
    let mut c = core(SessionLimits {
        unsolicited_only_whole: true,
        ..limits(true, false)
    });
    for (len, immediate) in [(4096usize, 4096usize), (8192, 8192), (12288, 0), (40000, 0)] {
        c.submit(
            1,
            CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![3u8; len])),
        );
        let cmds = commands(&mut c);
        assert_eq!(cmds.len(), 1, "{len}: the command alone");
        let Bhs::ScsiCommand(cmd) = &cmds[0].pdu.bhs else {
            panic!()
        };
        assert!(cmd.final_, "{len}: F set");
        assert_eq!(cmds[0].pdu.data.len(), immediate, "{len}: immediate data");
        assert_eq!(cmds[0].solicited_from as usize, immediate, "{len}");
        assert!(sends(&mut c).is_empty(), "{len}: no unsolicited Data-Out");
    }
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
    c.on_notice(0, status(response(a, 1, 3), vec![], Bytes::new()))
        .unwrap();
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
    c.on_notice(0, status(r, sense, Bytes::from(vec![0u8; 512])))
        .unwrap();
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
    c.on_notice(0, control(rsp)).unwrap();
    assert!(
        matches!(&c.actions[..], [Action::Forget { conn: 0, itt: i }, ..] if *i == itt),
        "the datamover drops the aborted command's data phases"
    );
    let done = completions(&mut c);
    assert!(done
        .iter()
        .any(|(t, r)| *t == 1 && *r == Err(TaskError::Aborted)));
    assert!(done.iter().any(|(t, r)| *t == 2 && *r == Ok(Reply::Tmf(0))));
}

#[test]
fn a_command_rejected_for_a_data_digest_error_is_sent_again_as_it_was() {
    let mut c = core(limits(true, false));
    let data = Bytes::from(vec![7u8; 4096]);
    let itt = c.submit(1, CommandRequest::write(0, vec![0x2a; 10], data));
    let first = commands(&mut c).remove(0);
    let reject = |c: &mut Core, stat_sn: u32| {
        let raw = first
            .pdu
            .bhs
            .encode(0, first.pdu.data.len() as u32)
            .to_vec();
        c.on_notice(
            0,
            InitiatorNotice::Control(Pdu {
                bhs: Bhs::Reject(iscsi_wire::Reject {
                    reason: iscsi_wire::reject::DATA_DIGEST_ERROR,
                    stat_sn,
                    exp_cmd_sn: 1,
                    max_cmd_sn: 32,
                    ..Default::default()
                }),
                ahs: Bytes::new(),
                data: Bytes::from(raw),
            }),
        )
        .unwrap();
    };
    for n in 0..MAX_COMMAND_RETRIES as u32 {
        reject(&mut c, 5 + n);
        assert!(
            matches!(&c.actions[..], [Action::Forget { conn: 0, itt: i }, ..] if *i == itt),
            "the datamover starts the command over"
        );
        let again = commands(&mut c);
        assert_eq!(again.len(), 1, "sent again");
        let (Bhs::ScsiCommand(a), Bhs::ScsiCommand(b)) = (&again[0].pdu.bhs, &first.pdu.bhs) else {
            panic!("a SCSI Command")
        };
        assert_eq!(
            (a.itt, a.cmd_sn, a.cdb, a.expected_data_len),
            (b.itt, b.cmd_sn, b.cdb, b.expected_data_len),
            "same ITT, CmdSN and CDB"
        );
        assert_eq!(a.exp_stat_sn, 6 + n, "the current ExpStatSN");
        assert_eq!(again[0].pdu.data, first.pdu.data, "same immediate data");
        assert!(completions(&mut c).is_empty());
    }
    reject(&mut c, 9);
    let done = completions(&mut c);
    assert_eq!(
        done,
        [(
            1,
            Err(TaskError::Rejected(iscsi_wire::reject::DATA_DIGEST_ERROR))
        )],
        "bounded: then the command fails"
    );
}

#[test]
fn a_refused_snack_ends_the_connection_rather_than_the_command() {
    let mut c = core(limits(true, false));
    let itt = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 4096));
    let _ = commands(&mut c);
    let snack = Bhs::SnackRequest(iscsi_wire::SnackRequest {
        itt,
        ttt: RESERVED_TAG,
        ..Default::default()
    })
    .encode(0, 0)
    .to_vec();
    let refused = c.on_notice(
        0,
        InitiatorNotice::Control(Pdu {
            bhs: Bhs::Reject(iscsi_wire::Reject {
                reason: iscsi_wire::reject::PROTOCOL_ERROR,
                stat_sn: 5,
                exp_cmd_sn: 2,
                max_cmd_sn: 32,
                ..Default::default()
            }),
            ahs: Bytes::new(),
            data: Bytes::from(snack),
        }),
    );
    assert!(refused.unwrap_err().0.contains("refused a SNACK"));
    assert!(completions(&mut c).is_empty(), "the command is not failed");
}

#[test]
fn a_command_the_target_never_got_is_sent_again_once_its_cmdsn_stalls() {
    let mut c = core(limits(true, false));
    let a = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    let b = c.submit(2, CommandRequest::read(0, vec![0x28; 10], 512));
    let sent = commands(&mut c);
    assert_eq!(sent.len(), 2);
    // The target answers a ping with ExpCmdSN 1: command `a` (CmdSN 1) is not there.
    assert_eq!(
        c.retry_lost_command(),
        None,
        "first sight: maybe still on the way"
    );
    c.on_notice(
        0,
        control(Bhs::NopIn(NopIn {
            itt: u32::MAX,
            ttt: u32::MAX,
            stat_sn: 5,
            exp_cmd_sn: 1,
            max_cmd_sn: 32,
            ..Default::default()
        })),
    )
    .unwrap();
    assert_eq!(
        c.retry_lost_command(),
        Some(a),
        "still its CmdSN at the next round"
    );
    let again = commands(&mut c);
    let Bhs::ScsiCommand(cmd) = &again[0].pdu.bhs else {
        panic!()
    };
    assert_eq!((cmd.itt, cmd.cmd_sn), (a, 1));
    // The target moves on to ExpCmdSN 2 (b's) and, before the next round, past it: b
    // was not lost, nothing more is sent.
    c.on_notice(0, status(response(a, 5, 33), Vec::new(), Bytes::new()))
        .unwrap();
    assert_eq!(c.retry_lost_command(), None);
    let mut rsp = response(b, 6, 34);
    if let Bhs::ScsiResponse(r) = &mut rsp {
        r.exp_cmd_sn = 3;
    }
    c.on_notice(0, status(rsp, Vec::new(), Bytes::new()))
        .unwrap();
    assert_eq!(c.retry_lost_command(), None);
    assert!(commands(&mut c).is_empty());
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
    c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    // Unknown ITT in a response.
    let e = c.on_notice(0, status(response(999, 1, 2), vec![], Bytes::new()));
    assert!(e.unwrap_err().0.contains("unknown ITT"));
    // A request opcode from the target.
    assert!(c
        .on_notice(0, control(Bhs::NopOut(NopOut::default())))
        .is_err());
    // A datamover's PDU passed up as control.
    assert!(c.on_notice(0, control(response(1, 1, 2))).is_err());
    // The connection's end is an error for the driver to act on.
    let e = c.on_notice(0, InitiatorNotice::Closed("reset".into()));
    assert_eq!(e.unwrap_err().0, "reset");
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
            let pdu = Pdu { bhs: d.bhs, ahs: Bytes::new(), data: Bytes::from(data.clone()) };
            let notice = if chunk[1] & 1 == 0 {
                InitiatorNotice::Control(pdu)
            } else {
                InitiatorNotice::Status { pdu, read: Bytes::from(data.clone()) }
            };
            let _ = c.on_notice(0, notice);
            c.actions.clear();
        }
    }
}

/// A good status for the 512-byte read `itt` (token 1) arrives on connection 0 and
/// completes it.
fn read_completes(c: &mut Core, itt: u32, stat_sn: u32, exp_cmd_sn: u32) {
    let rsp = Bhs::ScsiResponse(ScsiResponse {
        itt,
        stat_sn,
        exp_cmd_sn,
        max_cmd_sn: 32,
        ..Default::default()
    });
    c.on_notice(0, status(rsp, vec![], Bytes::from(vec![1u8; 512])))
        .unwrap();
    assert!(matches!(&completions(c)[..], [(1, Ok(Reply::Scsi(_)))]));
}

fn resume_at(exp_data_sn: u32) -> Resume {
    Resume {
        exp_data_sn,
        read_prefix: Bytes::new(),
    }
}

/// The ITT of the TASK REASSIGN among the PDUs sent.
fn reassign_itt(c: &mut Core) -> u32 {
    sends(c)
        .into_iter()
        .find_map(|(_, p)| match p.bhs {
            Bhs::TaskMgmtRequest(t) => Some(t.itt),
            _ => None,
        })
        .expect("TASK REASSIGN")
}

fn tmf_response(itt: u32, response: u8, stat_sn: u32) -> InitiatorNotice {
    tmf_response_at(itt, response, stat_sn, 1)
}

fn tmf_response_at(itt: u32, response: u8, stat_sn: u32, exp_cmd_sn: u32) -> InitiatorNotice {
    control(Bhs::TaskMgmtResponse(iscsi_wire::TaskMgmtResponse {
        response,
        itt,
        stat_sn,
        exp_cmd_sn,
        max_cmd_sn: 32,
    }))
}

#[test]
fn erl2_orphans_a_failed_connections_commands_and_reassigns_them_in_cmdsn_order() {
    let mut c = core(limits(true, false));
    let read = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 4096));
    let write = c.submit(
        2,
        CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![7u8; 32768])),
    );
    let ping_rx = c.ping(0, 3).expect("up");
    c.actions.clear();
    // Three R2Ts (R2TSN 0..2) reached the initiator for the write before the cut.
    let r2ts = |itt| resume_at(if itt == write { 3 } else { 0 });
    assert_eq!(
        c.on_connection_failed(0, "cut", r2ts),
        2,
        "both commands wait"
    );
    // The ping fails; the commands neither fail nor go back to the queue.
    let done = completions(&mut c);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, 3);
    assert_eq!((c.queued(), c.outstanding()), (0, 2));
    let _ = ping_rx;

    c.add_connection_at(0, 40, 8192);
    assert_eq!(c.reassign_to(0), 2);
    let mut adopted = Vec::new();
    let mut tmfs = Vec::new();
    for a in c.actions.drain(..) {
        match a {
            Action::Adopt {
                conn: 0,
                cmd,
                resume,
            } => adopted.push((cmd, resume.exp_data_sn)),
            Action::Send { conn: 0, pdu } => match pdu.bhs {
                Bhs::TaskMgmtRequest(t) => tmfs.push(t),
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("unexpected {other:?}"),
        }
    }
    // In CmdSN order: the read (CmdSN 1), then the write (2), all its data solicited.
    assert_eq!(adopted.len(), 2);
    assert_eq!(adopted[1].0.solicited_from, 0);
    assert!(adopted[1].0.pdu.data.is_empty());
    assert_eq!(adopted[1].0.write.len(), 32768);
    // The adopting datamover numbers R2Ts from what the TASK REASSIGN says came (below).
    assert_eq!((adopted[0].1, adopted[1].1), (0, 3));
    let refs: Vec<(u8, u32, u32, u32, u32)> = tmfs
        .iter()
        .map(|t| {
            (
                t.function,
                t.ref_task_tag,
                t.ref_cmd_sn,
                t.exp_data_sn,
                t.exp_stat_sn,
            )
        })
        .collect();
    // ExpDataSN: 0 for the read (all its data again), the next R2TSN for the write.
    assert_eq!(refs, vec![(8, read, 1, 0, 40), (8, write, 2, 3, 40)]);
    assert!(tmfs.iter().all(|t| t.immediate));

    // The read is taken over; the write never reached the target (its CmdSN not passed):
    // it is sent again as it was, with its ITT and CmdSN.
    c.on_notice(0, tmf_response(tmfs[0].itt, 0, 40)).unwrap();
    c.on_notice(0, tmf_response(tmfs[1].itt, 1, 41)).unwrap();
    let again = commands(&mut c);
    assert_eq!(again.len(), 1);
    let Bhs::ScsiCommand(cmd) = &again[0].pdu.bhs else {
        panic!()
    };
    assert_eq!((cmd.itt, cmd.cmd_sn), (write, 2));
    assert_eq!(
        (c.recovery.task_reassigns, c.recovery.lost_commands),
        (1, 1)
    );

    // The read completes on the new connection.
    let rsp = Bhs::ScsiResponse(ScsiResponse {
        itt: read,
        stat_sn: 42,
        exp_cmd_sn: 2,
        max_cmd_sn: 32,
        ..Default::default()
    });
    c.on_notice(0, status(rsp, vec![], Bytes::from(vec![9u8; 4096])))
        .unwrap();
    let done = completions(&mut c);
    assert!(matches!(&done[..], [(1, Ok(Reply::Scsi(r)))] if r.data.len() == 4096));
}

/// The one ABORT TASK among the PDUs sent: (connection, request).
fn abort_task(c: &mut Core) -> (usize, iscsi_wire::TaskMgmtRequest) {
    let mut aborts: Vec<_> = sends(c)
        .into_iter()
        .filter_map(|(conn, p)| match p.bhs {
            Bhs::TaskMgmtRequest(t) if t.function == tmf::ABORT_TASK => Some((conn, t)),
            _ => None,
        })
        .collect();
    assert_eq!(aborts.len(), 1, "{aborts:?}");
    aborts.pop().expect("one")
}

#[test]
fn erl2_a_refused_reassignment_aborts_the_command_and_sends_it_again_as_a_new_task() {
    let mut c = core(limits(true, false));
    let a = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    c.actions.clear();
    c.on_connection_failed(0, "cut", |_| Resume::default());
    c.add_connection_at(0, 7, 8192);
    c.reassign_to(0);
    let tmf_itt = reassign_itt(&mut c);
    c.actions.clear();
    c.on_notice(0, tmf_response(tmf_itt, tmf::RSP_REASSIGN_NOT_SUPPORTED, 7))
        .unwrap();
    assert!(completions(&mut c).is_empty(), "not failed");
    let (conn, abort) = abort_task(&mut c);
    assert_eq!((conn, abort.ref_task_tag, abort.ref_cmd_sn), (0, a, 1));
    assert!(abort.immediate);
    // Until the target answers, the command is not sent again.
    assert!(commands(&mut c).is_empty());
    // The target had taken the command up (ExpCmdSN 2 passed its CmdSN 1).
    c.on_notice(0, tmf_response_at(abort.itt, tmf::RSP_COMPLETE, 8, 2))
        .unwrap();
    let sent = commands(&mut c);
    let Bhs::ScsiCommand(cmd) = &sent[0].pdu.bhs else {
        panic!()
    };
    assert_eq!((cmd.itt, cmd.cmd_sn), (a, 2), "a new task: the next CmdSN");
    assert_eq!(c.recovery.reissued_commands, 1);
    read_completes(&mut c, a, 9, 3);
    assert_eq!(c.outstanding(), 0);
}

#[test]
fn erl2_a_command_the_target_will_not_abort_fails_and_one_with_no_connection_left_fails() {
    let mut c = core(limits(true, false));
    c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    c.actions.clear();
    c.on_connection_failed(0, "cut", |_| Resume::default());
    c.add_connection_at(0, 7, 8192);
    c.reassign_to(0);
    let tmf_itt = reassign_itt(&mut c);
    c.actions.clear();
    c.on_notice(0, tmf_response(tmf_itt, tmf::RSP_NOT_SUPPORTED, 7))
        .unwrap();
    let (_, abort) = abort_task(&mut c);
    c.on_notice(0, tmf_response(abort.itt, tmf::RSP_REJECTED, 8))
        .unwrap();
    let done = completions(&mut c);
    assert!(
        matches!(&done[..], [(1, Err(TaskError::ConnectionLost(e)))] if e.contains("would not abort")),
        "{done:?}"
    );

    // Given up with no connection up: nothing is sent; the caller reinstates the session.
    c.submit(2, CommandRequest::read(0, vec![0x28; 10], 512));
    c.actions.clear();
    c.on_connection_failed(0, "cut again", |_| Resume::default());
    assert_eq!(c.reissue_orphans(), 0);
    assert_eq!(c.orphans(), 1);
    c.requeue_orphans();
    assert_eq!((c.queued(), c.orphans()), (1, 0));
}

#[test]
fn erl2_given_up_connection_recovery_aborts_the_orphans_on_another_connection_then_sends_them_as_new_tasks(
) {
    let mut c = core(limits(false, true));
    let second = c.add_connection(3, 8192);
    let read = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 4096));
    let write = c.submit(
        2,
        CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![7u8; 32768])),
    );
    let on_first: Vec<u32> = [read, write]
        .into_iter()
        .filter(|itt| c.tasks[itt].conn == Some(0))
        .collect();
    c.actions.clear();
    assert_eq!(
        c.on_connection_failed(0, "cut", |_| resume_at(2)),
        on_first.len()
    );
    assert_eq!(c.reissue_orphans(), on_first.len());
    let mut aborts: Vec<(usize, iscsi_wire::TaskMgmtRequest)> = sends(&mut c)
        .into_iter()
        .filter_map(|(conn, p)| match p.bhs {
            Bhs::TaskMgmtRequest(t) => Some((conn, t)),
            _ => None,
        })
        .collect();
    assert_eq!(aborts.len(), on_first.len());
    assert!(aborts
        .iter()
        .all(|(conn, t)| *conn == second && t.function == tmf::ABORT_TASK));
    assert!(
        commands(&mut c).is_empty(),
        "nothing sent again before the answers"
    );
    // The second connection fails before an answer: the commands wait again, and go
    // through the same steps once it is back.
    c.on_connection_failed(second, "cut", |_| Resume::default());
    assert_eq!(c.orphans(), 2, "both commands wait again");
    c.add_connection_at(second, 9, 8192);
    assert_eq!(c.reissue_orphans(), 2);
    aborts = sends(&mut c)
        .into_iter()
        .filter_map(|(conn, p)| match p.bhs {
            Bhs::TaskMgmtRequest(t) => Some((conn, t)),
            _ => None,
        })
        .collect();
    assert_eq!(aborts.len(), 2);
    for (conn, t) in aborts {
        // "Task does not exist" lets it go again as well as "function complete".
        let response = if t.ref_task_tag == read {
            tmf::RSP_NO_TASK
        } else {
            tmf::RSP_COMPLETE
        };
        // Both had arrived: ExpCmdSN 3 passed CmdSN 1 and 2.
        c.on_notice(conn, tmf_response_at(t.itt, response, 10, 3))
            .unwrap();
    }
    let sent = commands(&mut c);
    assert_eq!(sent.len(), 2, "both sent again");
    for cmd in &sent {
        let Bhs::ScsiCommand(bhs) = &cmd.pdu.bhs else {
            panic!()
        };
        assert!(sn_le(3, bhs.cmd_sn), "new CmdSNs: {}", bhs.cmd_sn);
        if bhs.itt == write {
            assert_eq!(
                cmd.solicited_from, 0,
                "its data from the start, as R2Ts ask"
            );
            assert_eq!(cmd.write.len(), 32768);
        }
    }
    assert_eq!(c.recovery.reissued_commands, 2);
}

#[test]
fn erl2_task_still_allegiant_is_asked_again_a_bounded_number_of_times() {
    let mut c = core(limits(true, false));
    c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    c.actions.clear();
    c.on_connection_failed(0, "cut", |_| Resume::default());
    c.add_connection_at(0, 7, 8192);
    let mut asked = 0;
    loop {
        assert_eq!(c.reassign_to(0), 1);
        let tmf_itt = reassign_itt(&mut c);
        asked += 1;
        c.actions.clear();
        c.on_notice(0, tmf_response(tmf_itt, tmf::RSP_STILL_ALLEGIANT, 7))
            .unwrap();
        if c.take_reassign_retry() != Some(0) {
            break;
        }
        assert_eq!(c.orphans(), 1, "orphaned again until the next try");
        assert!(asked <= 10, "bounded");
    }
    assert_eq!(
        asked, 11,
        "ten retries, then the command is aborted to go again"
    );
    assert!(completions(&mut c).is_empty());
    let (conn, _) = abort_task(&mut c);
    assert_eq!(conn, 0);
}

#[test]
fn erl2_failures_in_a_row_count_only_connections_that_completed_nothing() {
    let mut c = core(limits(true, false));
    let read = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    for n in 1..=4 {
        c.on_connection_failed(0, "cut", |_| Resume::default());
        assert_eq!(c.failed_in_a_row(0), n);
        c.add_connection_at(0, 7, 8192);
        c.reassign_to(0);
    }
    c.actions.clear();
    // A command completes on it: the next failure starts a new count.
    let rsp = Bhs::ScsiResponse(ScsiResponse {
        itt: read,
        stat_sn: 7,
        exp_cmd_sn: 2,
        max_cmd_sn: 32,
        ..Default::default()
    });
    c.on_notice(0, status(rsp, vec![], Bytes::from(vec![0u8; 512])))
        .unwrap();
    c.on_connection_failed(0, "cut", |_| Resume::default());
    assert_eq!(c.failed_in_a_row(0), 1);
}

#[test]
fn erl2_lio_s_function_rejected_for_a_reassignment_it_made_lets_the_command_go_on() {
    let mut c = core(limits(true, false));
    let read = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
    c.actions.clear();
    c.on_connection_failed(0, "cut", |_| Resume::default());
    c.add_connection_at(0, 7, 8192);
    c.reassign_to(0);
    let tmf_itt = reassign_itt(&mut c);
    c.actions.clear();
    c.on_notice(0, tmf_response(tmf_itt, tmf::RSP_REJECTED, 7))
        .unwrap();
    assert!(completions(&mut c).is_empty(), "not failed");
    assert_eq!((c.rejected_reassigns, c.recovery.task_reassigns), (1, 1));
    read_completes(&mut c, read, 8, 2);
}

#[test]
fn a_command_its_datamover_gives_up_as_lost_is_aborted_and_sent_again_as_a_new_task() {
    let mut c = core(limits(true, false));
    let w = c.submit(
        1,
        CommandRequest::write(0, vec![0x2a; 10], Bytes::from(vec![7u8; 4096])),
    );
    c.actions.clear();
    c.on_notice(0, InitiatorNotice::Stalled { itt: w }).unwrap();
    let (conn, abort) = abort_task(&mut c);
    assert_eq!((conn, abort.ref_task_tag, abort.ref_cmd_sn), (0, w, 1));
    // The target had taken it up (ExpCmdSN 2), then lost it.
    c.on_notice(0, tmf_response_at(abort.itt, tmf::RSP_NO_TASK, 5, 2))
        .unwrap();
    let sent = commands(&mut c);
    let Bhs::ScsiCommand(cmd) = &sent[0].pdu.bhs else {
        panic!()
    };
    assert_eq!((cmd.itt, cmd.cmd_sn), (w, 2));
    assert_eq!(c.recovery.reissued_commands, 1);
    // A notice for a command no longer there (or another connection's) changes nothing.
    c.on_notice(0, InitiatorNotice::Stalled { itt: 999 })
        .unwrap();
    assert!(sends(&mut c).is_empty());
}

#[test]
fn erl2_an_aborted_command_that_never_arrived_fills_its_cmdsn_hole_unless_the_target_counted_it() {
    for target_counted_it in [false, true] {
        let mut c = core(limits(true, false));
        let second = c.add_connection(3, 8192);
        // CmdSN 1 goes on connection 0 and is lost with it; the target's ExpCmdSN stays 1.
        let lost = c.submit(1, CommandRequest::read(0, vec![0x28; 10], 512));
        assert_eq!(c.tasks[&lost].conn, Some(0));
        c.actions.clear();
        c.on_connection_failed(0, "cut", |_| Resume::default());
        assert_eq!(c.reissue_orphans(), 1);
        let (conn, abort) = abort_task(&mut c);
        assert_eq!((conn, abort.ref_cmd_sn), (second, 1));
        let exp_cmd_sn = if target_counted_it { 2 } else { 1 };
        let rsp = tmf_response_at(abort.itt, tmf::RSP_COMPLETE, 3, exp_cmd_sn);
        c.on_notice(second, rsp).unwrap();
        let sent = commands(&mut c);
        let Bhs::ScsiCommand(cmd) = &sent[0].pdu.bhs else {
            panic!()
        };
        // Counted as received: a new task with the next CmdSN; else its own CmdSN again,
        // or every later command would wait behind the hole.
        let want = if target_counted_it { 2 } else { 1 };
        assert_eq!((cmd.itt, cmd.cmd_sn), (lost, want), "{target_counted_it}");
    }
}
