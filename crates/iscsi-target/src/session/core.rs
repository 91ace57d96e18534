//! The sans-IO heart of a target session in full feature phase: the CmdSN window and the
//! immediate-command count, the task table (which task runs under which ITT, on which
//! connection, and whether task management has claimed it), and the protocol decisions
//! on what arrives — which PDUs are refused with which Reject reason, the NOP-In answering
//! a NOP-Out, the NOP-In ping and its timeout (time comes in as an argument), the Logout
//! Response and what follows it, the task management response, the answer to a SNACK, the
//! response of a command that never reached its logical unit (TASK SET FULL, data phase
//! errors) and the PDUs that carry a command's status.
//!
//! It owns no socket, no clock and no task: the driver (`session.rs`) holds it under a
//! lock, feeds it what arrives and what ends, and carries out what it returns with the
//! connection's datamover and the SCSI engine. It is generic over the work `W` that waits
//! for its turn in CmdSN order, so its tests drive it with plain values.

use bytes::{BufMut, Bytes, BytesMut};
use datamover::CollapsedStatus;
use iscsi_session::CmdWindow;
use iscsi_wire::serial::sn_le;
use iscsi_wire::{
    reject, tmf, Bhs, LogoutRequest, LogoutResponse, NopIn, NopOut, Pdu, ScsiResponse,
    SnackRequest, TaskMgmtRequest, RESERVED_TAG,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub mod erl2;
#[cfg(test)]
mod tests;

/// What the driver does with a PDU offered for CmdSN ordering.
#[derive(Debug)]
pub enum Order<W> {
    /// Runs now; `counted` when it took a slot of the CmdSN window (its end calls
    /// [`SessionCore::end_task`] or [`SessionCore::complete`] with it).
    Run { work: W, counted: bool },
    /// Outside the window or a duplicate CmdSN: ignored without an answer (RFC 7143
    /// §3.2.2.1), and what its transport set up for it is freed.
    Ignored { work: W, cmd_sn: u32 },
}

/// Why an arriving SCSI command is refused before it is ordered: the Reject reason and the
/// line logged.
pub type Refusal = (u8, &'static str);

/// A task in the task table, found by its ITT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TaskEntry {
    id: TaskId,
    cid: u16,
    /// The LUN field as it came on the wire.
    lun: u64,
    /// Set by whichever comes first: the task's end, which then sends its response, or an
    /// ABORT TASK, which then answers Function complete and no response is sent. So an
    /// abort racing the task's end never both succeeds and lets the status out.
    settled: bool,
}

/// One run of a task (an ITT may be reused once its task was aborted, while the aborted
/// run still ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId(u64);

/// The session's state that every connection shares.
#[derive(Debug)]
pub struct SessionCore<W> {
    /// Admission and order, holding the work that waits for its CmdSN; what it turns away
    /// comes back to the driver to be freed.
    window: CmdWindow<W>,
    /// The latest task under each ITT.
    tasks: HashMap<u32, TaskEntry>,
    /// Runs whose ITT a newer task took before they ended: whether an abort settled them.
    superseded: HashMap<TaskId, bool>,
    next_task: u64,
    /// Immediate SCSI commands running now: outside the CmdSN window, nothing else bounds
    /// them.
    immediate_running: u32,
    discovery: bool,
    /// The window last handed out by [`SessionCore::window_update`].
    published: (u32, u32),
}

/// What a session core holds now, for checks of its bounds (the fuzz target's).
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Commands waiting in the window for a CmdSN gap to fill.
    pub queued: usize,
    /// Work taken from the window and not completed yet.
    pub outstanding: u32,
    /// Tasks in the task table (the latest under each ITT).
    pub tasks: usize,
    /// Runs whose ITT a newer task took before they ended.
    pub superseded: usize,
    /// Immediate commands counted running.
    pub immediate: u32,
}

impl<W> SessionCore<W> {
    /// A session whose window starts at the leading login's CmdSN and allows `depth`
    /// commands outstanding.
    pub fn new(cmd_sn: u32, depth: u32, discovery: bool) -> Self {
        let mut window = CmdWindow::new(cmd_sn, depth);
        let published = (window.exp_cmd_sn(), window.max_cmd_sn());
        SessionCore {
            window,
            tasks: HashMap::new(),
            superseded: HashMap::new(),
            next_task: 0,
            immediate_running: 0,
            discovery,
            published,
        }
    }

    /// (ExpCmdSN, MaxCmdSN) to advertise now.
    pub fn window(&mut self) -> (u32, u32) {
        (self.window.exp_cmd_sn(), self.window.max_cmd_sn())
    }

    /// The window to advertise when it changed since it was last handed out here (the
    /// first time: since the session began with [`Self::new`]'s); `None` when it did not,
    /// so the driver publishes it only when it moved.
    pub fn window_update(&mut self) -> Option<(u32, u32)> {
        let now = self.window();
        (now != self.published).then(|| {
            self.published = now;
            now
        })
    }

    /// What the core holds now.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn held(&self) -> Held {
        Held {
            queued: self.window.queued(),
            outstanding: self.window.outstanding(),
            tasks: self.tasks.len(),
            superseded: self.superseded.len(),
            immediate: self.immediate_running,
        }
    }

    /// A SCSI Command arrived (`immediate`: its I bit): `Err` with the Reject to answer it
    /// with (then it is not ordered), else it goes to [`Self::order`]. An immediate command accepted here is
    /// counted running until [`Self::end_task`].
    pub fn check_command(&mut self, immediate: bool, max_immediate: u32) -> Result<(), Refusal> {
        if self.discovery {
            return Err((
                reject::PROTOCOL_ERROR,
                "SCSI command in a discovery session",
            ));
        }
        if immediate {
            if self.immediate_running >= max_immediate {
                return Err((
                    reject::IMMEDIATE_COMMAND_REJECTED,
                    "too many immediate commands running (max_immediate_commands)",
                ));
            }
            self.immediate_running += 1;
        }
        Ok(())
    }

    /// Immediate work runs now; the rest is admitted into CmdSN order, and runs with
    /// whatever else became ready.
    pub fn order(&mut self, immediate: bool, cmd_sn: u32, work: W) -> Vec<Order<W>> {
        if immediate {
            return vec![Order::Run {
                work,
                counted: false,
            }];
        }
        if let Err((_, work)) = self.window.offer(cmd_sn, work) {
            // Outside the window or a duplicate CmdSN.
            return vec![Order::Ignored { work, cmd_sn }];
        }
        let mut ready = Vec::new();
        while let Some(work) = self.window.pop_ready() {
            ready.push(Order::Run {
                work,
                counted: true,
            });
        }
        ready
    }

    /// Work that took a window slot and has no task (a control PDU) is done.
    pub fn complete(&mut self) {
        self.window.complete();
    }

    /// A SCSI task starts under `itt` on connection `cid`; it replaces in the table any
    /// older task under the same ITT.
    pub fn start_task(&mut self, itt: u32, cid: u16, lun: u64) -> TaskId {
        let id = TaskId(self.next_task);
        self.next_task += 1;
        let entry = TaskEntry {
            id,
            cid,
            lun,
            settled: false,
        };
        if let Some(old) = self.tasks.insert(itt, entry) {
            self.superseded.insert(old.id, old.settled);
        }
        id
    }

    /// Task `id` under `itt` ended; `counted` as [`Order::Run`] said. Frees its window slot
    /// (so its response carries the larger MaxCmdSN) or its immediate count. Returns true
    /// when an ABORT TASK claimed it first: then no response is sent.
    pub fn end_task(&mut self, itt: u32, id: TaskId, counted: bool) -> bool {
        let aborted = match self.tasks.get(&itt) {
            Some(e) if e.id == id => self.tasks.remove(&itt).is_some_and(|e| e.settled),
            _ => self.superseded.remove(&id).unwrap_or(false),
        };
        if counted {
            self.window.complete();
        } else {
            self.immediate_running = self.immediate_running.saturating_sub(1);
        }
        aborted
    }

    /// ABORT TASK of `itt`: true when the task is known and had not ended (from here its
    /// response is not sent); a task that has ended no longer exists for an abort.
    pub fn claim_for_abort(&mut self, itt: u32) -> bool {
        match self.tasks.get_mut(&itt) {
            Some(e) if !e.settled => {
                e.settled = true;
                true
            }
            _ => false,
        }
    }

    /// The tasks (ITT and connection) whose ITT and wire LUN match `pred`.
    pub fn tasks_matching(&self, pred: impl Fn(u32, u64) -> bool) -> Vec<(u32, u16)> {
        self.tasks
            .iter()
            .filter(|(itt, e)| pred(**itt, e.lun))
            .map(|(itt, e)| (*itt, e.cid))
            .collect()
    }

    /// The ITTs of the tasks on connection `cid`.
    pub fn tasks_on(&self, cid: u16) -> Vec<u32> {
        self.tasks
            .iter()
            .filter(|(_, e)| e.cid == cid)
            .map(|(itt, _)| *itt)
            .collect()
    }

    /// Task `itt` answers on connection `cid` from now (TASK REASSIGN).
    pub fn move_task(&mut self, itt: u32, cid: u16) {
        if let Some(e) = self.tasks.get_mut(&itt) {
            e.cid = cid;
        }
    }
}

/// Where a control PDU (anything but a SCSI Command) goes in CmdSN order: `(immediate,
/// CmdSN)` for [`SessionCore::order`], or `None` for a NOP-Out that answers a ping or only
/// updates ExpStatSN (immediate by rule, no reply). A PDU the session does not take in full
/// feature phase runs at once, to be rejected.
pub fn control_order(bhs: &Bhs) -> Option<(bool, u32)> {
    Some(match bhs {
        Bhs::NopOut(n) if n.itt == RESERVED_TAG => return None,
        Bhs::NopOut(n) => (n.immediate, n.cmd_sn),
        Bhs::TextRequest(t) => (t.immediate, t.cmd_sn),
        Bhs::LogoutRequest(l) => (l.immediate, l.cmd_sn),
        Bhs::TaskMgmtRequest(t) => (t.immediate, t.cmd_sn),
        _ => (true, 0),
    })
}

/// The Reject (Protocol Error) of a control PDU the session does not answer: a SCSI
/// Command that came as control (the datamover of a discovery session does not take
/// commands), or any PDU an initiator does not send in full feature phase; `None` for a
/// PDU the session answers.
pub fn refuse_control(bhs: &Bhs) -> Option<(u8, String)> {
    let why = match bhs {
        Bhs::NopOut(_)
        | Bhs::TextRequest(_)
        | Bhs::LogoutRequest(_)
        | Bhs::TaskMgmtRequest(_)
        | Bhs::SnackRequest(_) => return None,
        Bhs::ScsiCommand(_) => "SCSI command in a discovery session".to_string(),
        other => format!("unexpected {} in full feature phase", other.opcode().name()),
    };
    Some((reject::PROTOCOL_ERROR, why))
}

/// The NOP-In answering a NOP-Out that asks for one (its data echoed, cut to the
/// initiator's MaxRecvDataSegmentLength); `None` for a ping answer or an ExpStatSN update
/// (ITT 0xffffffff), which get no reply.
pub fn nop_reply(n: &NopOut, data: &Bytes, max_send: u32) -> Option<Pdu> {
    if n.itt == RESERVED_TAG {
        return None;
    }
    let mut data = data.clone();
    data.truncate(max_send as usize);
    let nop = NopIn {
        lun: n.lun,
        itt: n.itt,
        ttt: RESERVED_TAG,
        ..Default::default()
    };
    Some(Pdu::new(Bhs::NopIn(nop), data))
}

/// How long a connection with no ping to make waits before its timer is looked at again.
const IDLE_RECHECK: Duration = Duration::from_secs(3600);

/// The NOP-In pings of one connection: one is sent after `every` without hearing from the
/// initiator, and the connection is given up when `timeout` passes without an answer (any
/// PDU counts as one). Time is what the driver passes in.
#[derive(Debug)]
pub struct PingTimer {
    every: Duration,
    timeout: Duration,
    heard: Instant,
    /// When the unanswered ping went out.
    sent: Option<Instant>,
    next_ttt: u32,
}

/// What a connection's timer asks of the driver when it fires.
#[derive(Debug, PartialEq, Eq)]
pub enum PingStep {
    /// Nothing is due yet: set the timer for then.
    Wait(Instant),
    /// Send this NOP-In ping (within the ping timeout), then [`PingTimer::ping_sent`].
    Ping(NopIn),
    /// The ping went unanswered: the connection ends.
    Unanswered,
}

impl PingTimer {
    /// Pings after `every` of silence (never when zero), each answered within `timeout`.
    pub fn new(every: Duration, timeout: Duration, now: Instant) -> Self {
        PingTimer {
            every,
            timeout,
            heard: now,
            sent: None,
            next_ttt: 1,
        }
    }

    /// When the timer should fire next.
    pub fn deadline(&self, now: Instant) -> Instant {
        match self.sent {
            Some(at) => at + self.timeout,
            None if self.every.is_zero() => now + IDLE_RECHECK,
            None => self.heard + self.every,
        }
    }

    /// The timer fired at `now`.
    pub fn fired(&mut self, now: Instant) -> PingStep {
        let due = self.deadline(now);
        if due > now {
            // The initiator was heard from since the timer was set.
            return PingStep::Wait(due);
        }
        if self.sent.is_some() {
            return PingStep::Unanswered;
        }
        if self.every.is_zero() {
            return PingStep::Wait(self.deadline(now));
        }
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1).max(1);
        PingStep::Ping(NopIn {
            itt: RESERVED_TAG,
            ttt,
            ..Default::default()
        })
    }

    /// The ping went out at `now`; returns when the timer fires next.
    pub fn ping_sent(&mut self, now: Instant) -> Instant {
        self.sent = Some(now);
        self.deadline(now)
    }

    /// A PDU came at `now`. Returns the timer's new deadline when it must move back (the
    /// answered ping's timeout may be later than the next ping is due).
    pub fn heard(&mut self, now: Instant) -> Option<Instant> {
        self.heard = now;
        self.sent.take().map(|_| self.deadline(now))
    }
}

/// What is done after a Logout Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterLogout {
    /// The session ends: its tasks are forgotten, its connections close once the response
    /// is out.
    CloseSession,
    /// Connection `cid` leaves the session now (at level 2 its tasks wait for reassignment).
    RemoveConnection(u16),
    Nothing,
}

/// The answer to a Logout Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutPlan {
    /// Wait (bounded) for the connection's commands in flight before answering.
    pub drain: bool,
    pub response: LogoutResponse,
    pub after: AfterLogout,
}

/// What the session knows of a Logout Request's connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogoutContext {
    /// The CID is a connection of the session.
    pub joined: bool,
    /// Level 2: tasks are allegiant to a (failed) connection with the CID.
    pub tasks_kept: bool,
    pub erl2: bool,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// Decides the Logout Response: closing the session always succeeds; closing or removing a
/// connection needs it in the session (or, to remove it for recovery, tasks kept from it);
/// removing one for recovery needs ErrorRecoveryLevel 2.
pub fn logout(l: &LogoutRequest, cx: LogoutContext) -> LogoutPlan {
    let response = match l.reason {
        0 => 0,
        1 | 2 if cx.joined => 0,
        // A connection that already failed may still have tasks to reassign.
        2 if cx.tasks_kept => 0,
        1 => 1,
        2 if cx.erl2 => 1,
        _ => 2, // connection recovery needs ERL 2
    };
    let after = match (l.reason, response) {
        (0, _) => AfterLogout::CloseSession,
        // Out of the session at once: removed for recovery, its tasks may be reassigned by
        // the very next PDU.
        (1 | 2, 0) => AfterLogout::RemoveConnection(l.cid),
        _ => AfterLogout::Nothing,
    };
    LogoutPlan {
        drain: l.reason != 2,
        response: LogoutResponse {
            response,
            itt: l.itt,
            time2wait: cx.time2wait,
            time2retain: cx.time2retain,
            ..Default::default()
        },
        after,
    }
}

/// What a task management request asks the driver to do; `D` is the session's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfPlan<D> {
    /// Answer with this response at once.
    Answer(u8),
    /// TASK REASSIGN at level 2 (`erl2` decides it).
    Reassign,
    /// Carry out `action` on the device.
    Act(D, TmfAction),
}

/// A task management function carried out on the session's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfAction {
    /// Claim the task with [`SessionCore::claim_for_abort`], then [`abort_task`].
    AbortTask,
    /// Abort the waiting tasks of the LUN (`lun` as a number) and the LUN's task set.
    AbortTaskSet(u64),
    ClearTaskSet(u64),
    LunReset(u64),
    TargetReset {
        cold: bool,
    },
}

/// Decides what a task management request does, given the session's device and its LUNs
/// (`None`: a discovery session, which has no device).
pub fn tmf_plan<D>(t: &TaskMgmtRequest, erl2: bool, device: Option<(D, &[u64])>) -> TmfPlan<D> {
    if t.function == tmf::TASK_REASSIGN && erl2 {
        return TmfPlan::Reassign;
    }
    let Some((device, luns)) = device else {
        return TmfPlan::Answer(tmf::RSP_NOT_SUPPORTED);
    };
    let lun = iscsi_wire::lun_from_wire(t.lun) as u64;
    let lun_exists = luns.contains(&lun);
    let action = match t.function {
        tmf::ABORT_TASK => TmfAction::AbortTask,
        tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET | tmf::LOGICAL_UNIT_RESET if !lun_exists => {
            return TmfPlan::Answer(tmf::RSP_NO_LUN)
        }
        tmf::ABORT_TASK_SET => TmfAction::AbortTaskSet(lun),
        tmf::CLEAR_TASK_SET => TmfAction::ClearTaskSet(lun),
        tmf::LOGICAL_UNIT_RESET => TmfAction::LunReset(lun),
        tmf::TARGET_WARM_RESET => TmfAction::TargetReset { cold: false },
        tmf::TARGET_COLD_RESET => TmfAction::TargetReset { cold: true },
        // Below level 2.
        tmf::TASK_REASSIGN => return TmfPlan::Answer(tmf::RSP_REASSIGN_NOT_SUPPORTED),
        _ => return TmfPlan::Answer(tmf::RSP_NOT_SUPPORTED),
    };
    TmfPlan::Act(device, action)
}

/// The ABORT TASK response: `claimed`, the task was running and is aborted now; `kept`, at
/// level 2 it had executed and waited for reassignment, and is forgotten; `exp_cmd_sn`, the
/// session's now.
pub fn abort_task(t: &TaskMgmtRequest, claimed: bool, kept: bool, exp_cmd_sn: u32) -> u8 {
    if claimed || kept {
        tmf::RSP_COMPLETE
    } else if sn_le(exp_cmd_sn, t.ref_cmd_sn) {
        // Not arrived yet: nothing to abort. Its CmdSN is not counted as received (RFC 7143
        // §11.5.1 would), so the initiator, seeing ExpCmdSN still at it, sends the command
        // again with that CmdSN, and it runs.
        tmf::RSP_COMPLETE
    } else {
        tmf::RSP_NO_TASK
    }
}

/// Why the memory budget refused a command: each is answered TASK SET FULL (SAM-5: the task
/// set lacks the resources to take the command now; the initiator sends it again later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetRefusal {
    /// Level 2: no room to keep the task until its status is acknowledged (responses the
    /// initiator has not acknowledged fill the budget); it is neither run nor kept.
    Keep(String),
    /// No room for the write's data.
    Write(String),
    /// No room for the read data it may bring.
    Read(String),
}

impl std::fmt::Display for BudgetRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetRefusal::Keep(why) => write!(
                f,
                "command refused with TASK SET FULL: responses the initiator has not \
                 acknowledged fill the budget ({why})"
            ),
            BudgetRefusal::Write(why) => write!(f, "write refused with TASK SET FULL: {why}"),
            BudgetRefusal::Read(why) => write!(f, "read refused with TASK SET FULL: {why}"),
        }
    }
}

/// The response to a command the budget refused: TASK SET FULL, nothing executed.
pub fn task_set_full() -> scsi::Response {
    scsi::Response::unexecuted(scsi::status::TASK_SET_FULL, None)
}

/// The response to a command whose data phase broke the protocol (the Reject goes before
/// it): CHECK CONDITION, ABORTED COMMAND / DATA PHASE ERROR.
pub fn data_phase_error() -> scsi::Response {
    let sense = scsi::Sense::new(
        scsi::sense::key::ABORTED_COMMAND,
        scsi::sense::asc::DATA_PHASE_ERROR,
    );
    scsi::Response::unexecuted(scsi::status::CHECK_CONDITION, Some(sense.encode(false)))
}

/// (overflow, underflow, count) as the SCSI Response carries a residual.
fn residual_flags(r: scsi::Residual) -> (bool, bool, u32) {
    match r {
        scsi::Residual::None => (false, false, 0),
        scsi::Residual::Underflow(n) => (false, true, n),
        scsi::Residual::Overflow(n) => (true, false, n),
    }
}

/// The status to put in a read's last Data-In (phase collapse) instead of a SCSI Response:
/// only when it has data-in, went well, is not bidirectional (a SCSI Response alone carries
/// both residuals) and has no sense.
pub fn collapsed_status(rsp: &scsi::Response) -> Option<CollapsedStatus> {
    let collapsible = rsp.bidi_read_residual.is_none()
        && rsp.sense.is_none()
        && (rsp.status == scsi::status::GOOD || rsp.status == scsi::status::CONDITION_MET);
    if rsp.data_in.is_empty() || !collapsible {
        return None;
    }
    let (overflow, underflow, residual) = residual_flags(rsp.residual);
    Some(CollapsedStatus {
        status: rsp.status,
        overflow,
        underflow,
        residual,
    })
}

/// The SCSI Response of task `itt`, after `data_pdus` Data-In and R2Ts (its ExpDataSN).
pub fn scsi_response(itt: u32, rsp: &scsi::Response, data_pdus: u32) -> Pdu {
    let (overflow, underflow, residual) = residual_flags(rsp.residual);
    let (bidi_overflow, bidi_underflow, bidi_read_residual) =
        residual_flags(rsp.bidi_read_residual.unwrap_or(scsi::Residual::None));
    let bhs = ScsiResponse {
        bidi_overflow,
        bidi_underflow,
        overflow,
        underflow,
        response: 0,
        status: rsp.status,
        itt,
        exp_data_sn: data_pdus,
        bidi_read_residual,
        residual,
        ..Default::default()
    };
    Pdu::new(Bhs::ScsiResponse(bhs), sense_segment(rsp.sense.as_ref()))
}

/// The data segment of a SCSI Response: SenseLength and the sense bytes.
fn sense_segment(sense: Option<&Bytes>) -> Bytes {
    match sense {
        Some(sense) => {
            let mut b = BytesMut::with_capacity(2 + sense.len());
            b.put_u16(sense.len() as u16);
            b.extend_from_slice(sense);
            b.freeze()
        }
        None => Bytes::new(),
    }
}

/// What answers a SNACK Request (ErrorRecoveryLevel 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnackPlan {
    /// Reject the SNACK (its DataSN/R2TSN field `data_sn`).
    Reject {
        reason: u8,
        data_sn: u32,
        why: String,
    },
    /// Resend retained status: [`status_run`] says which.
    Status,
    /// The datamover resends a read's Data-In or a write's R2Ts from `beg_run`
    /// (`run_length` of them, 0: all); [`data_snack_refused`] when it cannot.
    DataR2t {
        itt: u32,
        beg_run: u32,
        run_length: u32,
    },
    /// Data-In before `beg_run` of the transfer `ttt` need not be kept any more.
    DataAck { ttt: u32, beg_run: u32 },
    /// The read's unacknowledged Data-In again, cut to the new MaxRecvDataSegmentLength,
    /// then its status with SNACK Tag `tag`.
    RData { itt: u32, tag: u32 },
}

/// Decides the answer to a SNACK in a session at `erl`.
pub fn snack(s: &SnackRequest, erl: u8) -> SnackPlan {
    use iscsi_session::erl1::snack_type;
    let refuse = |reason, why: String| SnackPlan::Reject {
        reason,
        data_sn: 0,
        why,
    };
    if erl == 0 {
        let why = "SNACK needs ErrorRecoveryLevel > 0".to_string();
        return refuse(reject::SNACK_REJECT, why);
    }
    match s.snack_type {
        snack_type::STATUS => SnackPlan::Status,
        snack_type::DATA_R2T => SnackPlan::DataR2t {
            itt: s.itt,
            beg_run: s.beg_run,
            run_length: s.run_length,
        },
        snack_type::DATA_ACK => SnackPlan::DataAck {
            ttt: s.ttt,
            beg_run: s.beg_run,
        },
        // It always asks for all of them: BegRun and RunLength must be 0.
        snack_type::R_DATA if s.beg_run != 0 || s.run_length != 0 => {
            let why = format!(
                "R-Data SNACK with BegRun {} and RunLength {} (both must be 0)",
                s.beg_run, s.run_length
            );
            refuse(reject::PROTOCOL_ERROR, why)
        }
        snack_type::R_DATA => SnackPlan::RData {
            itt: s.itt,
            tag: s.ttt,
        },
        other => refuse(reject::SNACK_REJECT, format!("unknown SNACK type {other}")),
    }
}

/// The Reject of a Data/R2T SNACK whose run the datamover no longer holds: its DataSN field
/// says where the refused run began.
pub fn data_snack_refused(s: &SnackRequest, why: &str) -> SnackPlan {
    SnackPlan::Reject {
        reason: reject::PROTOCOL_ERROR,
        data_sn: s.beg_run,
        why: format!("Data/R2T SNACK refused: {why}"),
    }
}

/// The Reject of an R-Data SNACK the datamover cannot answer, or of a Status SNACK
/// [`status_run`] refused.
pub fn snack_refused(why: String) -> SnackPlan {
    SnackPlan::Reject {
        reason: reject::PROTOCOL_ERROR,
        data_sn: 0,
        why,
    }
}

/// The retained status a Status SNACK asks to resend, in StatSN order, given the StatSN
/// retention starts at (`first`), the next StatSN (`next`) and the retained status by
/// StatSN; `Err` with why the SNACK is refused (Reject, Protocol Error).
pub fn status_run<P>(
    s: &SnackRequest,
    first: u32,
    next: u32,
    retained: impl Fn(u32) -> Option<P>,
) -> Result<Vec<P>, String> {
    iscsi_session::erl1::snack_run(s.beg_run, s.run_length, first, next)
        .map_err(|e| e.to_string())
        .and_then(|run| {
            run.map(|sn| retained(sn).ok_or_else(|| format!("StatSN {sn} is no longer retained")))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|why| format!("Status SNACK refused: {why}"))
}
