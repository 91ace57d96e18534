//! The Datamover boundary of RFC 5047, as traits only: the iSCSI layers never touch a
//! socket or a queue pair. An initiator logs in over an [`InitiatorChannel`] and then
//! runs its commands through that connection's [`InitiatorDatamover`] (module
//! [`initiator`]). A target
//! listens on [`Portal`]s; each accepted connection is a
//! [`LoginChannel`] (login PDUs in and out) that switches to full feature phase and yields
//! that transport's [`Datamover`] and a stream of [`Notice`]s. In full feature phase the
//! iSCSI layer sends control PDUs with [`Datamover::send_control`], hands read data to
//! [`Datamover::put_data`], fetches write data with [`Datamover::get_data`], and receives
//! notices (control PDUs, commands with their write-data handles, connection loss).
//! The TCP implementation (crate `datamover-tcp`) turns these into Data-In, R2T and
//! Data-Out PDUs with digests; the iSER implementation turns them into RDMA Writes, Reads
//! and Sends. StatSN numbering is iSCSI-layer state ([`StatusNumbering`]: the next StatSN
//! and the status kept until ExpStatSN acknowledges it) that the iSCSI layer hands to the
//! datamover, which takes each status's number as it puts it on the wire — wire order
//! without a lock around sending; PDUs without status carry the next StatSN, and ExpCmdSN
//! and MaxCmdSN are stamped as each PDU is sent. A PDU the transport must refuse is
//! reported as [`Notice::Reject`], for the iSCSI layer to answer. [`admission`] caps the
//! connections still being set up (sorted or logging in), for portals and targets alike;
//! [`budget`] counts the memory a peer can make a connection, a session and the target hold.

pub mod admission;
pub mod budget;
pub mod conformance;
pub mod initiator;
pub mod iser_defaults;
pub mod tcp_defaults;

pub use initiator::{
    ClosedFuture, CommandOut, ConnectSettings, Connector, InitiatorDatamover, InitiatorFfpConfig,
    InitiatorNotice, IserProvider, NoticeSink, RegistrationStats, Resume, SnackFor,
};

use async_trait::async_trait;
use bytes::Bytes;
pub use iscsi_login::params::TransportKind;
use iscsi_session::WriteLimits;
use iscsi_wire::{Digests, Pdu};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;
use tokio::sync::mpsc;

/// Login and text PDUs longer than this are refused (the RFC default
/// MaxRecvDataSegmentLength is 8 KiB; continuation carries longer text).
pub const LOGIN_MAX_DATA: u32 = 64 * 1024;

/// Why a datamover operation failed: the connection is gone or the task was aborted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmError {
    #[error("connection closed")]
    Closed,
    #[error("task aborted")]
    Aborted,
    /// The initiator's write data broke the rules (DataSN, offset, length): the iSCSI layer
    /// Rejects the offending PDU (`raw_bhs`, its header as received) and then ends the
    /// command with CHECK CONDITION, in that order on the wire.
    #[error("data-out protocol error: {why}")]
    DataPhase { why: String, raw_bhs: [u8; 48] },
    /// A SNACK asked for what this connection cannot resend (never sent, acknowledged,
    /// or a transport without recovery): the iSCSI layer Rejects the SNACK.
    #[error("{0}")]
    NotRetained(String),
    /// The memory a command needs could not be reserved in time (the connection's, the
    /// session's or the target's budget is held by other commands): the iSCSI layer ends
    /// the command with TASK SET FULL, unexecuted.
    #[error("{0}")]
    OverBudget(String),
}

/// The session's command window as the initiator should see it, shared by all of the
/// session's connections and read when each PDU is stamped.
#[derive(Debug, Default)]
pub struct CmdSnState(AtomicU64);

impl CmdSnState {
    pub fn new(exp_cmd_sn: u32, max_cmd_sn: u32) -> Arc<Self> {
        let s = Arc::new(CmdSnState::default());
        s.store(exp_cmd_sn, max_cmd_sn);
        s
    }
    pub fn store(&self, exp_cmd_sn: u32, max_cmd_sn: u32) {
        self.0.store(
            ((exp_cmd_sn as u64) << 32) | max_cmd_sn as u64,
            Ordering::Release,
        );
    }
    /// (ExpCmdSN, MaxCmdSN)
    pub fn load(&self) -> (u32, u32) {
        let v = self.0.load(Ordering::Acquire);
        ((v >> 32) as u32, v as u32)
    }
}

/// Identity of a task whose data moves: what Data-In/R2T headers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRef {
    pub itt: u32,
    /// The LUN field as it appeared on the wire.
    pub lun: u64,
}

/// A connection's StatSN numbering (`iscsi_session::StatusSeq`, keeping each status as a
/// PDU for resending), owned by the iSCSI layer and shared with the connection's datamover:
/// the datamover numbers each status-bearing PDU as it sends it; the iSCSI layer
/// acknowledges with the initiator's ExpStatSN.
pub type StatusNumbering = Arc<std::sync::Mutex<iscsi_session::StatusSeq<Pdu>>>;

/// Numbering that starts at `next` (the StatSN after the last Login Response).
pub fn status_numbering(next: u32) -> StatusNumbering {
    Arc::new(std::sync::Mutex::new(iscsi_session::StatusSeq::new(next)))
}

/// Status sent in the last Data-In (phase collapse) instead of a SCSI Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollapsedStatus {
    pub status: u8,
    pub overflow: bool,
    pub underflow: bool,
    pub residual: u32,
}

/// A received PDU with its original 48 header bytes (a Reject must echo them exactly).
#[derive(Debug, Clone)]
pub struct InPdu {
    pub pdu: Pdu,
    pub raw_bhs: [u8; 48],
}

/// Write data being collected for one command; redeemed with [`Datamover::get_data`].
#[derive(Debug)]
pub struct WriteHandle {
    pub itt: u32,
    pub expected_len: u32,
}

/// What the datamover tells the iSCSI layer.
#[derive(Debug)]
pub enum Notice {
    /// A SCSI Command (its data segment already moved into `write` when it has one).
    Command {
        pdu: InPdu,
        write: Option<WriteHandle>,
    },
    /// Any other PDU from the initiator.
    Control(InPdu),
    /// A PDU the transport refused (its header as received): the iSCSI layer answers with
    /// a Reject of `reason`. (Refused write data of a command is reported to that command
    /// instead, as [`DmError::DataPhase`], so the Reject precedes its status.)
    Reject {
        reason: u8,
        raw_bhs: [u8; 48],
        why: String,
    },
    /// The connection ended (peer closed, I/O error, protocol or digest error).
    Closed(String),
}

/// The operations the iSCSI layer uses to move data and control PDUs.
#[async_trait]
pub trait Datamover: Send + Sync {
    /// Send a control PDU (response, NOP-In, Text, Logout, Reject, Async, TMF response);
    /// a status-bearing one is numbered from the connection's [`StatusNumbering`] as sent.
    async fn send_control(&self, pdu: Pdu) -> Result<(), DmError>;
    /// Deliver read data for `task`, optionally with collapsed status. `note` is what a
    /// buffer this datamover lent ([`Datamover::read_buffers`]) noted while it was filled
    /// (a [`storage::BufNote`]: the data's digests, or where it lies in registered memory);
    /// a kind of note the transport has no use for is ignored. Returns the number of data
    /// PDUs used (for ExpDataSN).
    async fn put_data(
        &self,
        task: TaskRef,
        data: Bytes,
        note: Option<storage::BufNote>,
        status: Option<CollapsedStatus>,
    ) -> Result<u32, DmError>;
    /// Deliver a bidirectional command's read data, its data PDUs numbered from
    /// `first_data_sn` (they share one sequence with the command's R2Ts); its status follows
    /// in a SCSI Response. Returns the number of data PDUs used. A transport without data
    /// sequence numbers (RDMA Writes) places the data as [`Datamover::put_data`] does.
    async fn put_bidi_data(
        &self,
        task: TaskRef,
        data: Bytes,
        first_data_sn: u32,
    ) -> Result<u32, DmError> {
        let _ = first_data_sn;
        self.put_data(task, data, None, None).await
    }
    /// The buffers this connection lends for read data, when it has a use for them (the
    /// TCP datamover with data digests computes them in the backend's copy; an RDMA one
    /// lends registered memory); `None`: plain buffers will do.
    fn read_buffers(&self) -> Option<Arc<dyn storage::ReadBufSource>>;
    /// Collect all write data of a command (soliciting what was not sent unsolicited).
    /// Returns the data and the number of R2Ts used.
    async fn get_data(&self, task: TaskRef, write: WriteHandle) -> Result<(Bytes, u32), DmError>;
    /// ErrorRecoveryLevel ≥ 1, a Data/R2T SNACK: resend the Data-In PDUs (a read) or the
    /// outstanding R2Ts (a write) of task `itt` numbered `beg_run`, `run_length` of them
    /// (0: all from `beg_run`), as first sent but for ExpCmdSN and MaxCmdSN.
    async fn resend_data(&self, itt: u32, beg_run: u32, run_length: u32) -> Result<(), DmError> {
        let _ = (itt, beg_run, run_length);
        Err(DmError::NotRetained(
            "this transport runs at ErrorRecoveryLevel 0".into(),
        ))
    }
    /// ErrorRecoveryLevel ≥ 1, an R-Data SNACK (the initiator changed its
    /// MaxRecvDataSegmentLength and drops what it has not acknowledged): resend the read
    /// `itt`'s Data-In from the last DataACK on, cut for the current
    /// [`Datamover::set_max_send_data_segment_length`] and numbered from that DataACK's
    /// BegRun (0 without one), then its status again as a SCSI Response carrying
    /// `snack_tag`, with its StatSN unchanged.
    async fn resegment_data(&self, itt: u32, snack_tag: u32) -> Result<(), DmError> {
        let _ = (itt, snack_tag);
        Err(DmError::NotRetained(
            "this transport does not cut data by MaxRecvDataSegmentLength".into(),
        ))
    }
    /// The initiator declared a new MaxRecvDataSegmentLength in full feature phase (a Text
    /// negotiation): data PDUs sent from now on are cut to it. Transports whose data
    /// moves otherwise (RDMA) ignore it.
    fn set_max_send_data_segment_length(&self, len: u32) {
        let _ = len;
    }
    /// ErrorRecoveryLevel ≥ 1, a DataACK SNACK: the initiator has every Data-In before
    /// DataSN `beg_run` of the read whose acknowledgement request (A bit) carried `ttt`; they
    /// need not be kept for Data SNACK any more. A tag that names no kept read is ignored
    /// (its status may have been acknowledged first).
    fn data_acked(&self, ttt: u32, beg_run: u32) {
        let _ = (ttt, beg_run);
    }
    /// ErrorRecoveryLevel ≥ 1: the initiator acknowledged statuses (its ExpStatSN moved
    /// on, or they were dropped from retention): what was kept to resend with them (read
    /// data for Data SNACK) may go now, not only when the next read is sent, as its room in
    /// the budget may be what that read waits for.
    fn status_acknowledged(&self) {}
    /// ErrorRecoveryLevel ≥ 1, a Status SNACK: send a retained status PDU again with its
    /// StatSN unchanged (ExpCmdSN and MaxCmdSN current).
    async fn resend_status(&self, pdu: Pdu) -> Result<(), DmError> {
        let _ = pdu;
        Err(DmError::NotRetained(
            "this transport runs at ErrorRecoveryLevel 0".into(),
        ))
    }
    /// ErrorRecoveryLevel 2, a write reassigned to this connection (TASK REASSIGN): sets up
    /// the collection of all `expected_len` bytes of task `task`, every byte asked for by
    /// R2T (the initiator sends no unsolicited data for a reassigned task), redeemed with
    /// [`Datamover::get_data`].
    fn solicit_write(&self, task: TaskRef, expected_len: u32) -> Result<WriteHandle, DmError> {
        let _ = (task, expected_len);
        Err(DmError::NotRetained(
            "this transport runs at ErrorRecoveryLevel 0".into(),
        ))
    }
    /// Forget a task's pending write data (task management abort).
    fn abort_task(&self, itt: u32);
    /// Forget all a command holds here (its write data, and what a transport kept to
    /// answer it): the iSCSI layer will not run it (a discovery session, out of the CmdSN
    /// window, too many immediate commands) and sends it no response.
    fn forget_command(&self, itt: u32) {
        self.abort_task(itt);
    }
    /// Close the connection after everything queued has been sent.
    fn close(&self);
    /// Close the connection after a Logout Response: the initiator, which closes its end
    /// when it has the response, may be given a moment to close first.
    fn close_after_logout(&self) {
        self.close()
    }
}

/// What full feature phase needs to know of a connection's negotiated parameters.
#[derive(Debug, Clone)]
pub struct FfpConfig {
    /// Header and data digests (iSCSI/TCP only; transports without digests ignore them).
    pub digests: Digests,
    /// Largest data segment we accept (our declared MaxRecvDataSegmentLength).
    pub max_recv_data_segment_length: u32,
    /// Largest data segment the peer accepts (its declared value).
    pub max_send_data_segment_length: u32,
    pub max_burst_length: u32,
    pub write_limits: WriteLimits,
    /// The connection's StatSN numbering (the iSCSI layer's), taken from as status is sent.
    pub status: StatusNumbering,
    /// Largest Expected Data Transfer Length of a write we buffer.
    pub max_write_len: u32,
    /// The session's ErrorRecoveryLevel: at 1 and above a digest error is mended in place
    /// (the PDU discarded, a Reject, a recovery R2T for lost write data) instead of ending
    /// the connection. Transports without digests ignore it.
    pub error_recovery_level: u8,
    /// Where the transport counts the recovery events it handles (shared with the iSCSI
    /// layer, which counts the SNACKs it answers).
    pub recovery: Arc<RecoveryCounters>,
    /// This connection's memory account (its parents are the session's and the target's):
    /// write buffers are reserved in it before they are allocated.
    pub budget: Arc<budget::Budget>,
    pub timeouts: PeerTimeouts,
}

/// How long a peer may keep a connection's resources without making progress.
#[derive(Debug, Clone, Copy)]
pub struct PeerTimeouts {
    /// A write whose data was asked for (R2T) gets none for this long: at
    /// ErrorRecoveryLevel 0 the connection is dropped (its tasks end with it); above, what
    /// is missing is asked for again, and after this long again without data it is dropped.
    /// Over iSER an RDMA Read unanswered this long drops the connection at any level.
    pub data_out: std::time::Duration,
    /// The peer accepts none of what is sent to it for this long (its receive window stays
    /// shut; over iSER, none of the Sends and RDMA Writes queued for it complete): the
    /// connection is dropped, whatever the peer keeps sending.
    pub send_stall: std::time::Duration,
    /// How long a command may wait for memory to be given back before it is refused with
    /// TASK SET FULL.
    pub budget_wait: std::time::Duration,
}

impl Default for PeerTimeouts {
    fn default() -> Self {
        PeerTimeouts {
            data_out: std::time::Duration::from_secs(30),
            send_stall: std::time::Duration::from_secs(30),
            budget_wait: std::time::Duration::from_secs(5),
        }
    }
}

/// Error recovery events on one connection (ErrorRecoveryLevel ≥ 1), for the logs.
#[derive(Debug, Default)]
pub struct RecoveryCounters {
    /// PDUs discarded for a header digest error.
    pub header_digest_discards: AtomicU64,
    /// PDUs discarded for a data digest error (each answered with a Reject).
    pub data_digest_rejects: AtomicU64,
    /// Recovery R2Ts sent for write data that was lost.
    pub recovery_r2ts: AtomicU64,
    /// Status SNACKs answered by resending status.
    pub status_snacks: AtomicU64,
    /// Data/R2T SNACKs answered by resending Data-In or R2Ts.
    pub data_snacks: AtomicU64,
    /// DataACK SNACKs received.
    pub data_acks: AtomicU64,
    /// Tasks reassigned to this connection by TASK REASSIGN (ErrorRecoveryLevel 2).
    pub task_reassigns: AtomicU64,
}

impl RecoveryCounters {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        Self::add(counter, 1);
    }

    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Every event counted so far, as `name=N` pairs (empty when nothing happened).
    pub fn summary(&self) -> String {
        [
            ("header_digest_discards", &self.header_digest_discards),
            ("data_digest_rejects", &self.data_digest_rejects),
            ("recovery_r2ts", &self.recovery_r2ts),
            ("status_snacks", &self.status_snacks),
            ("data_snacks", &self.data_snacks),
            ("data_acks", &self.data_acks),
            ("task_reassigns", &self.task_reassigns),
        ]
        .iter()
        .map(|(name, c)| (name, c.load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// Why the login phase could not read the next PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginRecvError {
    #[error("peer closed during login")]
    Closed,
    #[error("connection error: {0}")]
    Io(String),
    #[error("bad PDU during login: {0}")]
    Bad(String),
}

/// The initiator's end of a connection before full feature phase: PDUs one at a time
/// (login, and a discovery session's text exchange and logout), then the switch to full
/// feature phase that yields this transport's [`InitiatorDatamover`]. `digests` are what
/// the login negotiated (transports without digests ignore them).
#[async_trait]
pub trait InitiatorChannel: Send {
    /// The transport this connection runs over (login offers its keys).
    fn kind(&self) -> TransportKind;
    /// The connection's socket, where it has one (for TCP_INFO sampling).
    fn socket(&self) -> Option<BorrowedFd<'_>>;
    async fn send(&mut self, pdu: &Pdu, digests: Digests) -> std::io::Result<()>;
    async fn recv(&mut self, digests: Digests, max_data: u32) -> Result<InPdu, LoginRecvError>;
    /// The target refused the login, and both ends now close the connection (RFC 7143
    /// 11.13.5): a transport whose target may still be finishing that answer lets it close
    /// first here, bounded. By default nothing: TCP's close handshake covers it.
    async fn let_target_close(&mut self) {}
    /// Enters full feature phase: from now on what arrives goes to `sink`.
    fn into_full_feature(
        self: Box<Self>,
        cfg: InitiatorFfpConfig,
        sink: NoticeSink,
    ) -> Arc<dyn InitiatorDatamover>;
}

/// A connection in the login phase: login PDUs in and out (no digests), then the switch
/// to full feature phase that yields this transport's datamover.
#[async_trait]
pub trait LoginChannel: Send {
    /// The transport this connection runs over (login negotiation answers its keys).
    fn kind(&self) -> TransportKind;
    fn peer(&self) -> SocketAddr;
    /// The connection's socket, where it has one (for TCP_INFO sampling).
    fn socket(&self) -> Option<BorrowedFd<'_>>;
    /// The next PDU from the initiator.
    async fn recv(&mut self) -> Result<InPdu, LoginRecvError>;
    /// The runtime this connection's login and full feature phase should run on, where the
    /// transport has one of its own (the software RNIC's reactor thread: its commands then
    /// never leave the thread its completions arrive on); None: the caller's.
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        None
    }
    /// Sends a login-phase PDU (a Login Response).
    async fn send(&mut self, pdu: &Pdu) -> std::io::Result<()>;
    /// The largest data segment of a control PDU (NOP-In, Text) the initiator can receive,
    /// whatever it declared, where the transport knows a smaller bound than the declared one
    /// (iSER: Linux sizes its receive buffers for control PDUs alone); by default none.
    fn control_data_max(&self) -> u32 {
        u32::MAX
    }
    /// Enters full feature phase with the negotiated parameters and the session's command
    /// window (read when each PDU is stamped).
    fn into_full_feature(
        self: Box<Self>,
        cfg: FfpConfig,
        sn: Arc<CmdSnState>,
    ) -> (Arc<dyn Datamover>, mpsc::Receiver<Notice>);
}

/// A listening endpoint of one transport kind.
#[async_trait]
pub trait Portal: Send + Sync {
    fn kind(&self) -> TransportKind;
    /// What the portal serves, for people ("iSCSI/TCP", "iSER", ...).
    fn describe(&self) -> String {
        match self.kind() {
            TransportKind::Tcp => "iSCSI/TCP".into(),
            TransportKind::Iser => "iSER".into(),
        }
    }
    /// The address actually bound.
    fn local_addr(&self) -> SocketAddr;
    /// Waits for the next connection; with `trace`, its bytes are recorded from the start.
    async fn accept(
        &self,
        trace: Option<&pcap_trace::PduTrace>,
    ) -> std::io::Result<Box<dyn LoginChannel>>;
}

/// Makes an iSCSI/TCP login channel of a TCP connection accepted elsewhere (its bytes traced
/// into the trace when given): what a portal that shares its port with iSCSI/TCP is handed to
/// serve the connections that turn out to speak it.
pub type TcpLoginChannels = Arc<
    dyn Fn(
            tokio::net::TcpStream,
            Option<&pcap_trace::PduTrace>,
        ) -> std::io::Result<Box<dyn LoginChannel>>
        + Send
        + Sync,
>;

/// Called with every accepted connection's socket and peer; what it returns is dropped
/// when the connection ends (e.g. a TCP_INFO sampler).
pub type ConnectionObserver =
    Arc<dyn Fn(BorrowedFd<'_>, SocketAddr) -> Option<Box<dyn Send>> + Send + Sync + 'static>;
