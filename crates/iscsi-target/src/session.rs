//! Sessions and connections in full feature phase, the driver side: it feeds each
//! connection's datamover notices to the session's sans-IO core (`session::core`), which
//! orders commands across connections and decides the answers to NOP-Out, Logout, SNACK
//! and task management, and carries out what the core decides — SCSI execution on the
//! `scsi` engine, data phases and sends on the datamover, timers on tokio.

pub(crate) mod core;

use crate::Target;
use bytes::Bytes;
use core::erl2::{KeptId, KeptTasks};
use core::{
    AfterLogout, BudgetRefusal, Order, PingStep, PingTimer, SessionCore, TaskId, TmfAction, TmfPlan,
};
use datamover::budget::{Budget, OverBudget, Reservation};
use datamover::{
    CmdSnState, Datamover, DmError, FfpConfig, InPdu, Notice, RecoveryCounters, StatusNumbering,
    TaskRef, WriteHandle,
};
use iscsi_login::params::{SessionParams, TransportKind};
use iscsi_login::target::SessionIdentity;
use iscsi_login::textneg::{TextContext, TextResponder};
use iscsi_wire::{
    reject, tmf, Bhs, Pdu, Reject, ScsiCommand, TaskMgmtResponse, TextResponse, RESERVED_TAG,
};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// Work that waits for its turn in CmdSN order.
pub(crate) enum Work {
    Command {
        conn: Arc<Conn>,
        cmd: ScsiCommand,
        ahs: Bytes,
        write: Option<WriteHandle>,
        /// ErrorRecoveryLevel 2: the task, kept from its arrival (TASK REASSIGN finds it
        /// even while it waits for its turn in CmdSN order); an error when the budget had
        /// no room to keep it, and it is answered TASK SET FULL in its turn, unexecuted.
        kept: Result<Option<Arc<KeptTask>>, OverBudget>,
        /// Its task, when it was started in the core's turn that ordered it.
        started: Option<TaskId>,
    },
    Control {
        conn: Arc<Conn>,
        pdu: InPdu,
    },
}

pub(crate) struct Session {
    pub tsih: u16,
    pub nexus: scsi::NexusId,
    pub identity: SessionIdentity,
    /// The CHAP user name the leading login authenticated as (`None` without CHAP): a
    /// connection joins the session only as the same user.
    pub chap_user: Option<String>,
    pub params: SessionParams,
    pub device: Option<Arc<scsi::Device>>,
    /// The CmdSN window, the task table and the protocol decisions (see `core`).
    pub core: Mutex<SessionCore<Work>>,
    /// The window as the core last computed it, published to the datamovers (every
    /// response carries it).
    pub sn: Arc<CmdSnState>,
    pub conns: Mutex<HashMap<u16, Arc<Conn>>>,
    /// CIDs whose login succeeded and whose Login Response is on its way (not in `conns` yet).
    pub joining: Mutex<HashSet<u16>>,
    /// The latest login of each CID (its reservation ticket): a connection whose Login
    /// Response went out before a newer login of its CID, but which reaches full feature
    /// phase after it, must not replace the newer one.
    pub latest_login: Mutex<HashMap<u16, u64>>,
    /// ErrorRecoveryLevel 2: every SCSI task until its status is acknowledged, for TASK
    /// REASSIGN after its connection fails (`None` below level 2).
    pub erl2: Option<Allegiances>,
    /// The memory this session's peers may make the target hold; each connection's account
    /// counts in it.
    pub budget: Arc<datamover::budget::Budget>,
}

/// The SCSI tasks of a level 2 session, by ITT, until their status is acknowledged: the
/// core's decisions (`core::erl2::KeptTasks`), holding the driver's part of each task (what
/// is done with them is in `erl2`).
pub(crate) struct Allegiances {
    pub(crate) tasks: Mutex<KeptTasks<Arc<KeptTask>>>,
}

/// One task and the connection it answers on.
pub(crate) struct KeptTask {
    pub(crate) task: TaskRef,
    /// Its run in the core's kept tasks.
    pub(crate) id: KeptId,
    pub(crate) state: Mutex<KeptState>,
    /// Woken when the task moves to another connection.
    pub(crate) moved: tokio::sync::Notify,
    /// The task's own bytes (its response and sense, its place in the map) in the budget
    /// of the connection it arrived on, until it is forgotten; its read data carries a
    /// reservation of its own.
    pub(crate) _counted: Reservation,
}

pub(crate) struct KeptState {
    pub(crate) conn: Arc<Conn>,
    /// The TASK REASSIGN that moved the task to `conn` is answered: its data phase may go
    /// on there (the initiator learns the task moved before an R2T for it arrives).
    pub(crate) answered: bool,
    /// The response once the task has executed (and the R2Ts its data took): sent again
    /// when the task is reassigned before the initiator acknowledged it.
    pub(crate) response: Option<(scsi::Response, u32)>,
}

pub(crate) struct Conn {
    pub cid: u16,
    /// This connection among all the target's (a CID logged in again is another one): how
    /// the kept tasks of level 2 name it.
    pub(crate) key: u64,
    pub peer: SocketAddr,
    /// The address of the portal that accepted it.
    pub local: SocketAddr,
    /// The transport this connection runs over (Text negotiation answers its keys).
    pub transport: TransportKind,
    /// What its login negotiated for it (digests, data segment lengths), for reports.
    pub(crate) digests: iscsi_wire::Digests,
    pub(crate) max_recv: u32,
    pub dm: Arc<dyn Datamover>,
    /// The initiator's MaxRecvDataSegmentLength (bounds NOP-In and Text data); a Text
    /// negotiation in full feature phase may change it.
    max_send: AtomicU32,
    inflight: AtomicUsize,
    idle: Notify,
    ping_ttt: AtomicU32,
    text: Mutex<Option<(u32, TextResponder)>>,
    /// StatSN numbering and the status not yet acknowledged (kept for status SNACK):
    /// ours, shared with the datamover, which numbers each status as it sends it.
    pub(crate) status: StatusNumbering,
    /// Recovery events on this connection (the datamover counts its own).
    pub(crate) recovery: Arc<RecoveryCounters>,
    /// Set once its tasks were told it ended (by a logout, or when it closed).
    tasks_ended: std::sync::atomic::AtomicBool,
    /// This connection's memory account (the datamover's too): read data is reserved in it
    /// before the backend produces it, and at level 2 each task kept until acknowledged.
    pub(crate) budget: Arc<Budget>,
    /// How long a command waits for room in `budget` before TASK SET FULL.
    budget_wait: Duration,
    /// Rejects sent on this connection.
    rejects: AtomicU32,
    /// SCSI commands executed on it, write data taken and read data produced (bytes), for
    /// reports ([`crate::Target::sessions`]).
    pub(crate) commands: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
}

/// Rejects logged per connection; later ones are only counted.
const REJECTS_LOGGED: u32 = 16;

impl Conn {
    /// The initiator's MaxRecvDataSegmentLength as of now.
    pub fn max_send(&self) -> u32 {
        self.max_send.load(Ordering::Relaxed)
    }

    /// The initiator declared a new MaxRecvDataSegmentLength (Text, full feature phase):
    /// PDUs sent from now on are cut to it.
    fn set_max_send(&self, len: u32) {
        if self.max_send.swap(len, Ordering::Relaxed) != len {
            tracing::info!(peer = %self.peer, cid = self.cid, "the initiator's MaxRecvDataSegmentLength is now {len}");
            self.dm.set_max_send_data_segment_length(len);
        }
    }

    /// A connection in full feature phase over `dm`, numbering status, counting recovery
    /// and reserving read data as `ffp` (what `dm` was made with) says.
    pub fn new(
        cid: u16,
        peer: SocketAddr,
        local: SocketAddr,
        transport: TransportKind,
        dm: Arc<dyn Datamover>,
        max_send: u32,
        ffp: &FfpConfig,
    ) -> Conn {
        static KEYS: AtomicU64 = AtomicU64::new(0);
        Conn {
            cid,
            key: KEYS.fetch_add(1, Ordering::Relaxed),
            peer,
            local,
            transport,
            digests: ffp.digests,
            max_recv: ffp.max_recv_data_segment_length,
            dm,
            max_send: AtomicU32::new(max_send),
            inflight: AtomicUsize::new(0),
            idle: Notify::new(),
            ping_ttt: AtomicU32::new(RESERVED_TAG),
            text: Mutex::new(None),
            status: ffp.status.clone(),
            recovery: ffp.recovery.clone(),
            tasks_ended: Default::default(),
            budget: ffp.budget.clone(),
            budget_wait: ffp.timeouts.budget_wait,
            rejects: AtomicU32::new(0),
            commands: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        }
    }

    /// Reserves the read data a command may bring (at most its Expected Data Transfer
    /// Length, at most the largest transfer a LUN makes) before the backend produces it.
    async fn reserve_read(&self, cmd: &ScsiCommand) -> Result<Option<Reservation>, OverBudget> {
        if !cmd.read || cmd.expected_data_len == 0 {
            return Ok(None);
        }
        let most = u64::from(cmd.expected_data_len).min(scsi::MAX_TRANSFER_BYTES);
        self.budget.reserve(most, self.budget_wait).await.map(Some)
    }

    /// SCSI commands running on this connection now.
    pub(crate) fn in_flight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    fn task_done(&self) {
        if self.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Wait (bounded) until this connection has no command in flight.
    async fn drain(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.inflight.load(Ordering::Acquire) > 0 {
            let notified = self.idle.notified();
            if self.inflight.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
    }

    async fn send(&self, bhs: Bhs, data: Bytes) {
        let _ = self.dm.send_control(Pdu::new(bhs, data)).await;
    }

    /// Sends an Asynchronous Message (numbered like any status).
    pub async fn send_async(&self, msg: iscsi_wire::AsyncMessage) {
        self.send(Bhs::AsyncMessage(msg), Bytes::new()).await
    }

    pub(crate) async fn reject(&self, reason: u8, raw: [u8; 48], why: &str) {
        self.reject_run(reason, raw, 0, why).await
    }

    /// A Reject whose DataSN/R2TSN field says where a refused Data/R2T SNACK's run began.
    pub(crate) async fn reject_run(&self, reason: u8, raw: [u8; 48], data_sn: u32, why: &str) {
        // A flood of bad PDUs must not become a flood of log lines: the first few are
        // logged, the rest counted (the count is logged when the connection ends).
        let n = self.rejects.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= REJECTS_LOGGED {
            tracing::warn!(peer = %self.peer, "Reject (reason 0x{reason:02x}): {why}");
            if n == REJECTS_LOGGED {
                tracing::warn!(peer = %self.peer, "{REJECTS_LOGGED} Rejects on this connection: further ones are counted, not logged");
            }
        } else {
            tracing::debug!(peer = %self.peer, "Reject (reason 0x{reason:02x}): {why}");
        }
        self.send(
            Bhs::Reject(Reject {
                reason,
                data_sn,
                ..Default::default()
            }),
            Bytes::copy_from_slice(&raw),
        )
        .await;
    }
}

impl Session {
    /// The initiator's ExpStatSN on `conn` (on every PDU it sends): acknowledged status is
    /// forgotten with what the transport kept to resend with it, and at level 2 so are the
    /// tasks it ended (and those whose status was dropped from retention unacknowledged).
    fn acknowledge(&self, conn: &Arc<Conn>, bhs: &Bhs) {
        let Some(exp) = bhs.initiator_exp_stat_sn() else {
            return;
        };
        let mut forgotten = 0usize;
        {
            let mut status = conn.status.lock().expect("status");
            status.acknowledge_each(exp, |pdu| {
                forgotten += 1;
                if let Some(allegiances) = &self.erl2 {
                    if let Some(itt) = core::erl2::status_of(&pdu.bhs) {
                        allegiances.acknowledged(conn, itt);
                    }
                }
            });
        }
        if forgotten > 0 {
            conn.dm.status_acknowledged();
        }
    }

    pub fn connections(&self) -> Vec<Arc<Conn>> {
        self.conns
            .lock()
            .expect("conns")
            .values()
            .cloned()
            .collect()
    }

    /// Counts connection `cid` in the session from the moment its login succeeds, before its
    /// Login Response is sent: false when that would pass MaxConnections (other connections,
    /// joined or still joining; the same CID replaces its old connection). A connection
    /// logging in right after another must see it even before it runs full feature phase.
    /// Returns the login's ticket, which `add_connection` and `release_connection` take.
    pub fn reserve_connection(&self, cid: u16) -> Option<u64> {
        let conns = self.conns.lock().expect("conns");
        let mut joining = self.joining.lock().expect("joining");
        let others = conns.keys().filter(|c| **c != cid).count()
            + joining.iter().filter(|c| **c != cid).count();
        if others >= self.params.max_connections as usize {
            return None;
        }
        joining.insert(cid);
        // Tickets are only ever compared with others of the same CID.
        let mut latest = self.latest_login.lock().expect("latest login");
        let ticket = latest.get(&cid).map_or(1, |t| t + 1);
        latest.insert(cid, ticket);
        Some(ticket)
    }

    /// Whether `ticket` is the latest login of `cid`.
    fn is_latest(&self, cid: u16, ticket: u64) -> bool {
        self.latest_login.lock().expect("latest login").get(&cid) == Some(&ticket)
    }

    /// Connections in the session, joined or still joining.
    pub fn connection_count(&self) -> usize {
        let conns = self.conns.lock().expect("conns");
        let joining = self.joining.lock().expect("joining");
        conns.len() + joining.iter().filter(|c| !conns.contains_key(c)).count()
    }

    /// Whether connection `cid` is in the session (joined or joining).
    pub fn has_connection(&self, cid: u16) -> bool {
        self.conns.lock().expect("conns").contains_key(&cid)
            || self.joining.lock().expect("joining").contains(&cid)
    }

    /// A reserved connection that never came (its Login Response could not be sent).
    pub fn release_connection(&self, cid: u16, ticket: u64) {
        if self.is_latest(cid, ticket) {
            self.joining.lock().expect("joining").remove(&cid);
        }
    }

    /// Adds a reserved connection (login `ticket`): `Ok` with the one it replaces
    /// (connection reinstatement), or `Err(c)` when a newer login of its CID came after its
    /// Login Response: that one stands, and `c` is the connection it reinstated.
    pub fn add_connection(
        &self,
        c: Arc<Conn>,
        ticket: u64,
    ) -> Result<Option<Arc<Conn>>, Arc<Conn>> {
        let mut conns = self.conns.lock().expect("conns");
        if !self.is_latest(c.cid, ticket) {
            return Err(c);
        }
        self.joining.lock().expect("joining").remove(&c.cid);
        Ok(conns.insert(c.cid, c))
    }

    pub fn close_all(&self) {
        for c in self.connections() {
            c.dm.close();
        }
    }

    /// Runs `f` on the core and publishes the window as it left it when it moved (under the
    /// same lock, so the published window never goes back to an older one).
    pub(crate) fn with_core<R>(&self, f: impl FnOnce(&mut SessionCore<Work>) -> R) -> R {
        let mut core = self.core.lock().expect("session core");
        let r = f(&mut core);
        if let Some((exp, max)) = core.window_update() {
            self.sn.store(exp, max);
        }
        r
    }

    /// A SCSI Command arrived on `conn`, in one turn of the core: refused (the Reject's
    /// reason and why), or kept at level 2 from its arrival (TASK REASSIGN finds it even
    /// while it waits for its turn in CmdSN order) and ordered, the tasks that run now
    /// started up to the first control PDU among them (what that does to the task table
    /// comes before the commands after it).
    fn offer_command(
        &self,
        conn: &Arc<Conn>,
        max_immediate: u32,
        cmd: ScsiCommand,
        ahs: Bytes,
        write: Option<WriteHandle>,
    ) -> Result<Vec<Order<Work>>, core::Refusal> {
        self.with_core(|c| {
            c.check_command(cmd.immediate, max_immediate)?;
            let task = TaskRef {
                itt: cmd.itt,
                lun: cmd.lun,
            };
            let kept = match &self.erl2 {
                Some(allegiances) => allegiances.keep(conn, task),
                None => Ok(None),
            };
            let (immediate, cmd_sn) = (cmd.immediate, cmd.cmd_sn);
            let work = Work::Command {
                conn: conn.clone(),
                cmd,
                ahs,
                write,
                kept,
                started: None,
            };
            let mut orders = c.order(immediate, cmd_sn, work);
            for order in &mut orders {
                let Order::Run { work, .. } = order else {
                    continue;
                };
                let Work::Command {
                    conn,
                    cmd,
                    kept,
                    started,
                    ..
                } = work
                else {
                    break;
                };
                *started = Some(c.start_task(cmd.itt, task_cid(conn, kept), cmd.lun));
            }
            Ok(orders)
        })
    }

    /// Carries out the core's ordering of a PDU: what is ready runs, what the window turned
    /// away is freed.
    async fn carry_out(self: &Arc<Self>, target: &Arc<Target>, orders: Vec<Order<Work>>) {
        for order in orders {
            match order {
                Order::Run { work, counted } => self.dispatch(target, work, counted).await,
                Order::Ignored { work, cmd_sn } => self.ignored(work, cmd_sn),
            }
        }
    }

    /// Work whose CmdSN was outside the window (or a duplicate): no answer. A command still
    /// holds what its transport set up (a write's buffer, on iSER a registered region and
    /// the command's STags): freed here, or a flood of out-of-window commands would hold it
    /// until the connection ends. The transports refuse an ITT reused while its write is
    /// pending, so the state under this ITT is this command's.
    fn ignored(&self, work: Work, cmd_sn: u32) {
        tracing::debug!(
            tsih = self.tsih,
            cmd_sn,
            exp = self.sn.load().0,
            "ignoring PDU with CmdSN outside the window"
        );
        if let Work::Command {
            conn, cmd, kept, ..
        } = work
        {
            conn.dm.forget_command(cmd.itt);
            if let (Some(allegiances), Ok(Some(k))) = (&self.erl2, &kept) {
                allegiances.forget(k);
            }
        }
    }

    async fn dispatch(self: &Arc<Self>, target: &Arc<Target>, work: Work, counted: bool) {
        match work {
            Work::Command {
                conn,
                cmd,
                ahs,
                write,
                kept,
                started,
            } => {
                conn.inflight.fetch_add(1, Ordering::AcqRel);
                let id = match started {
                    Some(id) => id,
                    None => {
                        let cid = task_cid(&conn, &kept);
                        self.with_core(|c| c.start_task(cmd.itt, cid, cmd.lun))
                    }
                };
                let s = self.clone();
                tokio::spawn(async move {
                    s.run_command(conn, cmd, ahs, write, kept, counted, id)
                        .await
                });
            }
            Work::Control { conn, pdu } => {
                self.control(target, &conn, pdu).await;
                if counted {
                    self.with_core(|c| c.complete());
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_command(
        self: Arc<Self>,
        conn: Arc<Conn>,
        cmd: ScsiCommand,
        ahs: Bytes,
        write: Option<WriteHandle>,
        kept: Result<Option<Arc<KeptTask>>, OverBudget>,
        counted: bool,
        // This run of the task (its ITT may be reused once it is aborted).
        id: TaskId,
    ) {
        let task = TaskRef {
            itt: cmd.itt,
            lun: cmd.lun,
        };
        let (outcome, kept) = match kept {
            Err(why) => {
                // Its unsolicited data, if any, is discarded as it comes.
                if write.is_some() {
                    conn.dm.abort_task(task.itt);
                }
                (Err((BudgetRefusal::Keep(why.to_string()), 0)), None)
            }
            Ok(kept) => {
                let outcome = self
                    .execute(&conn, task, &cmd, &ahs, write, kept.as_ref())
                    .await;
                (outcome, kept)
            }
        };
        let rsp = match outcome {
            Ok(rsp) => rsp,
            Err((refusal, r2ts)) => {
                tracing::warn!(peer = %conn.peer, tsih = self.tsih, itt = format_args!("0x{:08x}", task.itt), "{refusal}");
                Some((core::task_set_full(), r2ts))
            }
        };
        // Frees the window slot first so the response carries the larger MaxCmdSN.
        let aborted_by_tmf = self.with_core(|c| c.end_task(cmd.itt, id, counted));
        match rsp.filter(|(r, _)| !r.aborted && !aborted_by_tmf) {
            Some((rsp, r2ts)) => {
                // At level 2 the response goes where the task is allegiant now.
                let to = match (&self.erl2, &kept) {
                    (Some(allegiances), Some(k)) => allegiances.executed(k, &rsp, r2ts),
                    _ => conn.clone(),
                };
                send_scsi_response(&to, task, rsp, r2ts).await;
            }
            None => {
                if let (Some(allegiances), Some(k)) = (&self.erl2, &kept) {
                    allegiances.forget(k);
                }
            }
        }
        conn.task_done();
    }

    /// Collect the write data and run the command. `Ok(None)`: nothing is to be sent (the
    /// task was aborted or its connection is gone); `Err`: the budget refused it (with the
    /// R2Ts its data took). The R2Ts used go with the response.
    async fn execute(
        &self,
        conn: &Arc<Conn>,
        task: TaskRef,
        cmd: &ScsiCommand,
        ahs: &Bytes,
        write: Option<WriteHandle>,
        kept: Option<&Arc<KeptTask>>,
    ) -> Result<Option<(scsi::Response, u32)>, (BudgetRefusal, u32)> {
        let collected = match (write, kept) {
            (Some(w), Some(k)) => Some(self.collect_write(k, conn, w).await),
            (Some(w), None) => Some(conn.dm.get_data(task, w).await),
            (None, _) => None,
        };
        let (data_out, r2ts) = match collected {
            Some(got) => match got {
                Ok(x) => x,
                Err(DmError::DataPhase { why, raw_bhs }) => {
                    // The Reject goes out before the command's status.
                    conn.reject(reject::PROTOCOL_ERROR, raw_bhs, &why).await;
                    return Ok(Some((core::data_phase_error(), 0)));
                }
                Err(DmError::OverBudget(why)) => return Err((BudgetRefusal::Write(why), 0)),
                Err(DmError::Aborted | DmError::Closed | DmError::NotRetained(_)) => {
                    return Ok(None)
                }
            },
            None => (Bytes::new(), 0),
        };
        let Some(device) = self.device.clone() else {
            return Ok(None);
        };
        let read_held = conn
            .reserve_read(cmd)
            .await
            .map_err(|e| (BudgetRefusal::Read(e.to_string()), r2ts))?;
        // A command whose connection ended while it waited runs for no one (below level 2
        // nothing of it can be reassigned): a peer that queued a window of commands and went
        // away must not leave the target executing them.
        if kept.is_none() && conn.tasks_ended.load(Ordering::Acquire) {
            return Ok(None);
        }
        let (cdb, bidi_read_len) = match iscsi_wire::parse_ahs(ahs) {
            Ok(a) => (iscsi_wire::full_cdb(cmd, &a), bidi_read_len(cmd, &a)),
            Err(_) => (cmd.cdb.to_vec(), None),
        };
        let attr = match cmd.attr {
            0 => scsi::TaskAttr::Untagged,
            2 => scsi::TaskAttr::Ordered,
            3 => scsi::TaskAttr::HeadOfQueue,
            4 => scsi::TaskAttr::Aca,
            _ => scsi::TaskAttr::Simple,
        };
        let written = data_out.len() as u64;
        let rsp = device
            .execute(scsi::Command {
                nexus: self.nexus,
                lun: iscsi_wire::lun_from_wire(cmd.lun) as u64,
                cdb: Bytes::from(cdb),
                attr,
                tag: cmd.itt as u64,
                expected_len: cmd.expected_data_len,
                read: cmd.read,
                write: cmd.write,
                data_out,
                bidi_read_len,
                read_buffers: conn.dm.read_buffers(),
            })
            .await;
        conn.commands.fetch_add(1, Ordering::Relaxed);
        conn.bytes_written.fetch_add(written, Ordering::Relaxed);
        conn.bytes_read
            .fetch_add(rsp.data_in.len() as u64, Ordering::Relaxed);
        // The read data stays counted until the transport lets go of it (sent; at
        // ErrorRecoveryLevel ≥ 1, acknowledged).
        let mut rsp = rsp;
        if let Some(mut held) = read_held {
            held.shrink_to(rsp.data_in.len() as u64);
            if held.bytes() > 0 {
                rsp.data_in = held.travel_with(rsp.data_in);
            }
        }
        Ok(Some((rsp, r2ts)))
    }

    async fn control(self: &Arc<Self>, target: &Arc<Target>, conn: &Arc<Conn>, pdu: InPdu) {
        match &pdu.pdu.bhs {
            Bhs::NopOut(n) => {
                if let Some(reply) = core::nop_reply(n, &pdu.pdu.data, conn.max_send()) {
                    let _ = conn.dm.send_control(reply).await;
                }
            }
            Bhs::TextRequest(t) => self.text(target, conn, t.clone(), &pdu).await,
            Bhs::LogoutRequest(l) => self.logout(target, conn, l).await,
            Bhs::TaskMgmtRequest(t) => self.task_management(target, conn, t).await,
            Bhs::SnackRequest(snack) => self.snack(conn, snack, pdu.raw_bhs).await,
            other => {
                if let Some((reason, why)) = core::refuse_control(other) {
                    conn.reject(reason, pdu.raw_bhs, &why).await
                }
            }
        }
    }

    /// Answers a Logout Request received on `conn` as the core decides, then carries out
    /// what follows it.
    async fn logout(
        self: &Arc<Self>,
        target: &Arc<Target>,
        conn: &Arc<Conn>,
        l: &iscsi_wire::LogoutRequest,
    ) {
        target.stats.logout();
        let cx = core::LogoutContext {
            joined: self.conns.lock().expect("conns").contains_key(&l.cid),
            tasks_kept: self.erl2.as_ref().is_some_and(|a| a.any_on_cid(l.cid)),
            erl2: self.erl2.is_some(),
            time2wait: self.params.default_time2wait,
            time2retain: self.params.default_time2retain,
        };
        let plan = core::logout(l, cx);
        if plan.drain {
            conn.drain(Duration::from_secs(10)).await;
        }
        conn.send(Bhs::LogoutResponse(plan.response), Bytes::new())
            .await;
        match plan.after {
            AfterLogout::CloseSession => {
                target.remove_session(self);
                // The session is closed: nothing of it can be reassigned.
                if let Some(allegiances) = &self.erl2 {
                    allegiances.forget_all();
                }
                for c in self.connections() {
                    c.dm.close_after_logout();
                }
            }
            // Its tasks may be reassigned by the very next PDU (erl2).
            AfterLogout::RemoveConnection(cid) => {
                let other = self.conns.lock().expect("conns").remove(&cid);
                if let Some(c) = other {
                    c.dm.close();
                    self.end_tasks_of(target, &c);
                }
            }
            AfterLogout::Nothing => {}
        }
    }

    async fn text(
        self: &Arc<Self>,
        target: &Arc<Target>,
        conn: &Arc<Conn>,
        t: iscsi_wire::TextRequest,
        pdu: &InPdu,
    ) {
        let piece = if t.ttt != RESERVED_TAG {
            let mut state = conn.text.lock().expect("text");
            match state.as_mut() {
                Some((itt, r)) if *itt == t.itt => r.on_continue(t.ttt, &pdu.pdu.data).ok(),
                _ => None,
            }
        } else {
            let pairs = match iscsi_login::text::parse(&pdu.pdu.data) {
                Ok(p) => p,
                Err(e) => {
                    conn.reject(
                        reject::PROTOCOL_ERROR,
                        pdu.raw_bhs,
                        &format!("bad text data: {e}"),
                    )
                    .await;
                    return;
                }
            };
            let mut sp = self.params.clone();
            let mut cp = iscsi_login::params::ConnectionParams {
                max_send_data_segment_length: conn.max_send(),
                ..Default::default()
            };
            let ctx = TextContext {
                directory: target.directory.as_ref(),
                transport: conn.transport,
                our_max_recv_data_segment_length: target.base_limits().max_recv_data_segment_length,
            };
            let reply = iscsi_login::textneg::negotiate_text(&pairs, &mut sp, &mut cp, &ctx);
            conn.set_max_send(cp.max_send_data_segment_length);
            let data = iscsi_login::text::encode(&reply);
            let mut r = TextResponder::new(data, conn.max_send(), t.itt ^ 0x5a5a_0000);
            let first = r.first_piece();
            *conn.text.lock().expect("text") = if first.final_ { None } else { Some((t.itt, r)) };
            Some(first)
        };
        let Some(piece) = piece else {
            conn.reject(
                reject::PROTOCOL_ERROR,
                pdu.raw_bhs,
                "Text Request continues no exchange",
            )
            .await;
            return;
        };
        let rsp = TextResponse {
            final_: piece.final_,
            cont: piece.cont,
            lun: t.lun,
            itt: t.itt,
            ttt: piece.ttt,
            ..Default::default()
        };
        conn.send(Bhs::TextResponse(rsp), Bytes::from(piece.data))
            .await;
    }

    /// Abort this session's tasks matching `pred` (ITT, wire LUN) that wait for write data
    /// (at level 2 they are no longer kept for reassignment either).
    fn abort_waiting(&self, pred: impl Fn(u32, u64) -> bool) {
        let conns = self.conns.lock().expect("conns").clone();
        let matching = self.with_core(|c| c.tasks_matching(pred));
        for (itt, cid) in matching {
            if let Some(allegiances) = &self.erl2 {
                let _ = allegiances.forget_itt(itt);
            }
            if let Some(c) = conns.get(&cid) {
                c.dm.abort_task(itt);
            }
        }
    }

    /// Answers a task management request received on `conn`.
    async fn task_management(
        self: &Arc<Self>,
        target: &Arc<Target>,
        conn: &Arc<Conn>,
        t: &iscsi_wire::TaskMgmtRequest,
    ) {
        let luns = self.device.as_ref().map(|d| d.luns());
        let device = self.device.as_ref().zip(luns.as_deref());
        let response = match core::tmf_plan(t, self.erl2.is_some(), device) {
            TmfPlan::Reassign => return self.reassign(conn, t).await,
            TmfPlan::Answer(code) => code,
            TmfPlan::Act(device, action) => self.carry_out_tmf(target, device, t, action).await,
        };
        // A cold reset ends the target's sessions as they were when it was done (one that
        // logs in while the response goes out is not part of it).
        let reset_sessions = match &self.device {
            Some(d) if t.function == tmf::TARGET_COLD_RESET && response == tmf::RSP_COMPLETE => {
                target.sessions_of(d)
            }
            _ => Vec::new(),
        };
        let rsp = TaskMgmtResponse {
            response,
            itt: t.itt,
            ..Default::default()
        };
        conn.send(Bhs::TaskMgmtResponse(rsp), Bytes::new()).await;
        for s in reset_sessions {
            s.close_all();
        }
    }

    /// Carries out a task management function on the SCSI engine; the response code.
    async fn carry_out_tmf(
        self: &Arc<Self>,
        target: &Arc<Target>,
        device: &Arc<scsi::Device>,
        t: &iscsi_wire::TaskMgmtRequest,
        action: TmfAction,
    ) -> u8 {
        let on_lun =
            |lun: u64| move |_: u32, wire: u64| iscsi_wire::lun_from_wire(wire) as u64 == lun;
        match action {
            TmfAction::AbortTask => {
                // From here its response will not be sent.
                let claimed = self.with_core(|c| c.claim_for_abort(t.ref_task_tag));
                // At level 2 a task of a failed connection is kept after it executed (its
                // response waiting for reassignment): aborting it forgets it, so the
                // initiator may send the command again with its ITT.
                let kept = self
                    .erl2
                    .as_ref()
                    .is_some_and(|a| a.forget_itt(t.ref_task_tag));
                if claimed {
                    self.abort_waiting(|itt, _| itt == t.ref_task_tag);
                    device.abort_task(self.nexus, t.ref_task_tag as u64).await;
                }
                core::abort_task(t, claimed, kept, self.sn.load().0)
            }
            TmfAction::AbortTaskSet(lun) => {
                self.abort_waiting(on_lun(lun));
                device.abort_task_set(self.nexus, lun).await;
                tmf::RSP_COMPLETE
            }
            TmfAction::ClearTaskSet(lun) => {
                self.abort_waiting(on_lun(lun));
                device.clear_task_set(lun).await;
                tmf::RSP_COMPLETE
            }
            TmfAction::LunReset(lun) => {
                for s in target.sessions_of(device) {
                    s.abort_waiting(on_lun(lun));
                }
                device.lun_reset(lun).await;
                tmf::RSP_COMPLETE
            }
            TmfAction::TargetReset { cold } => {
                for s in target.sessions_of(device) {
                    s.abort_waiting(|_, _| true);
                }
                let kind = if cold {
                    scsi::ResetKind::Cold
                } else {
                    scsi::ResetKind::Warm
                };
                device.target_reset(kind).await;
                tmf::RSP_COMPLETE
            }
        }
    }
}

/// The connection a command's task answers on: at level 2 it may have moved while it waited
/// for its turn.
fn task_cid(conn: &Conn, kept: &Result<Option<Arc<KeptTask>>, OverBudget>) -> u16 {
    match kept {
        Ok(Some(k)) => k.conn().cid,
        _ => conn.cid,
    }
}

/// A bidirectional command's expected data-in length: the R and W bits both set, the length
/// from the Bidirectional Expected Read-Data Length AHS (0 when the initiator left it out).
fn bidi_read_len(cmd: &ScsiCommand, ahs: &[iscsi_wire::Ahs]) -> Option<u32> {
    (cmd.read && cmd.write).then(|| {
        ahs.iter()
            .find_map(|a| match a {
                iscsi_wire::Ahs::BidiReadLength(n) => Some(*n),
                _ => None,
            })
            .unwrap_or(0)
    })
}

/// A command's data-in and status: in the last Data-In when it went well, else Data-In then
/// a SCSI Response (as `core` builds them). A bidirectional command's Data-In is numbered
/// after its R2Ts (the two share one sequence).
pub(crate) async fn send_scsi_response(
    conn: &Conn,
    task: TaskRef,
    mut rsp: scsi::Response,
    r2ts: u32,
) {
    if let Some(st) = core::collapsed_status(&rsp) {
        let _ = conn
            .dm
            .put_data(task, rsp.data_in, rsp.data_in_note, Some(st))
            .await;
        return;
    }
    let mut data_pdus = r2ts;
    if !rsp.data_in.is_empty() {
        let data_in = std::mem::take(&mut rsp.data_in);
        let sent = match rsp.bidi_read_residual {
            Some(_) => conn.dm.put_bidi_data(task, data_in, r2ts).await,
            None => {
                let note = rsp.data_in_note.take();
                conn.dm.put_data(task, data_in, note, None).await
            }
        };
        data_pdus += sent.unwrap_or(0);
    }
    let _ = conn
        .dm
        .send_control(core::scsi_response(task.itt, &rsp, data_pdus))
        .await;
}

/// Drive one connection in full feature phase until it closes.
pub(crate) async fn run_full_feature(
    target: Arc<Target>,
    session: Arc<Session>,
    conn: Arc<Conn>,
    mut notices: mpsc::Receiver<Notice>,
) {
    let cfg = target.config();
    let ping_every = Duration::from_secs(cfg.nop_interval_secs);
    let ping_timeout = Duration::from_secs(cfg.nop_timeout_secs.max(1));
    let mut stop = target.shutdown.subscribe();
    let now = || tokio::time::Instant::now().into_std();
    let mut pings = PingTimer::new(ping_every, ping_timeout, now());
    // One timer for the connection, moved only when it fires early: setting a new one for
    // every PDU re-registered it with the runtime's timer each time (a wake-up of a parked
    // worker, per command).
    let timer = tokio::time::sleep_until(pings.deadline(now()).into());
    tokio::pin!(timer);
    let reason = loop {
        let notice = tokio::select! {
            n = notices.recv() => n,
            _ = &mut timer => {
                let next = match pings.fired(now()) {
                    PingStep::Wait(at) => at,
                    PingStep::Unanswered => break "no answer to NOP-In ping".to_string(),
                    PingStep::Ping(nop) => {
                        conn.ping_ttt.store(nop.ttt, Ordering::Release);
                        let send = conn.dm.send_control(Pdu::new(Bhs::NopIn(nop), Bytes::new()));
                        if tokio::time::timeout(ping_timeout, send).await.is_err() {
                            break "peer stopped reading".to_string();
                        }
                        pings.ping_sent(now())
                    }
                };
                timer.as_mut().reset(next.into());
                continue;
            }
            _ = stop.changed() => break "target shutting down".to_string(),
        };
        // Any PDU shows the peer is alive.
        if let Some(next) = pings.heard(now()) {
            timer.as_mut().reset(next.into());
        }
        let Some(notice) = notice else {
            break "connection closed".to_string();
        };
        if let Some(why) = session.on_notice(&target, &conn, notice).await {
            break why;
        }
    };
    session.connection_ended(&target, &conn, &reason);
}

impl Session {
    /// Handles one notice from a connection's datamover; `Some(reason)` when the connection
    /// has ended.
    async fn on_notice(
        self: &Arc<Self>,
        target: &Arc<Target>,
        conn: &Arc<Conn>,
        notice: Notice,
    ) -> Option<String> {
        match notice {
            Notice::Closed(why) => return Some(why),
            Notice::Reject {
                reason,
                raw_bhs,
                why,
            } => conn.reject(reason, raw_bhs, &why).await,
            Notice::Command { pdu, write } => {
                self.acknowledge(conn, &pdu.pdu.bhs);
                let Bhs::ScsiCommand(cmd) = pdu.pdu.bhs else {
                    unreachable!("datamover sends commands as Command")
                };
                let itt = cmd.itt;
                let max_immediate = target.max_immediate_commands;
                match self.offer_command(conn, max_immediate, cmd, pdu.pdu.ahs, write) {
                    Ok(orders) => self.carry_out(target, orders).await,
                    Err((reason, why)) => {
                        // What its transport set up for it goes with it.
                        conn.dm.forget_command(itt);
                        conn.reject(reason, pdu.raw_bhs, why).await;
                    }
                }
            }
            Notice::Control(pdu) => {
                self.acknowledge(conn, &pdu.pdu.bhs);
                // A ping answer or an ExpStatSN update has nothing more to do.
                if let Some((immediate, cmd_sn)) = core::control_order(&pdu.pdu.bhs) {
                    let work = Work::Control {
                        conn: conn.clone(),
                        pdu,
                    };
                    let orders = self.with_core(|c| c.order(immediate, cmd_sn, work));
                    self.carry_out(target, orders).await;
                }
            }
        }
        None
    }

    /// Connection `conn` is out of the session (once; later calls do nothing): its writes
    /// waiting for data end — at level 2 to wait for reassignment instead. Returns whether
    /// tasks wait for reassignment.
    fn end_tasks_of(self: &Arc<Self>, target: &Arc<Target>, conn: &Arc<Conn>) -> bool {
        if conn.tasks_ended.swap(true, Ordering::AcqRel) {
            return self.erl2.as_ref().is_some_and(|a| a.any_on(conn));
        }
        let waiting_for_data = self.with_core(|c| c.tasks_on(conn.cid));
        for itt in waiting_for_data {
            conn.dm.abort_task(itt);
        }
        self.connection_failed(target, conn)
    }

    /// A connection ended: its datamover closes, its tasks waiting for data are aborted, and
    /// a session left without connections goes.
    fn connection_ended(self: &Arc<Self>, target: &Arc<Target>, conn: &Arc<Conn>, reason: &str) {
        tracing::info!(peer = %conn.peer, tsih = self.tsih, cid = conn.cid, "connection ended: {reason}");
        let rejects = conn.rejects.load(Ordering::Relaxed);
        if rejects > REJECTS_LOGGED {
            tracing::info!(peer = %conn.peer, tsih = self.tsih, cid = conn.cid, "{rejects} Rejects were sent on this connection");
        }
        let recovered = conn.recovery.summary();
        if !recovered.is_empty() {
            tracing::info!(peer = %conn.peer, tsih = self.tsih, cid = conn.cid, "error recovery on this connection: {recovered}");
        }
        conn.dm.close();
        // Tasks kept from any failed connection keep the session (a connection logged in
        // again in a failed one's place may fail before a task is reassigned to it).
        let kept = self.end_tasks_of(target, conn) || self.erl2.as_ref().is_some_and(|a| a.any());
        let now_empty = {
            let mut conns = self.conns.lock().expect("conns");
            if conns.get(&conn.cid).is_some_and(|c| Arc::ptr_eq(c, conn)) {
                conns.remove(&conn.cid);
            }
            conns.is_empty()
        };
        if now_empty && !kept {
            target.remove_session(self);
        }
    }
}
