//! The sans-IO heart of an initiator session in full feature phase: ITT allocation, the
//! CmdSN window (commands wait while CmdSN would pass MaxCmdSN), per-connection ExpStatSN,
//! building SCSI Command PDUs with immediate data and unsolicited Data-Out up to
//! FirstBurstLength, status (phase-collapsed or not), residuals, sense, NOP-In answers,
//! task management, logout and connection loss.
//!
//! It owns no socket, no clock and no data phase: solicited data and read data are each
//! connection's datamover's (`datamover::InitiatorDatamover`). The driver feeds it that
//! datamover's notices and drains [`SessionCore::actions`] (commands and PDUs to send on a
//! connection, data-phase state to drop, requests to complete). Each request carries a
//! caller token `T` (the driver uses a channel sender) returned on completion.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use datamover::{CommandOut, InitiatorNotice, Resume, SnackFor};
use iscsi_session::DataOutSequence;
use iscsi_wire::serial::{sn_gt, sn_le, sn_lt};
use iscsi_wire::{
    tmf, Ahs, Bhs, LogoutRequest, NopIn, NopOut, ScsiCommand, TaskMgmtRequest, RESERVED_TAG,
};

/// Session-wide negotiated values the data path needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    /// Send a write's data unsolicited only when all of it fits in the command PDU as
    /// immediate data; a larger write goes with none (F set) and the target fetches all of it.
    /// Over iSER that is one RDMA Read into place instead of a first part in Sends that both
    /// ends copy (through registered send and receive buffers).
    pub unsolicited_only_whole: bool,
}

impl Default for SessionLimits {
    /// The RFC 7143 defaults.
    fn default() -> Self {
        SessionLimits {
            immediate_data: true,
            initial_r2t: true,
            first_burst_length: 65_536,
            max_burst_length: 262_144,
            unsolicited_only_whole: false,
        }
    }
}

/// A SCSI command to run.
#[derive(Debug, Clone)]
pub struct CommandRequest {
    pub lun: u16,
    /// The CDB; bytes past 16 go in an Extended CDB AHS.
    pub cdb: Vec<u8>,
    /// Bytes of Data-In expected (0 for none).
    pub read_len: u32,
    /// Data to write (empty for none).
    pub write: Bytes,
    /// Task attribute (0 untagged, 1 simple, 2 ordered, 3 head of queue).
    pub attr: u8,
}

impl CommandRequest {
    /// Both data-out and data-in (the read length goes in a Bidirectional Expected
    /// Read-Data Length AHS).
    pub fn is_bidi(&self) -> bool {
        self.read_len > 0 && !self.write.is_empty()
    }
    /// A command without data.
    pub fn none(lun: u16, cdb: Vec<u8>) -> Self {
        CommandRequest {
            lun,
            cdb,
            read_len: 0,
            write: Bytes::new(),
            attr: 1,
        }
    }
    /// A command reading `len` bytes.
    pub fn read(lun: u16, cdb: Vec<u8>, len: u32) -> Self {
        CommandRequest {
            read_len: len,
            ..Self::none(lun, cdb)
        }
    }
    /// A command writing `data`.
    pub fn write(lun: u16, cdb: Vec<u8>, data: Bytes) -> Self {
        CommandRequest {
            write: data,
            ..Self::none(lun, cdb)
        }
    }
    /// A command writing `data` (none when empty) and reading up to `read_len` bytes (none
    /// when 0): bidirectional when it does both.
    pub fn with_data(lun: u16, cdb: Vec<u8>, data: Bytes, read_len: u32) -> Self {
        CommandRequest {
            write: data,
            read_len,
            ..Self::none(lun, cdb)
        }
    }
}

/// Residual count reported with the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Residual {
    #[default]
    None,
    /// Fewer bytes were transferred than expected.
    Underflow(u32),
    /// The command wanted more bytes than expected.
    Overflow(u32),
}

/// What a SCSI command came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    /// SCSI status (0 GOOD, 2 CHECK CONDITION, ...).
    pub status: u8,
    /// Data-In received (shortened by an underflow residual).
    pub data: Bytes,
    /// Sense bytes of a CHECK CONDITION (without the 2-byte length).
    pub sense: Bytes,
    /// The residual of the expected data transfer length (a bidirectional command's
    /// data-out).
    pub residual: Residual,
    /// A bidirectional command's data-in residual; `None` for other commands.
    pub bidi_read_residual: Option<Residual>,
}

/// Why a request did not complete with a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("connection lost with the command in flight: {0}")]
    ConnectionLost(String),
    #[error("task aborted")]
    Aborted,
    #[error("the target answered with iSCSI response 0x{0:02x} (target failure)")]
    Response(u8),
    #[error("the target rejected the PDU (reason 0x{0:02x})")]
    Rejected(u8),
    #[error("the session is closed")]
    SessionClosed,
}

/// Completion of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Scsi(CommandResult),
    /// Task management response code (0 function complete).
    Tmf(u8),
    /// Data of the NOP-In answering our ping.
    Nop(Bytes),
    /// Logout response code (0 success).
    Logout(u8),
    /// Data of the Text Response to a negotiation in full feature phase.
    Text(Bytes),
}

/// A PDU to send on a connection (digests and framing are the transport's).
pub type OutPdu = iscsi_wire::Pdu;

/// What the driver must do.
#[derive(Debug)]
pub enum Action<T> {
    /// A SCSI Command for the connection's datamover, which runs its data phases.
    Command { conn: usize, cmd: CommandOut },
    /// Any other PDU.
    Send { conn: usize, pdu: OutPdu },
    /// The command was aborted or rejected: the datamover drops its data-phase state.
    Forget { conn: usize, itt: u32 },
    /// ErrorRecoveryLevel 2: a command reassigned to the connection (a TASK REASSIGN
    /// follows); its datamover takes charge of its data phases without sending it.
    Adopt {
        conn: usize,
        cmd: CommandOut,
        resume: Resume,
    },
    Complete {
        token: T,
        result: Result<Reply, TaskError>,
    },
    /// An Asynchronous Message (event code, e.g. 1 = the target asks for a logout).
    Async { conn: usize, event: u8 },
}

/// The target broke the protocol on a connection: the driver drops the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protocol error from the target: {0}")]
pub struct ConnError(pub String);

fn perr(m: impl Into<String>) -> ConnError {
    ConnError(m.into())
}

#[derive(Debug)]
struct ConnState {
    alive: bool,
    exp_stat_sn: u32,
    max_send_seg: u32,
    /// A SCSI command completed on it since it logged in.
    completed: bool,
}

impl ConnState {
    fn new(alive: bool, exp_stat_sn: u32, max_send_seg: u32) -> ConnState {
        ConnState {
            alive,
            exp_stat_sn,
            max_send_seg: max_seg(max_send_seg),
            completed: false,
        }
    }
}

#[derive(Debug)]
enum Kind {
    Scsi {
        req: CommandRequest,
    },
    Tmf {
        function: u8,
        ref_itt: u32,
        lun: u16,
    },
    Nop,
    Logout,
    Text,
}

#[derive(Debug)]
struct Task<T> {
    token: T,
    conn: Option<usize>,
    cmd_sn: u32,
    kind: Kind,
    /// Times the command was sent again after a Reject for a data digest error.
    retries: u8,
    /// ErrorRecoveryLevel 2: its connection failed; it waits for a connection to be
    /// reassigned to.
    orphaned: bool,
    /// TASK REASSIGNs answered "task still allegiant" (the target had not yet seen the old
    /// connection go).
    reassign_tries: u8,
    /// ErrorRecoveryLevel 2: how far it got on the connections it was on (TASK REASSIGN's
    /// ExpDataSN: for a write the target re-issues only R2Ts from it on, and asks again for
    /// what is missing below it; for a read it resends the Data-In not acknowledged).
    resume: Resume,
}

impl<T> Task<T> {
    /// A SCSI command with both data-out and data-in.
    fn is_bidi(&self) -> bool {
        matches!(&self.kind, Kind::Scsi { req } if req.is_bidi())
    }
}

/// The AHS of a SCSI Command: the CDB's bytes past 16, and a bidirectional command's
/// expected read length.
fn command_ahs(req: &CommandRequest) -> Bytes {
    let mut ahs = Vec::new();
    if req.cdb.len() > 16 {
        ahs.push(Ahs::ExtendedCdb(req.cdb[16..].to_vec()));
    }
    if req.is_bidi() {
        ahs.push(Ahs::BidiReadLength(req.read_len));
    }
    if ahs.is_empty() {
        Bytes::new()
    } else {
        Bytes::from(iscsi_wire::encode_ahs(&ahs))
    }
}

/// A command Rejected for a data digest error (its immediate data was damaged on the way)
/// is sent again this many times before it fails.
const MAX_COMMAND_RETRIES: u8 = 4;

/// Error recovery events of a session (ErrorRecoveryLevel ≥ 1, and reinstatements).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Data SNACKs sent for Data-In lost or damaged on the way.
    pub data_snacks: u64,
    /// R2T SNACKs sent for R2Ts lost on the way.
    pub r2t_snacks: u64,
    /// Status SNACKs sent for statuses lost on the way.
    pub status_snacks: u64,
    /// PDUs from the target discarded for a header digest error.
    pub header_digest_discards: u64,
    /// DataACKs sent, answering the target's acknowledgement requests (A bit).
    pub data_acks: u64,
    /// R-Data SNACKs sent: reads asked for again cut anew after our
    /// MaxRecvDataSegmentLength changed (also counted in `data_snacks`).
    pub r_data_snacks: u64,
    /// Data-Out the target Rejected for a data digest error (it asks again by R2T).
    pub data_out_rejects: u64,
    /// Commands sent again after a Reject for a data digest error.
    pub command_retries: u64,
    /// Commands sent again because the target never got them (ExpCmdSN stuck at them).
    pub lost_commands: u64,
    /// Session reinstatements after a lost connection (ErrorRecoveryLevel 0, or when
    /// connection recovery failed).
    pub reinstatements: u64,
    /// Connections logged in again after they failed (ErrorRecoveryLevel 2).
    pub connection_recoveries: u64,
    /// Commands moved to another connection by TASK REASSIGN (ErrorRecoveryLevel 2).
    pub task_reassigns: u64,
    /// Commands aborted and sent again as new tasks on another connection of the session
    /// when their connection could not be recovered (ErrorRecoveryLevel 2).
    pub reissued_commands: u64,
}

impl RecoveryStats {
    /// Field by field sum (over sessions).
    pub fn plus(self, o: RecoveryStats) -> RecoveryStats {
        RecoveryStats {
            data_snacks: self.data_snacks + o.data_snacks,
            r2t_snacks: self.r2t_snacks + o.r2t_snacks,
            status_snacks: self.status_snacks + o.status_snacks,
            header_digest_discards: self.header_digest_discards + o.header_digest_discards,
            data_acks: self.data_acks + o.data_acks,
            r_data_snacks: self.r_data_snacks + o.r_data_snacks,
            data_out_rejects: self.data_out_rejects + o.data_out_rejects,
            command_retries: self.command_retries + o.command_retries,
            lost_commands: self.lost_commands + o.lost_commands,
            reinstatements: self.reinstatements + o.reinstatements,
            connection_recoveries: self.connection_recoveries + o.connection_recoveries,
            task_reassigns: self.task_reassigns + o.task_reassigns,
            reissued_commands: self.reissued_commands + o.reissued_commands,
        }
    }

    /// What happened since `before` was taken.
    pub fn since(self, before: RecoveryStats) -> RecoveryStats {
        RecoveryStats {
            data_snacks: self.data_snacks.saturating_sub(before.data_snacks),
            r2t_snacks: self.r2t_snacks.saturating_sub(before.r2t_snacks),
            status_snacks: self.status_snacks.saturating_sub(before.status_snacks),
            header_digest_discards: self
                .header_digest_discards
                .saturating_sub(before.header_digest_discards),
            data_acks: self.data_acks.saturating_sub(before.data_acks),
            r_data_snacks: self.r_data_snacks.saturating_sub(before.r_data_snacks),
            data_out_rejects: self
                .data_out_rejects
                .saturating_sub(before.data_out_rejects),
            command_retries: self.command_retries.saturating_sub(before.command_retries),
            lost_commands: self.lost_commands.saturating_sub(before.lost_commands),
            reinstatements: self.reinstatements.saturating_sub(before.reinstatements),
            connection_recoveries: self
                .connection_recoveries
                .saturating_sub(before.connection_recoveries),
            task_reassigns: self.task_reassigns.saturating_sub(before.task_reassigns),
            reissued_commands: self
                .reissued_commands
                .saturating_sub(before.reissued_commands),
        }
    }
}

/// The state of one session.
#[derive(Debug)]
pub struct SessionCore<T> {
    limits: SessionLimits,
    conns: Vec<ConnState>,
    /// CmdSN of the next non-immediate command.
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    next_itt: u32,
    tasks: HashMap<u32, Task<T>>,
    /// SCSI commands waiting for the window (or for a connection).
    queue: VecDeque<u32>,
    rr: usize,
    /// Filled by every call; the driver drains it.
    pub actions: Vec<Action<T>>,
    /// Recovery events so far (the driver counts reinstatements).
    pub recovery: RecoveryStats,
    /// The target's ExpCmdSN at the last check for a lost command, when a SCSI command
    /// with that CmdSN was outstanding then.
    stalled_at: Option<u32>,
    /// ErrorRecoveryLevel 2: the task management requests of connection recovery
    /// outstanding (their ITT → what they ask, and of which command); internal, so not in
    /// `tasks`, which hold a token.
    recovery_tmfs: HashMap<u32, RecoveryTmf>,
    /// ErrorRecoveryLevel 2: a TASK REASSIGN came back "task still allegiant"; the driver
    /// asks again on this connection a little later ([`SessionCore::take_reassign_retry`]).
    reassign_retry: Option<usize>,
    /// ErrorRecoveryLevel 2, per connection: failures in a row with no command completed
    /// on it in between ([`SessionCore::failed_in_a_row`]).
    failed_in_a_row: Vec<u8>,
    /// TASK REASSIGNs answered "function rejected" and taken as done (LIO's answer to a
    /// successful one).
    pub rejected_reassigns: u64,
}

fn max_seg(v: u32) -> u32 {
    v.clamp(512, iscsi_wire::MAX_DATA_SEGMENT)
}

impl<T> SessionCore<T> {
    /// A session whose login ended with the given CmdSN state.
    pub fn new(limits: SessionLimits, cmd_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Self {
        SessionCore {
            limits,
            conns: Vec::new(),
            cmd_sn,
            exp_cmd_sn,
            max_cmd_sn,
            next_itt: 1,
            tasks: HashMap::new(),
            queue: VecDeque::new(),
            rr: 0,
            actions: Vec::new(),
            recovery: RecoveryStats::default(),
            stalled_at: None,
            recovery_tmfs: HashMap::new(),
            reassign_retry: None,
            failed_in_a_row: Vec::new(),
            rejected_reassigns: 0,
        }
    }

    /// Adds a connection in full feature phase; returns its index.
    /// `exp_stat_sn` is the StatSN after the last Login Response; `max_send_seg` the most
    /// data a PDU to the target may carry (its MaxRecvDataSegmentLength, over iSER its
    /// TargetRecvDataSegmentLength).
    pub fn add_connection(&mut self, exp_stat_sn: u32, max_send_seg: u32) -> usize {
        let c = ConnState::new(true, exp_stat_sn, max_send_seg);
        let idx = match self.conns.iter().position(|c| !c.alive) {
            Some(i) => {
                self.conns[i] = c;
                i
            }
            None => {
                self.conns.push(c);
                self.conns.len() - 1
            }
        };
        self.pump();
        idx
    }

    /// Starts over after session reinstatement: a new session's CmdSN state and limits, no
    /// connections. Queued commands stay queued.
    pub fn reset_session(
        &mut self,
        limits: SessionLimits,
        cmd_sn: u32,
        exp_cmd_sn: u32,
        max_cmd_sn: u32,
    ) {
        self.limits = limits;
        self.cmd_sn = cmd_sn;
        self.exp_cmd_sn = exp_cmd_sn;
        self.max_cmd_sn = max_cmd_sn;
        self.conns.clear();
    }

    /// CmdSN the next command (or a login on a new connection) uses.
    pub fn cmd_sn(&self) -> u32 {
        self.cmd_sn
    }

    /// (ExpCmdSN, MaxCmdSN) as last reported by the target.
    pub fn window(&self) -> (u32, u32) {
        (self.exp_cmd_sn, self.max_cmd_sn)
    }

    /// Commands the target will accept now (MaxCmdSN - ExpCmdSN + 1).
    pub fn window_size(&self) -> u32 {
        self.max_cmd_sn
            .wrapping_sub(self.exp_cmd_sn)
            .wrapping_add(1)
    }

    /// Requests not yet completed (sent or queued).
    pub fn outstanding(&self) -> usize {
        self.tasks.len()
    }

    /// Commands waiting for window space or a connection.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Indexes of connections still up.
    pub fn live_connections(&self) -> Vec<usize> {
        (0..self.conns.len())
            .filter(|&i| self.conns[i].alive)
            .collect()
    }

    /// ExpStatSN of a connection.
    pub fn exp_stat_sn(&self, conn: usize) -> u32 {
        self.conns.get(conn).map_or(0, |c| c.exp_stat_sn)
    }

    fn alloc_itt(&mut self) -> u32 {
        // At most tasks.len() + 1 candidates are in use or reserved: the loop ends.
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG
                && !self.tasks.contains_key(&itt)
                && !self.recovery_tmfs.contains_key(&itt)
            {
                return itt;
            }
        }
    }

    fn pick_conn(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.rr + k) % n;
            if self.conns[i].alive {
                self.rr = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    /// Queues a SCSI command; it goes out as soon as the window allows. Returns its ITT.
    pub fn submit(&mut self, token: T, req: CommandRequest) -> u32 {
        let itt = self.alloc_itt();
        self.tasks.insert(
            itt,
            Task {
                token,
                conn: None,
                cmd_sn: 0,
                kind: Kind::Scsi { req },
                retries: 0,
                orphaned: false,
                reassign_tries: 0,
                resume: Resume::default(),
            },
        );
        self.queue.push_back(itt);
        self.pump();
        itt
    }

    /// Sends queued commands while the window is open.
    fn pump(&mut self) {
        while let Some(&itt) = self.queue.front() {
            if !sn_le(self.cmd_sn, self.max_cmd_sn) {
                return;
            }
            let Some(conn) = self.pick_conn() else {
                return;
            };
            self.queue.pop_front();
            let cmd_sn = self.cmd_sn;
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
            let Some(task) = self.tasks.get_mut(&itt) else {
                continue;
            };
            task.conn = Some(conn);
            task.cmd_sn = cmd_sn;
            let Kind::Scsi { req, .. } = &task.kind else {
                continue;
            };
            let req = req.clone();
            self.send_command(conn, itt, cmd_sn, &req);
        }
    }

    fn send_command(&mut self, conn: usize, itt: u32, cmd_sn: u32, req: &CommandRequest) {
        let (cmd, immediate, unsolicited_end) = self.command_out(conn, itt, cmd_sn, req);
        let exp_stat_sn = self.conns[conn].exp_stat_sn;
        self.actions.push(Action::Command { conn, cmd });
        let unsolicited = DataOutSequence {
            itt,
            lun: iscsi_wire::lun_to_wire(req.lun),
            ttt: RESERVED_TAG,
            exp_stat_sn,
            max_segment: self.conns[conn].max_send_seg,
        };
        for pdu in unsolicited.pdus(&req.write, immediate, unsolicited_end) {
            self.actions.push(Action::Send { conn, pdu });
        }
    }

    /// The SCSI Command PDU for `req` on `conn` with what its data phases need, and where
    /// its immediate and its unsolicited data end.
    fn command_out(
        &self,
        conn: usize,
        itt: u32,
        cmd_sn: u32,
        req: &CommandRequest,
    ) -> (CommandOut, u32, u32) {
        let lim = self.limits;
        let seg = self.conns[conn].max_send_seg;
        let exp_stat_sn = self.conns[conn].exp_stat_sn;
        let wlen = req.write.len() as u32;
        let lun = iscsi_wire::lun_to_wire(req.lun);
        let immediate = if lim.immediate_data && wlen > 0 {
            wlen.min(lim.first_burst_length).min(seg)
        } else {
            0
        };
        let (immediate, unsolicited_end) = if lim.unsolicited_only_whole {
            let whole = if immediate == wlen { immediate } else { 0 };
            (whole, whole)
        } else if !lim.initial_r2t && wlen > 0 {
            (immediate, wlen.min(lim.first_burst_length))
        } else {
            (immediate, immediate)
        };
        let mut cdb = [0u8; 16];
        let n = req.cdb.len().min(16);
        cdb[..n].copy_from_slice(&req.cdb[..n]);
        let ahs = command_ahs(req);
        let bhs = Bhs::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: unsolicited_end <= immediate,
            read: req.read_len > 0,
            write: wlen > 0,
            attr: req.attr & 7,
            lun,
            itt,
            expected_data_len: if wlen > 0 { wlen } else { req.read_len },
            cmd_sn,
            exp_stat_sn,
            cdb,
        });
        let cmd = CommandOut {
            pdu: OutPdu {
                bhs,
                ahs,
                data: req.write.slice(..immediate as usize),
            },
            write: req.write.clone(),
            solicited_from: unsolicited_end,
            read_len: req.read_len,
        };
        (cmd, immediate, unsolicited_end)
    }

    fn send_immediate(
        &mut self,
        conn: usize,
        token: T,
        kind: Kind,
        build: impl FnOnce(u32, u32, u32) -> Bhs,
    ) -> u32 {
        self.send_immediate_with_data(conn, token, kind, Bytes::new(), build)
    }

    /// [`SessionCore::send_immediate`] with a data segment (a Text Request's keys).
    fn send_immediate_with_data(
        &mut self,
        conn: usize,
        token: T,
        kind: Kind,
        data: Bytes,
        build: impl FnOnce(u32, u32, u32) -> Bhs,
    ) -> u32 {
        let itt = self.alloc_itt();
        let bhs = build(itt, self.cmd_sn, self.conns[conn].exp_stat_sn);
        self.tasks.insert(
            itt,
            Task {
                token,
                conn: Some(conn),
                cmd_sn: self.cmd_sn,
                kind,
                retries: 0,
                orphaned: false,
                reassign_tries: 0,
                resume: Resume::default(),
            },
        );
        self.send_pdu(conn, bhs, data);
        itt
    }

    /// Sends a PDU that is only a header (no AHS, no data) on `conn`.
    fn send_header(&mut self, conn: usize, bhs: Bhs) {
        self.send_pdu(conn, bhs, Bytes::new());
    }

    /// Sends a PDU with a data segment and no AHS on `conn`.
    fn send_pdu(&mut self, conn: usize, bhs: Bhs, data: Bytes) {
        let ahs = Bytes::new();
        self.actions.push(Action::Send {
            conn,
            pdu: OutPdu { bhs, ahs, data },
        });
    }

    /// Pings the target on `conn` with a NOP-Out that asks for a NOP-In.
    /// Returns `None` when the connection is down.
    pub fn ping(&mut self, conn: usize, token: T) -> Result<u32, T> {
        if !self.conns.get(conn).is_some_and(|c| c.alive) {
            return Err(token);
        }
        Ok(
            self.send_immediate(conn, token, Kind::Nop, |itt, cmd_sn, exp_stat_sn| {
                Bhs::NopOut(NopOut {
                    immediate: true,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn,
                })
            }),
        )
    }

    /// A Text Request (immediate, final) carrying `keys` on `conn`: a negotiation in full
    /// feature phase, answered by one Text Response.
    pub fn text(&mut self, conn: usize, keys: Bytes, token: T) -> Result<u32, T> {
        if !self.conns.get(conn).is_some_and(|c| c.alive) {
            return Err(token);
        }
        let build = |itt, cmd_sn, exp_stat_sn| {
            Bhs::TextRequest(iscsi_wire::TextRequest {
                immediate: true,
                final_: true,
                cont: false,
                lun: 0,
                itt,
                ttt: RESERVED_TAG,
                cmd_sn,
                exp_stat_sn,
            })
        };
        Ok(self.send_immediate_with_data(conn, token, Kind::Text, keys, build))
    }

    /// ABORT TASK for the command `itt` (sent on the command's connection).
    /// Gives the token back when there is no such command or no connection.
    pub fn abort_task(&mut self, itt: u32, token: T) -> Result<u32, T> {
        let Some(task) = self.tasks.get(&itt) else {
            return Err(token);
        };
        let Kind::Scsi { req, .. } = &task.kind else {
            return Err(token);
        };
        let lun = req.lun;
        let ref_cmd_sn = task.cmd_sn;
        let conn = match task.conn {
            Some(c) => c,
            None => {
                // Not sent yet: drop it from the queue; nothing goes on the wire.
                self.queue.retain(|&i| i != itt);
                let t = self.tasks.remove(&itt).expect("present");
                self.actions.push(Action::Complete {
                    token: t.token,
                    result: Err(TaskError::Aborted),
                });
                self.actions.push(Action::Complete {
                    token,
                    result: Ok(Reply::Tmf(tmf::RSP_COMPLETE)),
                });
                return Ok(itt);
            }
        };
        Ok(self.send_tmf(conn, token, tmf::ABORT_TASK, lun, itt, ref_cmd_sn))
    }

    /// LOGICAL UNIT RESET of `lun`.
    pub fn lun_reset(&mut self, lun: u16, token: T) -> Result<u32, T> {
        let Some(conn) = self.pick_conn() else {
            return Err(token);
        };
        Ok(self.send_tmf(conn, token, tmf::LOGICAL_UNIT_RESET, lun, RESERVED_TAG, 0))
    }

    fn send_tmf(
        &mut self,
        conn: usize,
        token: T,
        function: u8,
        lun: u16,
        ref_itt: u32,
        ref_cmd_sn: u32,
    ) -> u32 {
        let kind = Kind::Tmf {
            function,
            ref_itt,
            lun,
        };
        self.send_immediate(conn, token, kind, |itt, cmd_sn, exp_stat_sn| {
            Bhs::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function,
                lun: iscsi_wire::lun_to_wire(lun),
                itt,
                ref_task_tag: ref_itt,
                cmd_sn,
                exp_stat_sn,
                ref_cmd_sn: if ref_itt == RESERVED_TAG {
                    cmd_sn
                } else {
                    ref_cmd_sn
                },
                exp_data_sn: 0,
            })
        })
    }

    /// Logout request closing the session, on the first live connection.
    pub fn logout(&mut self, token: T) -> Result<u32, T> {
        let Some(conn) = self.live_connections().first().copied() else {
            return Err(token);
        };
        Ok(
            self.send_immediate(conn, token, Kind::Logout, |itt, cmd_sn, exp_stat_sn| {
                Bhs::LogoutRequest(LogoutRequest {
                    immediate: true,
                    reason: 0,
                    itt,
                    cid: 0,
                    cmd_sn,
                    exp_stat_sn,
                })
            }),
        )
    }

    fn note_target_sns(&mut self, conn: usize, stat_sn: u32, advances: bool, exp: u32, max: u32) {
        if advances {
            let c = &mut self.conns[conn];
            let next = stat_sn.wrapping_add(1);
            if sn_gt(next, c.exp_stat_sn) {
                c.exp_stat_sn = next;
            }
        }
        // RFC 7143 §4.2.2.1: MaxCmdSN < ExpCmdSN - 1 means the values are to be ignored.
        if sn_lt(max, exp.wrapping_sub(1)) {
            return;
        }
        if sn_gt(exp, self.exp_cmd_sn) {
            self.exp_cmd_sn = exp;
        }
        if sn_gt(max, self.max_cmd_sn) {
            self.max_cmd_sn = max;
        }
    }

    fn finish(&mut self, itt: u32, result: Result<Reply, TaskError>) {
        if let Some(t) = self.tasks.remove(&itt) {
            self.actions.push(Action::Complete {
                token: t.token,
                result,
            });
        }
    }

    fn scsi_task(&mut self, conn: usize, itt: u32, what: &str) -> Result<&mut Task<T>, ConnError> {
        match self.tasks.get_mut(&itt) {
            Some(t) if t.conn == Some(conn) && matches!(t.kind, Kind::Scsi { .. }) => Ok(t),
            _ => Err(perr(format!("{what} for unknown ITT 0x{itt:08x}"))),
        }
    }

    /// A notice from connection `conn`'s datamover. An error ends the connection: the
    /// target broke the protocol, or the notice says the connection is gone.
    pub fn on_notice(&mut self, conn: usize, notice: InitiatorNotice) -> Result<(), ConnError> {
        match notice {
            InitiatorNotice::Status { pdu, read } => self.on_status(conn, pdu.bhs, pdu.data, read),
            InitiatorNotice::Control(pdu) => self.on_pdu(conn, pdu.bhs, pdu.data),
            InitiatorNotice::Window {
                exp_cmd_sn,
                max_cmd_sn,
            } => {
                self.check_conn(conn)?;
                let stat_sn = self.conns[conn].exp_stat_sn;
                self.note_target_sns(conn, stat_sn, false, exp_cmd_sn, max_cmd_sn);
                self.pump();
                Ok(())
            }
            InitiatorNotice::SnackSent { what, .. } => {
                match what {
                    SnackFor::DataIn => self.recovery.data_snacks += 1,
                    SnackFor::RData => {
                        self.recovery.data_snacks += 1;
                        self.recovery.r_data_snacks += 1;
                    }
                    SnackFor::R2t => self.recovery.r2t_snacks += 1,
                    SnackFor::Status => self.recovery.status_snacks += 1,
                    SnackFor::DataAck => self.recovery.data_acks += 1,
                }
                Ok(())
            }
            InitiatorNotice::HeaderDigestDiscarded => {
                self.recovery.header_digest_discards += 1;
                Ok(())
            }
            InitiatorNotice::Stalled { itt } => {
                if self
                    .tasks
                    .get(&itt)
                    .is_some_and(|t| t.conn == Some(conn) && matches!(t.kind, Kind::Scsi { .. }))
                {
                    self.abort_to_reissue(itt);
                }
                Ok(())
            }
            InitiatorNotice::Closed(why) => Err(ConnError(why)),
        }
    }

    /// The status ending a SCSI command (a SCSI Response with `data` its sense segment, or
    /// a Data-In with status), with its read data as the datamover placed it.
    pub fn on_status(
        &mut self,
        conn: usize,
        bhs: Bhs,
        data: Bytes,
        read: Bytes,
    ) -> Result<(), ConnError> {
        self.check_conn(conn)?;
        match bhs {
            Bhs::ScsiResponse(r) => {
                self.scsi_task(conn, r.itt, "SCSI Response")?;
                self.note_target_sns(conn, r.stat_sn, true, r.exp_cmd_sn, r.max_cmd_sn);
                if r.response != 0 {
                    self.finish(r.itt, Err(TaskError::Response(r.response)));
                } else {
                    let sense = if data.len() >= 2 {
                        let n = u16::from_be_bytes([data[0], data[1]]) as usize;
                        data.slice(2..(2 + n).min(data.len()))
                    } else {
                        Bytes::new()
                    };
                    let residual = residual(r.underflow, r.overflow, r.residual);
                    let bidi = self.tasks.get(&r.itt).is_some_and(Task::is_bidi).then(|| {
                        self::residual(r.bidi_underflow, r.bidi_overflow, r.bidi_read_residual)
                    });
                    self.complete_scsi(r.itt, r.status, sense, (residual, bidi), read);
                }
            }
            Bhs::DataIn(d) if d.status_present => {
                self.scsi_task(conn, d.itt, "Data-In with status")?;
                self.note_target_sns(conn, d.stat_sn, true, d.exp_cmd_sn, d.max_cmd_sn);
                let residual = residual(d.underflow, d.overflow, d.residual);
                self.complete_scsi(d.itt, d.status, Bytes::new(), (residual, None), read);
            }
            other => {
                return Err(perr(format!(
                    "{} passed as a status",
                    other.opcode().name()
                )))
            }
        }
        self.pump();
        Ok(())
    }

    fn complete_scsi(
        &mut self,
        itt: u32,
        status: u8,
        sense: Bytes,
        (residual, bidi_read_residual): (Residual, Option<Residual>),
        mut data: Bytes,
    ) {
        if let Some(c) = self
            .tasks
            .get(&itt)
            .and_then(|t| t.conn)
            .and_then(|c| self.conns.get_mut(c))
        {
            c.completed = true;
        }
        // The data-in's own residual says how much of the read buffer was filled.
        if let Residual::Underflow(n) = bidi_read_residual.unwrap_or(residual) {
            data.truncate(data.len().saturating_sub(n as usize));
        }
        self.finish(
            itt,
            Ok(Reply::Scsi(CommandResult {
                status,
                data,
                sense,
                residual,
                bidi_read_residual,
            })),
        );
    }

    fn check_conn(&self, conn: usize) -> Result<(), ConnError> {
        match self.conns.get(conn) {
            Some(c) if c.alive => Ok(()),
            _ => Err(perr("PDU on a closed connection")),
        }
    }

    /// Any PDU that neither ends a SCSI command nor belongs to its data phases (its
    /// digests already checked by the datamover).
    pub fn on_pdu(&mut self, conn: usize, bhs: Bhs, data: Bytes) -> Result<(), ConnError> {
        self.check_conn(conn)?;
        let advances = bhs.advances_stat_sn();
        match bhs {
            Bhs::NopIn(n) => {
                self.note_target_sns(conn, n.stat_sn, advances, n.exp_cmd_sn, n.max_cmd_sn);
                if n.itt != RESERVED_TAG {
                    match self.tasks.get(&n.itt) {
                        Some(t) if matches!(t.kind, Kind::Nop) => {
                            self.finish(n.itt, Ok(Reply::Nop(data)))
                        }
                        _ => return Err(perr(format!("NOP-In for unknown ITT 0x{:08x}", n.itt))),
                    }
                } else if n.ttt != RESERVED_TAG {
                    self.answer_nop(conn, &n, data);
                }
            }
            Bhs::TaskMgmtResponse(r) => {
                self.note_target_sns(conn, r.stat_sn, advances, r.exp_cmd_sn, r.max_cmd_sn);
                if self.on_recovery_tmf_response(r.itt, r.response) {
                    self.pump();
                    return Ok(());
                }
                let Some(Task {
                    kind:
                        Kind::Tmf {
                            function,
                            ref_itt,
                            lun,
                        },
                    ..
                }) = self.tasks.get(&r.itt)
                else {
                    return Err(perr(format!(
                        "TMF response for unknown ITT 0x{:08x}",
                        r.itt
                    )));
                };
                let (function, ref_itt, lun) = (*function, *ref_itt, *lun);
                let done = r.response == tmf::RSP_COMPLETE || r.response == tmf::RSP_NO_TASK;
                if done && function == tmf::ABORT_TASK {
                    self.fail_task(ref_itt, TaskError::Aborted);
                } else if r.response == tmf::RSP_COMPLETE && function == tmf::LOGICAL_UNIT_RESET {
                    let hit: Vec<u32> = self
                        .tasks
                        .iter()
                        .filter(|(_, t)| {
                            matches!(&t.kind, Kind::Scsi { req, .. } if req.lun == lun)
                                && t.conn.is_some()
                        })
                        .map(|(i, _)| *i)
                        .collect();
                    for i in hit {
                        self.fail_task(i, TaskError::Aborted);
                    }
                }
                self.finish(r.itt, Ok(Reply::Tmf(r.response)));
            }
            Bhs::LogoutResponse(r) => {
                self.note_target_sns(conn, r.stat_sn, advances, r.exp_cmd_sn, r.max_cmd_sn);
                match self.tasks.get(&r.itt) {
                    Some(t) if matches!(t.kind, Kind::Logout) => {
                        self.finish(r.itt, Ok(Reply::Logout(r.response)))
                    }
                    _ => {
                        return Err(perr(format!(
                            "Logout response for unknown ITT 0x{:08x}",
                            r.itt
                        )))
                    }
                }
            }
            Bhs::Reject(r) => {
                self.note_target_sns(conn, r.stat_sn, advances, r.exp_cmd_sn, r.max_cmd_sn);
                // The data segment holds the rejected PDU's header.
                if let Some((op, itt)) = iscsi_wire::reject::rejected_pdu(&data) {
                    // A rejected Data-Out leaves its command to end with a response (at
                    // ErrorRecoveryLevel 1 a recovery R2T asks for its data again); a
                    // command whose immediate data failed its digest is sent again as it
                    // was (command retry); any other rejected command or request will
                    // never get a response.
                    let digest = r.reason == iscsi_wire::reject::DATA_DIGEST_ERROR;
                    if op == 0x10 {
                        // What a SNACK asked for is no longer kept (a target's retention is
                        // bounded: a 5-minute run damaging 1 PDU in 10^4 met it once): it
                        // cannot be mended in place. The connection ends, and the session's
                        // recovery (connection recovery at level 2, reinstatement with
                        // reconnect) takes its commands over.
                        return Err(perr(format!(
                            "the target refused a SNACK (Reject reason 0x{:02x}): what it asked for is no longer kept",
                            r.reason
                        )));
                    }
                    if op == 0x05 && digest {
                        self.recovery.data_out_rejects += 1;
                    }
                    if op == 0x01 && digest {
                        if self.resend_command(itt, r.reason) {
                            self.recovery.command_retries += 1;
                        }
                    } else if op != 0x05 && self.tasks.contains_key(&itt) {
                        self.fail_task(itt, TaskError::Rejected(r.reason));
                    }
                }
            }
            Bhs::AsyncMessage(a) => {
                self.note_target_sns(conn, a.stat_sn, advances, a.exp_cmd_sn, a.max_cmd_sn);
                self.actions.push(Action::Async {
                    conn,
                    event: a.event,
                });
            }
            Bhs::ScsiResponse(_) | Bhs::DataIn(_) | Bhs::R2t(_) => {
                return Err(perr(format!(
                    "{} passed as a control PDU",
                    bhs.opcode().name()
                )))
            }
            Bhs::TextResponse(t) => {
                self.note_target_sns(conn, t.stat_sn, advances, t.exp_cmd_sn, t.max_cmd_sn);
                match self.tasks.get(&t.itt) {
                    Some(task) if matches!(task.kind, Kind::Text) && t.final_ && !t.cont => {
                        self.finish(t.itt, Ok(Reply::Text(data)))
                    }
                    _ => return Err(perr("unexpected Text Response")),
                }
            }
            other => {
                return Err(perr(format!(
                    "unexpected {} from the target",
                    other.opcode().name()
                )))
            }
        }
        self.pump();
        Ok(())
    }

    fn answer_nop(&mut self, conn: usize, n: &NopIn, data: Bytes) {
        let bhs = Bhs::NopOut(NopOut {
            immediate: true,
            lun: n.lun,
            itt: RESERVED_TAG,
            ttt: n.ttt,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.conns[conn].exp_stat_sn,
        });
        self.send_pdu(conn, bhs, data);
    }

    /// ErrorRecoveryLevel ≥ 1, called at intervals after the target's ExpCmdSN was brought
    /// up to date (e.g. by answered pings): a SCSI command whose CmdSN has been the target's
    /// ExpCmdSN since the last call never reached it (the target discarded it for a digest
    /// error), and every later command waits behind it; it is sent again with its ITT and
    /// CmdSN. Returns its ITT.
    pub fn retry_lost_command(&mut self) -> Option<u32> {
        let itt = self.waiting_at_exp_cmd_sn();
        let exp = self.exp_cmd_sn;
        let stalled = self.stalled_at == Some(exp);
        self.stalled_at = itt.map(|_| exp);
        let itt = itt.filter(|_| stalled)?;
        self.stalled_at = None;
        if self.resend_command(itt, iscsi_wire::reject::PROTOCOL_ERROR) {
            self.recovery.lost_commands += 1;
        }
        Some(itt)
    }

    /// The outstanding SCSI command whose CmdSN is the target's ExpCmdSN as last heard: not
    /// received by the target yet (on its way, or lost).
    pub fn waiting_at_exp_cmd_sn(&self) -> Option<u32> {
        let exp = self.exp_cmd_sn;
        self.tasks
            .iter()
            .find(|(_, t)| {
                t.conn.is_some() && t.cmd_sn == exp && matches!(t.kind, Kind::Scsi { .. })
            })
            .map(|(itt, _)| *itt)
    }

    /// Sends a SCSI command again on its connection with its ITT and CmdSN
    /// (RFC 7143 §6.2.1), up to [`MAX_COMMAND_RETRIES`] times.
    /// True when sent again; past the bound the command fails with `reason`.
    fn resend_command(&mut self, itt: u32, reason: u8) -> bool {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return false;
        };
        let (Some(conn), Kind::Scsi { req }) = (task.conn, &task.kind) else {
            return false;
        };
        if task.retries >= MAX_COMMAND_RETRIES || !self.conns[conn].alive {
            self.fail_task(itt, TaskError::Rejected(reason));
            return false;
        }
        task.retries += 1;
        let (cmd_sn, req) = (task.cmd_sn, req.clone());
        self.actions.push(Action::Forget { conn, itt });
        self.send_command(conn, itt, cmd_sn, &req);
        true
    }

    fn fail_task(&mut self, itt: u32, err: TaskError) {
        let Some(task) = self.tasks.get(&itt) else {
            return;
        };
        if let (Some(conn), Kind::Scsi { .. }) = (task.conn, &task.kind) {
            self.actions.push(Action::Forget { conn, itt });
        }
        self.queue.retain(|&i| i != itt);
        self.finish(itt, Err(err));
    }

    /// A connection ended. With `retry`, its SCSI commands go back to the front of the
    /// queue (in CmdSN order) to be sent again once a connection is up (after session
    /// reinstatement); otherwise they fail with [`TaskError::ConnectionLost`]. Other
    /// requests on it always fail. When no connection is left and `retry` is off, queued
    /// commands fail too.
    pub fn on_connection_lost(&mut self, conn: usize, reason: &str, retry: bool) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        c.alive = false;
        let mut lost: Vec<(u32, u32, bool)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.conn == Some(conn))
            .map(|(i, t)| (*i, t.cmd_sn, matches!(t.kind, Kind::Scsi { .. })))
            .collect();
        lost.sort_by(|a, b| {
            if sn_lt(a.1, b.1) {
                std::cmp::Ordering::Less
            } else if a.1 == b.1 {
                std::cmp::Ordering::Equal
            } else {
                std::cmp::Ordering::Greater
            }
        });
        for (itt, _, scsi) in lost.iter().rev() {
            if retry && *scsi {
                self.tasks.get_mut(itt).expect("present").conn = None;
                self.queue.push_front(*itt);
            } else {
                self.finish(*itt, Err(TaskError::ConnectionLost(reason.to_string())));
            }
        }
        if !retry && self.live_connections().is_empty() {
            self.fail_all(TaskError::ConnectionLost(reason.to_string()));
        }
    }

    /// Fails every request (the session is gone).
    pub fn fail_all(&mut self, err: TaskError) {
        let all: Vec<u32> = self.tasks.keys().copied().collect();
        self.queue.clear();
        for itt in all {
            self.finish(itt, Err(err.clone()));
        }
    }
}

fn residual(under: bool, over: bool, n: u32) -> Residual {
    if under {
        Residual::Underflow(n)
    } else if over {
        Residual::Overflow(n)
    } else {
        Residual::None
    }
}

mod erl2;
use erl2::RecoveryTmf;
#[cfg(test)]
mod tests;
