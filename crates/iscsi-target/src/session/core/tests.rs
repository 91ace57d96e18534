//! Unit tests of the target session core: PDUs and events in, decisions out, no sockets.

use super::erl2::{self, KeptTasks, Reassign};
use super::*;
use iscsi_session::erl1::snack_type;
use iscsi_wire::lun_to_wire;

/// A core with a window of `depth` from CmdSN 10, whose work is a name.
fn session(depth: u32) -> SessionCore<&'static str> {
    SessionCore::new(10, depth, false)
}

/// The work of each order, and whether it runs (`true`) or was ignored.
fn outcomes(orders: Vec<Order<&'static str>>) -> Vec<(&'static str, bool)> {
    orders
        .into_iter()
        .map(|o| match o {
            Order::Run { work, .. } => (work, true),
            Order::Ignored { work, .. } => (work, false),
        })
        .collect()
}

#[test]
fn in_window_commands_run_in_cmd_sn_order() {
    let mut core = session(8);
    assert_eq!(core.window(), (10, 17));
    assert!(outcomes(core.order(false, 12, "c")).is_empty());
    assert!(outcomes(core.order(false, 11, "b")).is_empty());
    let ran = core.order(false, 10, "a");
    assert!(ran
        .iter()
        .all(|o| matches!(o, Order::Run { counted: true, .. })));
    assert_eq!(outcomes(ran), [("a", true), ("b", true), ("c", true)]);
    assert_eq!(core.window().0, 13);
}

#[test]
fn out_of_window_and_duplicate_cmd_sn_are_ignored_and_handed_back() {
    let mut core = session(4);
    match core.order(false, 30, "far").pop() {
        Some(Order::Ignored { work, cmd_sn }) => assert_eq!((work, cmd_sn), ("far", 30)),
        other => panic!("expected Ignored, got {other:?}"),
    }
    // Behind ExpCmdSN.
    assert_eq!(outcomes(core.order(false, 9, "old")), [("old", false)]);
    assert!(core.order(false, 11, "first").is_empty());
    assert_eq!(outcomes(core.order(false, 11, "copy")), [("copy", false)]);
    assert_eq!(core.window().0, 10, "nothing ran: ExpCmdSN stays");
}

#[test]
fn max_cmd_sn_closes_while_commands_run_and_opens_as_they_end() {
    let mut core = session(2);
    assert_eq!(core.window(), (10, 11));
    let _ = core.order(false, 10, "a");
    let a = core.start_task(1, 0, 0);
    let _ = core.order(false, 11, "b");
    let _ = core.start_task(2, 0, 0);
    assert_eq!(core.window(), (12, 11), "two outstanding: no room");
    assert_eq!(outcomes(core.order(false, 12, "c")), [("c", false)]);
    assert!(!core.end_task(1, a, true));
    assert_eq!(core.window(), (12, 12));
    assert_eq!(outcomes(core.order(false, 12, "c")), [("c", true)]);
}

#[test]
fn immediate_work_runs_at_once_outside_the_window() {
    let mut core = session(1);
    let ran = core.order(true, 500, "now");
    assert!(matches!(
        ran.as_slice(),
        [Order::Run {
            work: "now",
            counted: false
        }]
    ));
    assert_eq!(core.window(), (10, 10));
}

#[test]
fn immediate_commands_past_the_limit_are_rejected_until_one_ends() {
    let mut core = session(4);
    assert_eq!(core.check_command(true, 1), Ok(()));
    let (reason, _) = core.check_command(true, 1).unwrap_err();
    assert_eq!(reason, reject::IMMEDIATE_COMMAND_REJECTED);
    // Non-immediate commands are bounded by the window instead.
    assert_eq!(core.check_command(false, 1), Ok(()));
    let id = core.start_task(1, 0, 0);
    core.end_task(1, id, false);
    assert_eq!(core.check_command(true, 1), Ok(()));
}

#[test]
fn scsi_commands_in_a_discovery_session_are_rejected() {
    let mut core: SessionCore<()> = SessionCore::new(1, 4, true);
    let (reason, why) = core.check_command(false, 8).unwrap_err();
    assert_eq!(reason, reject::PROTOCOL_ERROR);
    assert!(why.contains("discovery"));
}

#[test]
fn abort_task_claims_a_running_task_once_and_suppresses_its_response() {
    let mut core = session(4);
    let id = core.start_task(0x42, 1, lun_to_wire(0));
    assert!(core.claim_for_abort(0x42));
    assert!(
        !core.claim_for_abort(0x42),
        "a second abort finds it settled"
    );
    assert!(core.end_task(0x42, id, false), "its end sees the abort");
    assert!(
        !core.claim_for_abort(0x42),
        "an ended task no longer exists"
    );
}

#[test]
fn a_task_that_ended_first_is_not_claimed_by_a_late_abort() {
    let mut core = session(4);
    let id = core.start_task(7, 1, 0);
    assert!(!core.end_task(7, id, false));
    assert!(!core.claim_for_abort(7));
}

#[test]
fn a_reused_itt_keeps_each_run_apart() {
    let mut core = session(4);
    let first = core.start_task(5, 1, 0);
    assert!(core.claim_for_abort(5));
    // The initiator reuses the aborted task's ITT at once.
    let second = core.start_task(5, 2, 0);
    assert!(
        core.end_task(5, first, false),
        "the first run stays aborted"
    );
    assert_eq!(
        core.tasks_on(2),
        [5],
        "the second run is still in the table"
    );
    assert!(!core.end_task(5, second, false));
    assert!(core.tasks_on(2).is_empty());
}

#[test]
fn a_duplicate_itt_without_abort_lets_both_runs_answer() {
    let mut core = session(4);
    let first = core.start_task(9, 1, 0);
    let second = core.start_task(9, 1, 0);
    assert!(!core.end_task(9, first, false));
    assert_eq!(core.tasks_on(1), [9]);
    assert!(!core.end_task(9, second, false));
}

#[test]
fn tasks_are_found_by_lun_and_connection_and_move_on_reassignment() {
    let mut core = session(8);
    core.start_task(1, 1, lun_to_wire(0));
    core.start_task(2, 1, lun_to_wire(1));
    core.start_task(3, 2, lun_to_wire(1));
    let mut on_lun1 = core.tasks_matching(|_, wire| lun_from_wire(wire) == 1);
    on_lun1.sort();
    assert_eq!(on_lun1, [(2, 1), (3, 2)]);
    core.move_task(2, 2);
    let mut on_2 = core.tasks_on(2);
    on_2.sort();
    assert_eq!(on_2, [2, 3]);
    assert_eq!(core.tasks_on(1), [1]);
}

fn lun_from_wire(wire: u64) -> u16 {
    iscsi_wire::lun_from_wire(wire)
}

fn tmf(function: u8, lun: u16) -> TaskMgmtRequest {
    TaskMgmtRequest {
        function,
        lun: lun_to_wire(lun),
        itt: 0x77,
        ref_task_tag: 0x42,
        ref_cmd_sn: 20,
        ..Default::default()
    }
}

#[test]
fn task_management_plans() {
    let luns = [0u64, 1];
    let plan = |f, lun| tmf_plan(&tmf(f, lun), false, Some(("dev", &luns[..])));
    let act = |a| TmfPlan::Act("dev", a);
    assert_eq!(plan(tmf::ABORT_TASK, 5), act(TmfAction::AbortTask));
    assert_eq!(
        plan(tmf::ABORT_TASK_SET, 1),
        act(TmfAction::AbortTaskSet(1))
    );
    assert_eq!(
        plan(tmf::CLEAR_TASK_SET, 0),
        act(TmfAction::ClearTaskSet(0))
    );
    assert_eq!(
        plan(tmf::LOGICAL_UNIT_RESET, 1),
        act(TmfAction::LunReset(1))
    );
    for f in [
        tmf::ABORT_TASK_SET,
        tmf::CLEAR_TASK_SET,
        tmf::LOGICAL_UNIT_RESET,
    ] {
        assert_eq!(plan(f, 9), TmfPlan::Answer(tmf::RSP_NO_LUN));
    }
    assert_eq!(
        plan(tmf::TARGET_COLD_RESET, 9),
        act(TmfAction::TargetReset { cold: true })
    );
    assert_eq!(
        plan(tmf::TARGET_WARM_RESET, 0),
        act(TmfAction::TargetReset { cold: false })
    );
    assert_eq!(
        plan(tmf::TASK_REASSIGN, 0),
        TmfPlan::Answer(tmf::RSP_REASSIGN_NOT_SUPPORTED)
    );
    assert_eq!(plan(0x55, 0), TmfPlan::Answer(tmf::RSP_NOT_SUPPORTED));
    let t = tmf(tmf::TASK_REASSIGN, 0);
    assert_eq!(
        tmf_plan(&t, true, Some(("dev", &luns[..]))),
        TmfPlan::Reassign
    );
    // A discovery session has no device; TASK REASSIGN at level 2 is still decided there.
    let t = tmf(tmf::LOGICAL_UNIT_RESET, 0);
    assert_eq!(
        tmf_plan::<()>(&t, false, None),
        TmfPlan::Answer(tmf::RSP_NOT_SUPPORTED)
    );
    let t = tmf(tmf::TASK_REASSIGN, 0);
    assert_eq!(tmf_plan::<()>(&t, true, None), TmfPlan::Reassign);
}

#[test]
fn abort_task_responses() {
    let t = tmf(tmf::ABORT_TASK, 0); // RefCmdSN 20
    assert_eq!(abort_task(&t, true, false, 30), tmf::RSP_COMPLETE);
    assert_eq!(abort_task(&t, false, true, 30), tmf::RSP_COMPLETE);
    // Not arrived yet (ExpCmdSN at or before its CmdSN).
    assert_eq!(abort_task(&t, false, false, 20), tmf::RSP_COMPLETE);
    assert_eq!(abort_task(&t, false, false, 21), tmf::RSP_NO_TASK);
}

#[test]
fn nop_out_is_answered_with_its_data_cut_to_max_send() {
    let n = NopOut {
        lun: lun_to_wire(3),
        itt: 0x1234,
        ttt: RESERVED_TAG,
        ..Default::default()
    };
    let data = Bytes::from(vec![0xab; 100]);
    let reply = nop_reply(&n, &data, 16).expect("a NOP-In");
    match reply.bhs {
        Bhs::NopIn(nop) => {
            assert_eq!(
                (nop.itt, nop.ttt, nop.lun),
                (0x1234, RESERVED_TAG, lun_to_wire(3))
            );
        }
        other => panic!("expected NOP-In, got {other:?}"),
    }
    assert_eq!(reply.data, Bytes::from(vec![0xab; 16]));
    let answer = NopOut {
        itt: RESERVED_TAG,
        ..n
    };
    assert!(nop_reply(&answer, &data, 16).is_none());
}

#[test]
fn ping_goes_out_after_silence_and_ends_the_connection_unanswered() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut pings = PingTimer::new(s(5), s(2), t0);
    assert_eq!(pings.deadline(t0), t0 + s(5));
    assert_eq!(pings.fired(t0 + s(1)), PingStep::Wait(t0 + s(5)));
    let PingStep::Ping(nop) = pings.fired(t0 + s(5)) else {
        panic!("expected a ping");
    };
    assert_eq!((nop.itt, nop.ttt), (RESERVED_TAG, 1));
    assert_eq!(pings.ping_sent(t0 + s(5)), t0 + s(7));
    assert_eq!(pings.fired(t0 + s(7)), PingStep::Unanswered);
}

#[test]
fn any_pdu_answers_a_ping_and_the_next_ping_has_a_new_tag() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut pings = PingTimer::new(s(5), s(2), t0);
    assert!(matches!(pings.fired(t0 + s(5)), PingStep::Ping(_)));
    pings.ping_sent(t0 + s(5));
    assert_eq!(pings.heard(t0 + s(6)), Some(t0 + s(11)));
    assert_eq!(pings.heard(t0 + s(7)), None, "no ping out: the timer stays");
    // Fired at the old deadline: the PDU moved it.
    assert_eq!(pings.fired(t0 + s(11)), PingStep::Wait(t0 + s(12)));
    let PingStep::Ping(nop) = pings.fired(t0 + s(12)) else {
        panic!("expected a ping");
    };
    assert_eq!(nop.ttt, 2);
}

#[test]
fn no_pings_when_the_interval_is_zero() {
    let t0 = Instant::now();
    let mut pings = PingTimer::new(Duration::ZERO, Duration::from_secs(2), t0);
    let later = t0 + Duration::from_secs(10_000);
    assert_eq!(pings.fired(later), PingStep::Wait(later + IDLE_RECHECK));
}

fn logout_req(reason: u8, cid: u16) -> LogoutRequest {
    LogoutRequest {
        reason,
        cid,
        itt: 0x99,
        ..Default::default()
    }
}

fn cx(joined: bool, tasks_kept: bool, erl2: bool) -> LogoutContext {
    LogoutContext {
        joined,
        tasks_kept,
        erl2,
        time2wait: 2,
        time2retain: 20,
    }
}

#[test]
fn logout_closing_the_session() {
    let plan = logout(&logout_req(0, 1), cx(true, false, false));
    assert!(plan.drain);
    assert_eq!(plan.after, AfterLogout::CloseSession);
    assert_eq!(
        plan.response,
        LogoutResponse {
            response: 0,
            itt: 0x99,
            time2wait: 2,
            time2retain: 20,
            ..Default::default()
        }
    );
}

#[test]
fn logout_closing_a_connection() {
    let plan = logout(&logout_req(1, 3), cx(true, false, false));
    assert_eq!((plan.response.response, plan.drain), (0, true));
    assert_eq!(plan.after, AfterLogout::RemoveConnection(3));
    // A CID not in the session: "CID not found".
    let plan = logout(&logout_req(1, 4), cx(false, false, true));
    assert_eq!(plan.response.response, 1);
    assert_eq!(plan.after, AfterLogout::Nothing);
}

#[test]
fn logout_removing_a_connection_for_recovery() {
    let plan = logout(&logout_req(2, 3), cx(true, false, true));
    assert_eq!((plan.response.response, plan.drain), (0, false));
    assert_eq!(plan.after, AfterLogout::RemoveConnection(3));
    // Failed already, its tasks kept for reassignment.
    let plan = logout(&logout_req(2, 3), cx(false, true, true));
    assert_eq!(plan.response.response, 0);
    let plan = logout(&logout_req(2, 3), cx(false, false, true));
    assert_eq!(plan.response.response, 1, "CID not found");
    // Below level 2: "connection recovery is not supported".
    let plan = logout(&logout_req(2, 3), cx(false, false, false));
    assert_eq!(plan.response.response, 2);
    assert_eq!(plan.after, AfterLogout::Nothing);
}

fn snack_req(snack_type: u8, beg_run: u32, run_length: u32) -> SnackRequest {
    SnackRequest {
        snack_type,
        itt: 0x10,
        ttt: 0x20,
        beg_run,
        run_length,
        ..Default::default()
    }
}

#[test]
fn snack_at_level_0_is_a_snack_reject() {
    let plan = snack(&snack_req(snack_type::STATUS, 0, 0), 0);
    assert!(matches!(
        plan,
        SnackPlan::Reject {
            reason: reject::SNACK_REJECT,
            data_sn: 0,
            ..
        }
    ));
}

#[test]
fn snack_types_at_level_1() {
    let plan = |t, b, l| snack(&snack_req(t, b, l), 1);
    assert_eq!(plan(snack_type::STATUS, 4, 2), SnackPlan::Status);
    assert_eq!(
        plan(snack_type::DATA_R2T, 3, 2),
        SnackPlan::DataR2t {
            itt: 0x10,
            beg_run: 3,
            run_length: 2
        }
    );
    assert_eq!(
        plan(snack_type::DATA_ACK, 8, 0),
        SnackPlan::DataAck {
            ttt: 0x20,
            beg_run: 8
        }
    );
    assert_eq!(
        plan(snack_type::R_DATA, 0, 0),
        SnackPlan::RData {
            itt: 0x10,
            tag: 0x20
        }
    );
    assert!(matches!(
        plan(snack_type::R_DATA, 1, 0),
        SnackPlan::Reject {
            reason: reject::PROTOCOL_ERROR,
            ..
        }
    ));
    assert!(matches!(
        plan(7, 0, 0),
        SnackPlan::Reject {
            reason: reject::SNACK_REJECT,
            ..
        }
    ));
}

#[test]
fn a_refused_data_snack_names_where_its_run_began() {
    let s = snack_req(snack_type::DATA_R2T, 6, 1);
    match data_snack_refused(&s, "gone") {
        SnackPlan::Reject {
            reason,
            data_sn,
            why,
        } => {
            assert_eq!((reason, data_sn), (reject::PROTOCOL_ERROR, 6));
            assert!(why.contains("gone"));
        }
        other => panic!("expected a Reject, got {other:?}"),
    }
}

#[test]
fn status_snack_resends_the_retained_run() {
    // StatSN 5..=8 retained, 9 next.
    let retained = |sn: u32| (5..9).contains(&sn).then_some(sn * 100);
    let s = snack_req(snack_type::STATUS, 6, 2);
    assert_eq!(status_run(&s, 5, 9, retained), Ok(vec![600, 700]));
    // BegRun 0 and RunLength 0: all that is retained.
    let s = snack_req(snack_type::STATUS, 0, 0);
    assert_eq!(status_run(&s, 5, 9, retained), Ok(vec![500, 600, 700, 800]));
    // Never sent.
    let s = snack_req(snack_type::STATUS, 12, 1);
    assert!(status_run(&s, 5, 9, retained).is_err());
    // Within the numbers but dropped from retention.
    let s = snack_req(snack_type::STATUS, 6, 1);
    let why = status_run(&s, 5, 9, |_| None::<u32>).unwrap_err();
    assert!(why.contains("no longer retained"), "{why}");
}

/// Kept tasks whose driver's part is a name, DefaultTime2Retain 20 s.
fn kept() -> KeptTasks<&'static str> {
    KeptTasks::new(Duration::from_secs(20))
}

#[test]
fn erl2_keeps_a_new_task_but_not_a_copy_of_one_in_progress() {
    let mut k = kept();
    assert!(k.may_keep(1));
    let a = k.keep(1, 100, 0, |_| "a");
    assert_eq!(a, "a");
    assert!(!k.may_keep(1), "in progress: a copy of its command");
    let mut id = None;
    k.keep(2, 100, 0, |i| {
        id = Some(i);
        "b"
    });
    let id = id.expect("told its id");
    assert_eq!(
        k.executed(2, id),
        Some(100),
        "its response goes on connection 100"
    );
    assert!(
        k.may_keep(2),
        "its response went out: the ITT may be reused"
    );
    k.keep(2, 100, 0, |_| "b2");
    assert!(!k.holds(2, id), "replaced");
    assert_eq!(
        k.forget(2, id),
        None,
        "a replaced run is not forgotten twice"
    );
    assert_eq!(k.count(), 2);
}

#[test]
fn erl2_an_acknowledgement_ends_an_executed_task_on_its_connection_only() {
    let mut k = kept();
    let mut id = None;
    k.keep(7, 100, 0, |i| {
        id = Some(i);
        "t"
    });
    let id = id.unwrap();
    assert_eq!(k.acknowledged(7, 100), None, "not executed yet");
    k.executed(7, id);
    assert_eq!(
        k.acknowledged(7, 101),
        None,
        "acknowledged on another connection"
    );
    assert_eq!(k.acknowledged(7, 100), Some("t"));
    assert!(!k.any());
}

#[test]
fn erl2_time2retain_ends_only_a_failed_connections_tasks_and_only_when_it_runs_out() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut k = kept();
    k.keep(1, 100, 0, |_| "on 100");
    k.keep(2, 100, 0, |_| "moves");
    k.keep(3, 200, 1, |_| "on 200");
    assert_eq!(
        k.connection_failed(300, t0),
        0,
        "nothing waits for a third one"
    );
    assert_eq!(k.connection_failed(100, t0), 2);
    assert_eq!(
        k.reassign(2, 200, 1, |c| c == 200),
        (Reassign::Move, Some("moves"))
    );
    assert!(
        k.expire(t0 + s(19)).is_empty(),
        "DefaultTime2Retain not over"
    );
    assert_eq!(k.expire(t0 + s(20)), ["on 100"]);
    assert!(k.expire(t0 + s(40)).is_empty(), "expired once");
    assert_eq!(k.count(), 2, "the moved task and connection 200's stay");
    assert!(k.any_on_cid(1) && !k.any_on_cid(0));
    assert_eq!(k.forget_all().len(), 2);
}

#[test]
fn erl2_task_reassignment() {
    let mut k = kept();
    let live = |c: u64| c == 200;
    assert_eq!(k.reassign(9, 200, 1, live), (Reassign::NoTask, None));
    assert_eq!(Reassign::NoTask.response(), tmf::RSP_NO_TASK);
    k.keep(4, 200, 1, |_| "t");
    assert_eq!(
        k.reassign(4, 200, 1, live),
        (Reassign::StillAllegiant, None)
    );
    assert_eq!(
        Reassign::StillAllegiant.response(),
        tmf::RSP_STILL_ALLEGIANT
    );
    k.keep(5, 100, 0, |_| "u");
    assert_eq!(k.reassign(5, 200, 1, live), (Reassign::Move, Some("u")));
    assert_eq!(Reassign::Move.response(), tmf::RSP_COMPLETE);
    assert!(!k.any_on_cid(0), "it answers on CID 1 now");
    assert_eq!(k.count_on(200), 2);
    assert_eq!(k.forget_itt(5), Some("u"));
    assert_eq!(k.forget_itt(5), None);
}

#[test]
fn a_budget_refusal_is_answered_task_set_full_without_sense() {
    let pdu = scsi_response(0x31, &task_set_full(), 2);
    match pdu.bhs {
        Bhs::ScsiResponse(r) => {
            assert_eq!(r.status, scsi::status::TASK_SET_FULL);
            assert_eq!((r.itt, r.response, r.exp_data_sn), (0x31, 0, 2));
            assert!(!r.overflow && !r.underflow && r.residual == 0);
        }
        other => panic!("expected a SCSI Response, got {other:?}"),
    }
    assert!(pdu.data.is_empty());
    assert!(collapsed_status(&task_set_full()).is_none());
    let why = BudgetRefusal::Keep("session budget full".into()).to_string();
    assert!(
        why.starts_with("command refused with TASK SET FULL"),
        "{why}"
    );
    assert!(BudgetRefusal::Read("x".into())
        .to_string()
        .starts_with("read refused"));
    assert!(BudgetRefusal::Write("x".into())
        .to_string()
        .starts_with("write refused"));
}

#[test]
fn a_data_phase_error_carries_aborted_command_sense() {
    let pdu = scsi_response(1, &data_phase_error(), 0);
    let Bhs::ScsiResponse(r) = pdu.bhs else {
        panic!("expected a SCSI Response");
    };
    assert_eq!(r.status, scsi::status::CHECK_CONDITION);
    let len = u16::from_be_bytes([pdu.data[0], pdu.data[1]]) as usize;
    assert_eq!(pdu.data.len(), 2 + len);
    let sense = &pdu.data[2..];
    assert_eq!(sense[0] & 0x7f, 0x70, "fixed format");
    assert_eq!(sense[2] & 0x0f, scsi::sense::key::ABORTED_COMMAND);
    assert_eq!(sense[12], scsi::sense::asc::DATA_PHASE_ERROR.0);
}

fn good_read(len: usize, residual: scsi::Residual) -> scsi::Response {
    scsi::Response {
        data_in: Bytes::from(vec![0; len]),
        residual,
        ..task_set_full()
    }
}

#[test]
fn a_good_read_collapses_its_status_into_the_last_data_in() {
    let rsp = scsi::Response {
        status: scsi::status::GOOD,
        ..good_read(512, scsi::Residual::Underflow(512))
    };
    assert_eq!(
        collapsed_status(&rsp),
        Some(CollapsedStatus {
            status: scsi::status::GOOD,
            overflow: false,
            underflow: true,
            residual: 512
        })
    );
    let bidi = scsi::Response {
        bidi_read_residual: Some(scsi::Residual::Overflow(4)),
        ..rsp.clone()
    };
    assert!(collapsed_status(&bidi).is_none());
    let pdu = scsi_response(2, &bidi, 3);
    let Bhs::ScsiResponse(r) = pdu.bhs else {
        panic!("expected a SCSI Response");
    };
    assert!(r.underflow && r.bidi_overflow);
    assert_eq!(
        (r.residual, r.bidi_read_residual, r.exp_data_sn),
        (512, 4, 3)
    );
    let no_data = scsi::Response {
        data_in: Bytes::new(),
        ..rsp
    };
    assert!(collapsed_status(&no_data).is_none());
}

#[test]
fn control_pdus_are_ordered_by_their_cmd_sn_and_immediate_bit() {
    let nop = NopOut {
        itt: 3,
        cmd_sn: 44,
        ..Default::default()
    };
    assert_eq!(control_order(&Bhs::NopOut(nop.clone())), Some((false, 44)));
    let ping_answer = NopOut {
        itt: RESERVED_TAG,
        ..nop
    };
    assert_eq!(control_order(&Bhs::NopOut(ping_answer)), None);
    let logout = LogoutRequest {
        immediate: true,
        cmd_sn: 7,
        ..Default::default()
    };
    assert_eq!(control_order(&Bhs::LogoutRequest(logout)), Some((true, 7)));
    let t = TaskMgmtRequest {
        cmd_sn: 9,
        ..tmf(tmf::ABORT_TASK, 0)
    };
    assert_eq!(control_order(&Bhs::TaskMgmtRequest(t)), Some((false, 9)));
    // Not ordered: it runs at once, to be answered (SNACK) or rejected.
    let snack = Bhs::SnackRequest(snack_req(snack_type::STATUS, 0, 0));
    assert_eq!(control_order(&snack), Some((true, 0)));
}

#[test]
fn pdus_an_initiator_does_not_send_in_full_feature_phase_are_rejected() {
    let snack = Bhs::SnackRequest(snack_req(snack_type::STATUS, 0, 0));
    assert_eq!(refuse_control(&snack), None);
    assert_eq!(refuse_control(&Bhs::NopOut(NopOut::default())), None);
    let (reason, why) = refuse_control(&Bhs::NopIn(NopIn::default())).expect("a Reject");
    assert_eq!(reason, reject::PROTOCOL_ERROR);
    assert!(why.contains("in full feature phase"), "{why}");
    let rsp = Bhs::LogoutResponse(LogoutResponse::default());
    assert!(refuse_control(&rsp).is_some());
}

#[test]
fn the_window_is_handed_out_only_when_it_moved() {
    let mut core = session(2);
    assert_eq!(core.window_update(), None, "as the session began");
    assert!(core.order(false, 11, "b").is_empty());
    assert_eq!(
        core.window_update(),
        None,
        "a gap: nothing ran, no room freed"
    );
    let _ = core.order(false, 10, "a");
    assert_eq!(core.window_update(), Some((12, 11)));
    assert_eq!(core.window_update(), None);
    core.complete();
    assert_eq!(core.window_update(), Some((12, 12)));
}

#[test]
fn what_the_core_holds_is_counted() {
    let mut core = session(4);
    let empty = Held {
        queued: 0,
        outstanding: 0,
        tasks: 0,
        superseded: 0,
        immediate: 0,
    };
    assert_eq!(core.held(), empty);
    assert!(core.order(false, 12, "later").is_empty());
    let _ = core.order(false, 10, "a");
    let a = core.start_task(1, 0, 0);
    assert_eq!(core.check_command(true, 2), Ok(()));
    let i = core.start_task(1, 0, 0);
    assert_eq!(
        core.held(),
        Held {
            queued: 1,
            outstanding: 1,
            tasks: 1,
            superseded: 1,
            immediate: 1,
        }
    );
    core.end_task(1, a, true);
    core.end_task(1, i, false);
    assert_eq!(core.held(), Held { queued: 1, ..empty });
}

#[test]
fn erl2_an_acknowledged_status_names_its_task() {
    let rsp = Bhs::ScsiResponse(ScsiResponse {
        itt: 0x51,
        ..Default::default()
    });
    assert_eq!(erl2::status_of(&rsp), Some(0x51));
    let last = iscsi_wire::DataIn {
        itt: 0x52,
        status_present: true,
        ..Default::default()
    };
    assert_eq!(erl2::status_of(&Bhs::DataIn(last.clone())), Some(0x52));
    let middle = iscsi_wire::DataIn {
        status_present: false,
        ..last
    };
    assert_eq!(erl2::status_of(&Bhs::DataIn(middle)), None);
    let nop = Bhs::NopIn(NopIn {
        itt: 0x53,
        ..Default::default()
    });
    assert_eq!(erl2::status_of(&nop), None);
}
