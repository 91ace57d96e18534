//! ErrorRecoveryLevel 2 in the session core: connection recovery (RFC 7143 §6.2.2). When a
//! connection fails, its SCSI commands are orphaned — kept, neither failed nor queued again.
//! Once the driver has logged a connection in again it hands it to
//! [`SessionCore::reassign_to`], which moves each orphan there in CmdSN order: the
//! connection's datamover adopts the command's data phases (its write data sent as R2Ts ask,
//! its read data taken again after what was acknowledged) and a TASK REASSIGN asks the
//! target to continue it: for a read ExpDataSN is the DataSN after the Data-In acknowledged
//! by DataACK, 0 when none was (the target may have let acknowledged Data-In go, and LIO
//! drops the connection when asked for them again), for a write the R2TSN after the highest
//! R2T received (the target re-issues the R2Ts from it on and asks again for what it is
//! missing below it; LIO drops the connection when asked for R2Ts whose data it has all).
//! The target's answer decides the rest:
//! - "function complete": the command goes on there (R2Ts, Data-In, status);
//! - "task does not exist" for a command whose CmdSN the target has not passed: it never
//!   arrived, and is sent again with its ITT and CmdSN;
//! - "task still allegiant": the target has not yet seen the old connection go; the command
//!   is orphaned again and the driver asks again a little later (a bounded number of times);
//! - "function rejected" is what LIO answers when it has moved the task (see below): the
//!   command goes on;
//! - "task does not exist" for one it has passed: the target holds no such task (it may
//!   have finished it, its status lost with the connection); it is sent again as a new task;
//! - anything else: the command is aborted and sent again (below).
//!
//! When the connection cannot be recovered (it fails again after each login, or no login
//! succeeds) while another connection of the session is up, the orphans go on there as new
//! tasks ([`SessionCore::reissue_orphans`]): each is first aborted by ABORT TASK on that
//! connection, so that the target's copy cannot run after the new one (a write above all),
//! and queued again with its ITT once the target has answered. With no connection left the
//! driver falls back to session reinstatement ([`SessionCore::requeue_orphans`]) or fails
//! them.

use super::*;

/// TASK REASSIGNs of one command answered "task still allegiant" before it fails.
const MAX_REASSIGN_TRIES: u8 = 10;

impl<T> SessionCore<T> {
    /// Connection `conn` failed at ErrorRecoveryLevel 2: its SCSI commands wait for
    /// [`SessionCore::reassign_to`]; other requests on it fail. `resume_point` tells, per
    /// ITT, how far the command got there (its datamover's
    /// `InitiatorDatamover::resume_point`). Returns the orphans.
    pub fn on_connection_failed(
        &mut self,
        conn: usize,
        reason: &str,
        resume_point: impl Fn(u32) -> Resume,
    ) -> usize {
        let Some(c) = self.conns.get_mut(conn) else {
            return 0;
        };
        c.alive = false;
        let completed = c.completed;
        if self.failed_in_a_row.len() <= conn {
            self.failed_in_a_row.resize(conn + 1, 0);
        }
        let streak = &mut self.failed_in_a_row[conn];
        *streak = if completed {
            1
        } else {
            streak.saturating_add(1)
        };
        let on_it: Vec<(u32, bool)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.conn == Some(conn))
            .map(|(itt, t)| (*itt, matches!(t.kind, Kind::Scsi { .. })))
            .collect();
        for (itt, scsi) in on_it {
            if scsi {
                let t = self.tasks.get_mut(&itt).expect("present");
                t.conn = None;
                t.orphaned = true;
                // R2Ts or Data-In numbered on from the ExpDataSN of an earlier reassignment
                // may not have come yet: the point only moves on.
                let got = resume_point(itt);
                if sn_gt(got.exp_data_sn, t.resume.exp_data_sn) {
                    t.resume = got;
                }
            } else {
                self.finish(itt, Err(TaskError::ConnectionLost(reason.to_string())));
            }
        }
        // A TASK REASSIGN or ABORT TASK that went out on it is answered no more.
        let tasks = &self.tasks;
        self.recovery_tmfs
            .retain(|_, tmf| tasks.get(&tmf.itt()).is_some_and(|t| !t.orphaned));
        self.orphans()
    }

    /// How many times in a row connection `conn` failed with no command completed on it in
    /// between: a connection that fails again right after each recovery is given up.
    pub fn failed_in_a_row(&self, conn: usize) -> u8 {
        self.failed_in_a_row.get(conn).copied().unwrap_or(0)
    }

    /// Commands waiting for a connection to be reassigned to.
    pub fn orphans(&self) -> usize {
        self.tasks.values().filter(|t| t.orphaned).count()
    }

    /// A connection logged in again at index `conn` (its CID) after it failed.
    pub fn add_connection_at(&mut self, conn: usize, exp_stat_sn: u32, max_send_seg: u32) {
        while self.conns.len() <= conn {
            self.conns.push(ConnState::new(false, 0, 0));
        }
        self.conns[conn] = ConnState::new(true, exp_stat_sn, max_send_seg);
        self.pump();
    }

    /// Moves every orphaned command to connection `conn` (in CmdSN order): its datamover
    /// adopts the command, then a TASK REASSIGN goes out. Returns how many moved.
    pub fn reassign_to(&mut self, conn: usize) -> usize {
        if !self.conns.get(conn).is_some_and(|c| c.alive) {
            return 0;
        }
        let orphans = self.orphans_in_cmd_sn_order();
        for &(itt, cmd_sn) in &orphans {
            let t = self.tasks.get_mut(&itt).expect("present");
            t.orphaned = false;
            t.conn = Some(conn);
            let Kind::Scsi { req } = &t.kind else {
                continue;
            };
            let req = req.clone();
            let resume = t.resume.clone();
            let exp_data_sn = resume.exp_data_sn;
            let (mut cmd, _, _) = self.command_out(conn, itt, cmd_sn, &req);
            cmd.pdu.data = Bytes::new();
            cmd.solicited_from = 0;
            self.actions.push(Action::Adopt { conn, cmd, resume });
            let lun = iscsi_wire::lun_to_wire(req.lun);
            self.send_recovery_tmf(conn, RecoveryTmf::Reassign(itt), lun, cmd_sn, exp_data_sn);
        }
        orphans.len()
    }

    /// The target's answer to a TASK REASSIGN or ABORT TASK this core sent in connection
    /// recovery (`itt` is the request's); false when `itt` is no such request.
    pub(super) fn on_recovery_tmf_response(&mut self, itt: u32, response: u8) -> bool {
        match self.recovery_tmfs.remove(&itt) {
            Some(RecoveryTmf::Reassign(cmd_itt)) => self.on_reassign_response(cmd_itt, response),
            Some(RecoveryTmf::AbortToReissue(cmd_itt)) => {
                self.on_abort_to_reissue_response(cmd_itt, response)
            }
            None => return false,
        }
        true
    }

    fn on_reassign_response(&mut self, cmd_itt: u32, response: u8) {
        let never_arrived = self
            .tasks
            .get(&cmd_itt)
            .is_some_and(|t| !sn_lt(t.cmd_sn, self.exp_cmd_sn));
        let still_allegiant = self
            .tasks
            .get(&cmd_itt)
            .and_then(|t| t.conn.filter(|_| t.reassign_tries < MAX_REASSIGN_TRIES));
        match response {
            tmf::RSP_COMPLETE => self.recovery.task_reassigns += 1,
            // LIO answers every successful TASK REASSIGN with "function rejected": it
            // stores the iSCSI code for "complete" (0) where its generic layer's codes are
            // kept, where 0 means "failed", and translates that to 255 — after moving the
            // task, which goes on. Its real refusals (a connection with other segment
            // lengths, another LUN) cannot happen here: the connection logs in again with
            // the same settings and the same LUN. So 255 is taken as done.
            tmf::RSP_REJECTED => {
                self.recovery.task_reassigns += 1;
                self.rejected_reassigns += 1;
            }
            tmf::RSP_STILL_ALLEGIANT if still_allegiant.is_some() => {
                let conn = still_allegiant.expect("checked");
                let t = self.tasks.get_mut(&cmd_itt).expect("present");
                t.reassign_tries += 1;
                t.orphaned = true;
                t.conn = None;
                self.actions.push(Action::Forget { conn, itt: cmd_itt });
                self.reassign_retry = Some(conn);
            }
            tmf::RSP_NO_TASK if never_arrived => {
                if self.resend_command(cmd_itt, iscsi_wire::reject::PROTOCOL_ERROR) {
                    self.recovery.lost_commands += 1;
                }
            }
            // The target holds no such task: nothing of it can run later.
            tmf::RSP_NO_TASK => self.queue_again_as_new_task(cmd_itt),
            _ => self.abort_to_reissue(cmd_itt),
        }
    }

    /// Connection recovery was given up: every orphan is aborted on a live connection and
    /// then sent again as a new task ([`SessionCore::abort_to_reissue`]). Returns how many;
    /// 0 when no connection is up (the caller reinstates the session).
    pub fn reissue_orphans(&mut self) -> usize {
        if self.live_connections().is_empty() {
            return 0;
        }
        let orphans = self.orphans_in_cmd_sn_order();
        for &(itt, _) in &orphans {
            self.tasks.get_mut(&itt).expect("present").orphaned = false;
            self.abort_to_reissue(itt);
        }
        orphans.len()
    }

    /// Aborts command `itt` (ABORT TASK on a live connection), to send it again as a new
    /// task once the target has answered. Until then it is on that connection: if that
    /// one fails too, the command is orphaned again. With no connection up it fails.
    pub(super) fn abort_to_reissue(&mut self, itt: u32) {
        let Some(conn) = self.pick_conn() else {
            self.fail_task(
                itt,
                TaskError::ConnectionLost(
                    "the command's connection could not be recovered and no other is up"
                        .to_string(),
                ),
            );
            return;
        };
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        let Kind::Scsi { req } = &t.kind else {
            return;
        };
        if let Some(old) = t.conn.replace(conn) {
            self.actions.push(Action::Forget { conn: old, itt });
        }
        let (lun, ref_cmd_sn) = (iscsi_wire::lun_to_wire(req.lun), t.cmd_sn);
        self.send_recovery_tmf(conn, RecoveryTmf::AbortToReissue(itt), lun, ref_cmd_sn, 0);
    }

    /// Sends the task management request `request` (immediate) about the command it names
    /// on `conn`, and keeps it for its answer.
    fn send_recovery_tmf(
        &mut self,
        conn: usize,
        request: RecoveryTmf,
        lun: u64,
        ref_cmd_sn: u32,
        exp_data_sn: u32,
    ) {
        let tmf_itt = self.alloc_itt();
        self.recovery_tmfs.insert(tmf_itt, request);
        let function = match request {
            RecoveryTmf::Reassign(_) => tmf::TASK_REASSIGN,
            RecoveryTmf::AbortToReissue(_) => tmf::ABORT_TASK,
        };
        let bhs = Bhs::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function,
            lun,
            itt: tmf_itt,
            ref_task_tag: request.itt(),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.conns[conn].exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn,
        });
        self.send_header(conn, bhs);
    }

    fn on_abort_to_reissue_response(&mut self, cmd_itt: u32, response: u8) {
        // A command that never arrived leaves a hole in the CmdSN sequence. A target that
        // counted its CmdSN as received on the abort (RFC 7143 §11.5.1) shows it in the
        // response's ExpCmdSN; one that did not still waits for it, and every later
        // command waits behind the hole: the command goes again with its CmdSN.
        let hole = self
            .tasks
            .get(&cmd_itt)
            .is_some_and(|t| !sn_lt(t.cmd_sn, self.exp_cmd_sn));
        match response {
            tmf::RSP_COMPLETE | tmf::RSP_NO_TASK if hole => {
                if self.resend_command(cmd_itt, iscsi_wire::reject::PROTOCOL_ERROR) {
                    self.recovery.lost_commands += 1;
                }
            }
            // Aborted, or the target holds no such task: either way none of it runs later.
            tmf::RSP_COMPLETE | tmf::RSP_NO_TASK => self.queue_again_as_new_task(cmd_itt),
            other => self.fail_task(
                cmd_itt,
                TaskError::ConnectionLost(format!(
                    "the command's connection could not be recovered, and the target would not abort it to let it be sent again (ABORT TASK response {other})"
                )),
            ),
        }
    }

    /// Queues command `itt` to go out again with a new CmdSN (its ITT is free at the
    /// target now), its data phases from the start.
    fn queue_again_as_new_task(&mut self, itt: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        if let Some(conn) = t.conn.take() {
            self.actions.push(Action::Forget { conn, itt });
        }
        t.orphaned = false;
        t.reassign_tries = 0;
        t.resume = Resume::default();
        self.recovery.reissued_commands += 1;
        self.queue.push_back(itt);
        self.pump();
    }

    /// The connection to ask again on, once, when a TASK REASSIGN came back "task still
    /// allegiant" (the driver waits a moment, then calls [`SessionCore::reassign_to`]).
    pub fn take_reassign_retry(&mut self) -> Option<usize> {
        self.reassign_retry.take()
    }

    /// The orphaned commands (ITT, CmdSN), oldest CmdSN first.
    fn orphans_in_cmd_sn_order(&self) -> Vec<(u32, u32)> {
        let mut orphans: Vec<(u32, u32)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.orphaned)
            .map(|(itt, t)| (*itt, t.cmd_sn))
            .collect();
        orphans.sort_by(|a, b| serial_order(a.1, b.1));
        orphans
    }

    /// Connection recovery failed: the orphans go back to the front of the queue (in
    /// CmdSN order), to be sent again after session reinstatement.
    pub fn requeue_orphans(&mut self) {
        for (itt, _) in self.orphans_in_cmd_sn_order().into_iter().rev() {
            self.tasks.get_mut(&itt).expect("present").orphaned = false;
            self.queue.push_front(itt);
        }
    }
}

/// A task management request the core sends for itself in connection recovery, with the
/// ITT of the command it is about.
#[derive(Debug, Clone, Copy)]
pub(super) enum RecoveryTmf {
    /// TASK REASSIGN: the command goes on on the connection it is sent on.
    Reassign(u32),
    /// ABORT TASK, after which the command is sent again as a new task.
    AbortToReissue(u32),
}

impl RecoveryTmf {
    pub(super) fn itt(self) -> u32 {
        match self {
            RecoveryTmf::Reassign(itt) | RecoveryTmf::AbortToReissue(itt) => itt,
        }
    }
}

fn serial_order(a: u32, b: u32) -> std::cmp::Ordering {
    if a == b {
        std::cmp::Ordering::Equal
    } else if sn_lt(a, b) {
        std::cmp::Ordering::Less
    } else {
        std::cmp::Ordering::Greater
    }
}
