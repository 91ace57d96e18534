//! ErrorRecoveryLevel 2 on the target: connection recovery (RFC 7143 §6.2.2, §7.2). At
//! level 2 the session keeps every SCSI task with its connection allegiance until the
//! initiator acknowledges the task's status (ExpStatSN past it). When a connection fails —
//! it breaks, is logged out with reason "remove the connection for recovery", or is
//! reinstated by a login with its CID — its tasks wait DefaultTime2Retain seconds for a
//! TASK REASSIGN on another connection of the session, which takes them over:
//! - a task already executed has its response sent again on the new connection (all its
//!   Data-In from DataSN 0 — the initiator never acknowledges Data-In here, so ExpDataSN
//!   is 0 — and its status with the new connection's StatSN);
//! - a write whose data phase the failure cut short asks for all its data again by R2T
//!   (a reassigned task gets no unsolicited data);
//! - a task still executing answers on the new connection when it is done.
//!
//! A session whose last connection fails stays as long, so that the initiator may log a
//! connection in to it again (its TSIH) and reassign the tasks. Below level 2 nothing here
//! runs: TASK REASSIGN gets "allegiance reassignment not supported".
//!
//! Which tasks are kept, which an acknowledgement ends, when DefaultTime2Retain ends them
//! and what a TASK REASSIGN answers are the session core's decisions
//! (`session::core::erl2::KeptTasks`, time passed in); this driver holds each task's
//! response, wakes the data phase that waits for the task to move, and sends.
//!
//! What is kept counts in the memory budget of the connection the task arrived on (and so
//! of its session and the target): the task itself from its arrival, its read data through
//! the reservation that travels with the data. An initiator that never advances ExpStatSN
//! fills that budget and no more: a command that finds no room to be kept is answered
//! TASK SET FULL in its turn, neither run nor kept, until acknowledgements give room back.
//! A status dropped from the connection's retention unacknowledged (`StatusSeq` keeps at
//! most 1,024) can no longer be acknowledged: its task is forgotten as if it had been.

use crate::session::core::erl2::{KeptTasks, Reassign};
use crate::session::{send_scsi_response, Allegiances, Conn, KeptState, KeptTask, Session};
use crate::Target;
use datamover::budget::OverBudget;
use datamover::{DmError, RecoveryCounters, TaskRef, WriteHandle};
use iscsi_wire::{tmf, Bhs, Pdu, TaskMgmtRequest, TaskMgmtResponse};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// What keeping one task is counted as in the budget beyond its read data: a round bound,
/// not a measured size, on the task, its response with sense data (at most 252 bytes) and
/// its entry in the map.
const KEPT_TASK_BYTES: u64 = 1024;

impl Allegiances {
    /// No task kept yet; a failed connection's tasks wait `time2retain` (DefaultTime2Retain).
    pub(crate) fn new(time2retain: Duration) -> Allegiances {
        Allegiances {
            tasks: Mutex::new(KeptTasks::new(time2retain)),
        }
    }

    /// Starts keeping `task`, arrived on `conn`, its bytes counted in `conn`'s budget;
    /// `None` when the core keeps no new task for it (a task with its ITT is still in
    /// progress: this is a copy of its command, which the CmdSN window turns away). Refused
    /// when the budget has no room: an initiator that does not acknowledge responses cannot
    /// make the target keep more of them than its budget.
    pub(crate) fn keep(
        &self,
        conn: &Arc<Conn>,
        task: TaskRef,
    ) -> Result<Option<Arc<KeptTask>>, OverBudget> {
        let mut tasks = self.lock();
        if !tasks.may_keep(task.itt) {
            return Ok(None);
        }
        let counted = conn.budget.try_reserve(KEPT_TASK_BYTES)?;
        let kept = tasks.keep(task.itt, conn.key, conn.cid, |id| {
            Arc::new(KeptTask {
                task,
                id,
                state: Mutex::new(KeptState {
                    conn: conn.clone(),
                    answered: true,
                    response: None,
                }),
                moved: Notify::new(),
                _counted: counted,
            })
        });
        Ok(Some(kept))
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, KeptTasks<Arc<KeptTask>>> {
        self.tasks.lock().expect("allegiances")
    }

    /// Whether `kept` is still kept (not forgotten by task management or Time2Retain).
    pub(crate) fn holds(&self, kept: &KeptTask) -> bool {
        self.lock().holds(kept.task.itt, kept.id)
    }

    /// Forgets `kept` (the task ended without a response, or was aborted).
    pub(crate) fn forget(&self, kept: &KeptTask) {
        let gone = self.lock().forget(kept.task.itt, kept.id);
        drop(gone);
        kept.moved.notify_waiters();
    }

    /// Forgets the task `itt` (task management aborted it); false when it was not kept.
    pub(crate) fn forget_itt(&self, itt: u32) -> bool {
        let kept = self.lock().forget_itt(itt);
        if let Some(k) = &kept {
            k.moved.notify_waiters();
        }
        kept.is_some()
    }

    /// Forgets every task (the session was logged out).
    pub(crate) fn forget_all(&self) {
        let gone = self.lock().forget_all();
        for k in gone {
            k.moved.notify_waiters();
        }
    }

    /// The task executed with `response` (after `r2ts` R2Ts): the response is kept, and
    /// goes on the connection returned (the one the task is allegiant to now).
    pub(crate) fn executed(
        &self,
        kept: &KeptTask,
        response: &scsi::Response,
        r2ts: u32,
    ) -> Arc<Conn> {
        let _ = self.lock().executed(kept.task.itt, kept.id);
        let mut st = kept.state.lock().expect("kept task");
        st.response = Some((without_note(response), r2ts));
        st.conn.clone()
    }

    /// The initiator acknowledged the status of task `itt` sent on `conn`: the core says
    /// whether that ends it.
    pub(crate) fn acknowledged(&self, conn: &Conn, itt: u32) {
        let released = self.lock().acknowledged(itt, conn.key);
        drop(released);
    }

    /// Whether any task is kept.
    pub(crate) fn any(&self) -> bool {
        self.lock().any()
    }

    /// Whether a task is allegiant to a connection with CID `cid`.
    pub(crate) fn any_on_cid(&self, cid: u16) -> bool {
        self.lock().any_on_cid(cid)
    }

    /// Whether a task is allegiant to `conn`.
    pub(crate) fn any_on(&self, conn: &Conn) -> bool {
        self.lock().count_on(conn.key) > 0
    }
}

impl KeptTask {
    /// The connection the task is allegiant to now.
    pub(crate) fn conn(&self) -> Arc<Conn> {
        self.state.lock().expect("kept task").conn.clone()
    }

    /// Waits (at most `limit`) until the task is reassigned away from `from`; the new
    /// connection, or `None` when it is not reassigned in time or is forgotten.
    async fn wait_moved(
        &self,
        sessions: &Allegiances,
        me: &Arc<KeptTask>,
        from: &Arc<Conn>,
        limit: Duration,
    ) -> Option<Arc<Conn>> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.moved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock().expect("kept task");
                if !Arc::ptr_eq(&st.conn, from) && st.answered {
                    return Some(st.conn.clone());
                }
            }
            if !sessions.holds(me) {
                return None;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// A response as sent again: the note the first connection's buffers left (its digests at
/// its cut) means nothing to another connection.
fn without_note(r: &scsi::Response) -> scsi::Response {
    scsi::Response {
        data_in_note: None,
        ..r.clone()
    }
}

impl Session {
    /// DefaultTime2Retain: how long a failed connection's tasks wait for reassignment.
    pub(crate) fn time2retain(&self) -> Duration {
        Duration::from_secs(u64::from(self.params.default_time2retain))
    }

    /// The connections of the session now (their keys).
    fn live_keys(&self) -> Vec<u64> {
        let conns = self.conns.lock().expect("conns");
        conns.values().map(|c| c.key).collect()
    }

    /// Collects a write's data at level 2: when the connection fails during the data
    /// phase, the task waits for TASK REASSIGN and asks the new connection for all of it.
    /// Returns the data, the R2Ts used and the connection that delivered it.
    pub(crate) async fn collect_write(
        &self,
        kept: &Arc<KeptTask>,
        conn: &Arc<Conn>,
        write: WriteHandle,
    ) -> Result<(bytes::Bytes, u32), DmError> {
        let allegiances = self.erl2.as_ref().expect("level 2");
        let (task, expected_len) = (kept.task, write.expected_len);
        let mut conn = conn.clone();
        let mut write = write;
        loop {
            match conn.dm.get_data(task, write).await {
                Err(DmError::Closed | DmError::Aborted) if allegiances.holds(kept) => {
                    let next = kept
                        .wait_moved(allegiances, kept, &conn, self.time2retain())
                        .await
                        .ok_or(DmError::Closed)?;
                    write = next.dm.solicit_write(task, expected_len)?;
                    conn = next;
                }
                other => return other,
            }
        }
    }

    /// TASK REASSIGN received on `conn`: answers it and, for a task that has executed,
    /// sends its response again on `conn`.
    pub(crate) async fn reassign(&self, conn: &Arc<Conn>, t: &TaskMgmtRequest) {
        let (response, moved, resend) = self.take_allegiance(conn, t);
        let rsp = TaskMgmtResponse {
            response,
            itt: t.itt,
            ..Default::default()
        };
        let _ = conn
            .dm
            .send_control(Pdu::new(Bhs::TaskMgmtResponse(rsp), bytes::Bytes::new()))
            .await;
        if let Some(kept) = moved {
            kept.state.lock().expect("kept task").answered = true;
            kept.moved.notify_waiters();
        }
        if let Some((task, rsp, r2ts)) = resend {
            send_scsi_response(conn, task, rsp, r2ts).await;
        }
    }

    /// Moves task `t.ref_task_tag` to `conn` when it may move: the TMF response, the task
    /// moved (its data phase waits until the response is sent), and the response to send
    /// again when the task has executed.
    #[allow(clippy::type_complexity)]
    fn take_allegiance(
        &self,
        conn: &Arc<Conn>,
        t: &TaskMgmtRequest,
    ) -> (
        u8,
        Option<Arc<KeptTask>>,
        Option<(TaskRef, scsi::Response, u32)>,
    ) {
        let itt = t.ref_task_tag;
        let Some(allegiances) = &self.erl2 else {
            return (tmf::RSP_REASSIGN_NOT_SUPPORTED, None, None);
        };
        let live = self.live_keys();
        let mut tasks = allegiances.lock();
        let (decision, moved) = tasks.reassign(itt, conn.key, conn.cid, |k| live.contains(&k));
        let Some(kept) = moved else {
            if decision == Reassign::NoTask {
                tracing::info!(peer = %conn.peer, tsih = self.tsih, "TASK REASSIGN of ITT 0x{itt:08x}: no such task");
            }
            return (decision.response(), None, None);
        };
        let mut st = kept.state.lock().expect("kept task");
        let from = st.conn.cid;
        st.conn = conn.clone();
        st.answered = false;
        let resend = st.response.clone().map(|(r, n)| (kept.task, r, n));
        drop(st);
        drop(tasks);
        self.with_core(|c| c.move_task(itt, conn.cid));
        RecoveryCounters::bump(&conn.recovery.task_reassigns);
        tracing::info!(
            peer = %conn.peer,
            tsih = self.tsih,
            cid = conn.cid,
            "TASK REASSIGN: ITT 0x{itt:08x} moved from connection {from} ({})",
            if resend.is_some() { "its response sent again" } else { "in progress" }
        );
        (decision.response(), Some(kept), resend)
    }

    /// Level 2, connection `conn` failed: its tasks wait DefaultTime2Retain for
    /// reassignment (a write whose data collection ended with the connection sees it is
    /// still kept, and waits). Returns
    /// whether any task waits (then a session left without connections stays as long).
    pub(crate) fn connection_failed(
        self: &Arc<Self>,
        target: &Arc<Target>,
        conn: &Arc<Conn>,
    ) -> bool {
        let Some(allegiances) = &self.erl2 else {
            return false;
        };
        let now = || tokio::time::Instant::now().into_std();
        let waiting = allegiances.lock().connection_failed(conn.key, now());
        if waiting == 0 {
            return false;
        }
        let retain = self.time2retain();
        tracing::info!(
            peer = %conn.peer,
            tsih = self.tsih,
            cid = conn.cid,
            "{waiting} task(s) kept {} s for TASK REASSIGN (ErrorRecoveryLevel 2)",
            retain.as_secs()
        );
        let (session, target, conn) = (self.clone(), target.clone(), conn.clone());
        tokio::spawn(async move {
            tokio::time::sleep(retain).await;
            let Some(allegiances) = &session.erl2 else {
                return;
            };
            let gone = allegiances.lock().expire(now());
            for k in &gone {
                k.moved.notify_waiters();
            }
            let expired = gone.len();
            drop(gone);
            if expired > 0 {
                tracing::warn!(tsih = session.tsih, cid = conn.cid, "{expired} task(s) of a failed connection were not reassigned within DefaultTime2Retain: dropped");
            }
            // Tasks of another failed connection may still wait for their own end.
            if session.conns.lock().expect("conns").is_empty()
                && session.joining.lock().expect("joining").is_empty()
                && !allegiances.any()
            {
                target.remove_session(&session);
            }
        });
        true
    }
}
