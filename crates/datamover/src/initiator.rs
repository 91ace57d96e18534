//! The initiator's side of the seam. The session core builds every PDU it sends (SCSI
//! Commands with their immediate data, unsolicited Data-Out, NOP-Out, task management,
//! logout) and hands them to a connection's [`InitiatorDatamover`]; a SCSI Command goes as
//! a [`CommandOut`], together with the data it writes and the length it reads, so the
//! transport can move the rest: TCP answers R2Ts with Data-Out and places Data-In; iSER
//! advertises the buffers for the target's RDMA Reads and Writes. What arrives comes back as
//! [`InitiatorNotice`]s through a [`NoticeSink`]: a command's status with its read data
//! already placed, every other PDU from the target, the command window carried by PDUs the
//! transport consumed, and the connection's end.

use bytes::Bytes;
use iscsi_wire::{Digests, Pdu};
use std::sync::Arc;

/// What [`InitiatorDatamover::when_closed`] returns.
pub type ClosedFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A SCSI Command to send, with what its data phases need.
#[derive(Debug, Clone)]
pub struct CommandOut {
    /// The SCSI Command PDU (Extended CDB AHS, immediate data), numbered by the core.
    pub pdu: Pdu,
    /// All the data the command writes (empty for none). The transport moves bytes
    /// `solicited_from..` when the target asks for them.
    pub write: Bytes,
    /// Where solicited write data begins (what precedes it went immediate or unsolicited).
    pub solicited_from: u32,
    /// Bytes of read data the command expects (0 for none).
    pub read_len: u32,
}

/// What a connection's datamover tells the session core.
#[derive(Debug)]
pub enum InitiatorNotice {
    /// A PDU that ends a SCSI command (a SCSI Response, or a Data-In carrying status), with
    /// the command's read data as placed: `read_len` bytes, where bytes the target never sent
    /// read as zeros (the core shortens it by an underflow residual); empty for a command
    /// that reads nothing or that the transport no longer knows.
    Status { pdu: Pdu, read: Bytes },
    /// Any other PDU from the target (NOP-In, responses to task management, logout and
    /// text, Reject, Asynchronous Message).
    Control(Pdu),
    /// ExpCmdSN and MaxCmdSN from PDUs the transport consumed itself (Data-In without
    /// status, R2T): the command window may have opened.
    Window { exp_cmd_sn: u32, max_cmd_sn: u32 },
    /// ErrorRecoveryLevel ≥ 1: the transport asked the target for something again with a
    /// SNACK: `run_length` of `what` from `beg_run` (0: all from it), for command `itt`
    /// (reserved for a Status SNACK). For the session's recovery counters and log (the
    /// transport itself keeps every ExpStatSN it sends below a status still missing).
    SnackSent {
        what: SnackFor,
        itt: u32,
        beg_run: u32,
        run_length: u32,
    },
    /// ErrorRecoveryLevel ≥ 1: a PDU whose header digest failed was discarded (by the
    /// length its header claims); what it carried is asked for again once a gap shows.
    HeaderDigestDiscarded,
    /// ErrorRecoveryLevel ≥ 1: a command that went through a recovery (its Data-Out was
    /// Rejected, or it was reassigned here) has heard nothing for long, and SNACKs did not
    /// help: the target lost track of it. The datamover has dropped its state; the session
    /// aborts it and sends it again as a new task.
    Stalled { itt: u32 },
    /// The connection ended (the target closed it, an I/O error, or a protocol or digest
    /// error from the target); no notice follows.
    Closed(String),
}

/// What a SNACK asks for again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnackFor {
    /// Data-In, by DataSN (a Data SNACK).
    DataIn,
    /// R2Ts, by R2TSN (an R2T SNACK).
    R2t,
    /// Statuses, by StatSN (a Status SNACK).
    Status,
    /// Nothing: a DataACK, the answer to a Data-In's acknowledgement request (A bit).
    DataAck,
    /// All of a read's unacknowledged Data-In, cut anew (an R-Data SNACK, after our
    /// MaxRecvDataSegmentLength changed).
    RData,
}

/// Where a connection's notices go: called from the transport's receiving task with a batch
/// (drained by the callee), never while the transport holds a lock of its own.
pub type NoticeSink = Arc<dyn Fn(&mut Vec<InitiatorNotice>) + Send + Sync>;

/// What full feature phase needs of a connection's negotiated parameters.
#[derive(Debug, Clone, Copy)]
pub struct InitiatorFfpConfig {
    /// Header and data digests (iSCSI/TCP only; transports without digests ignore them).
    pub digests: Digests,
    /// Largest data segment we accept (our declared MaxRecvDataSegmentLength).
    pub max_recv_data_segment_length: u32,
    /// Largest data segment the target accepts (its declared value).
    pub max_send_data_segment_length: u32,
    /// The session's MaxBurstLength: no solicitation may ask for more.
    pub max_burst_length: u32,
    /// The StatSN expected next (after the last Login Response).
    pub exp_stat_sn: u32,
    /// iSER: the unexpected PDUs (unsolicited Data-Out, NOP-Out, task management, logout,
    /// text) the target can take at once, as it declared (MaxOutstandingUnexpectedPDUs; 0 =
    /// no limit). iWARP has no receiver-not-ready retry: a Send beyond the target's posted
    /// receives ends the connection.
    pub max_outstanding_unexpected_pdus: u32,
    /// The session's ErrorRecoveryLevel: at 1 and above a Data-In that fails its data
    /// digest is discarded and asked for again with a Data SNACK (iSCSI/TCP).
    pub error_recovery_level: u8,
}

/// ErrorRecoveryLevel 2: how far a command got on a failed connection, which TASK
/// REASSIGN's ExpDataSN tells the target, and what of its read data is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// A write: the R2TSN after the highest R2T received (R2Ts from it on never arrived).
    /// A read: the DataSN after the Data-In acknowledged by a DataACK (the target may have
    /// let them go, and resends from here), 0 when none was.
    pub exp_data_sn: u32,
    /// A read: its bytes from offset 0 up to the end of the Data-In acknowledged.
    pub read_prefix: Bytes,
}

/// Write data a transport registered in place for the target's RDMA Reads (iSER): how often
/// a registration made for an earlier command served again, and how often one was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistrationStats {
    pub hits: u64,
    pub misses: u64,
}

impl RegistrationStats {
    /// Field by field sum (over connections and sessions).
    pub fn plus(self, o: RegistrationStats) -> RegistrationStats {
        RegistrationStats {
            hits: self.hits + o.hits,
            misses: self.misses + o.misses,
        }
    }
    /// What happened since `before` (counters of the same connections).
    pub fn since(self, before: RegistrationStats) -> RegistrationStats {
        RegistrationStats {
            hits: self.hits.saturating_sub(before.hits),
            misses: self.misses.saturating_sub(before.misses),
        }
    }
}

/// The operations the initiator's session core uses on one connection in full feature
/// phase. None blocks: each queues for the transport's sending side.
pub trait InitiatorDatamover: Send + Sync {
    /// Sends a SCSI Command and takes charge of its data phases until its status arrives
    /// (reported as [`InitiatorNotice::Status`]).
    fn send_command(&self, cmd: CommandOut);
    /// ErrorRecoveryLevel 2: takes charge of the data phases of a command sent on another
    /// connection and reassigned to this one (a TASK REASSIGN follows), without sending it:
    /// its write data goes as the target asks by R2T (from `solicited_from`, which is 0), the
    /// R2Ts numbered from `resume.exp_data_sn`; its read data is placed again from
    /// `resume.exp_data_sn` on, after the bytes `resume.read_prefix` keeps. Transports that
    /// run only at level 0 (iSER) never get one.
    fn adopt(&self, cmd: CommandOut, resume: Resume) {
        let _ = (cmd, resume);
    }
    /// ErrorRecoveryLevel 2: how far command `itt` got on this connection, for TASK
    /// REASSIGN's ExpDataSN ([`Resume`]; the default for a transport without R2Ts or
    /// DataACKs).
    fn resume_point(&self, itt: u32) -> Resume {
        let _ = itt;
        Resume::default()
    }
    /// Sends any other PDU (Data-Out of unsolicited data, NOP-Out, task management, logout).
    fn send_control(&self, pdu: Pdu);
    /// Drops a command's data-phase state (it was aborted or rejected): data the target
    /// still sends for it is discarded.
    fn forget(&self, itt: u32);
    /// ErrorRecoveryLevel ≥ 1, called on the session's recovery tick (a quarter second):
    /// a transport that can lose PDUs to header digest errors asks again for what a stalled
    /// command still waits for (an R2T SNACK for a write the target still owes R2Ts; Data-In
    /// or statuses whose SNACK or answer was lost too). Returns the notices of what it did,
    /// and whether a command is stalled (the session then pings: the answer's StatSN shows
    /// a lost status).
    fn probe(&self) -> (Vec<InitiatorNotice>, bool) {
        (Vec::new(), false)
    }
    /// Our MaxRecvDataSegmentLength changes to `len` by a Text negotiation in full feature
    /// phase: before the target answers (`settled` false) the transport accepts segments of
    /// the old and the new size, after it only the new; read data cut the old way that must
    /// be asked for again then takes an R-Data SNACK. Transports without data segments
    /// (iSER) ignore it.
    fn set_max_recv_data_segment_length(&self, len: u32, settled: bool) {
        let _ = (len, settled);
    }
    /// The registration cache's counters ([`RegistrationStats`]); zeros for a transport that
    /// registers no memory (TCP hands the caller's bytes to the socket as they are).
    fn write_registrations(&self) -> RegistrationStats {
        RegistrationStats::default()
    }
    /// Closes the connection once everything queued has been sent.
    fn close(&self);
    /// Closes the connection after a successful logout: a target that closes its end once its
    /// Logout Response is sent may be given a moment to close first.
    fn close_after_logout(&self) {
        self.close()
    }
    /// Resolves once a [`close`](Self::close) has run its course on the wire, so that a
    /// process may exit without cutting it short (iSER's close is a handshake the RNIC runs
    /// after the last Send; TCP's is the kernel's and needs no wait).
    fn when_closed(&self) -> ClosedFuture {
        Box::pin(std::future::ready(()))
    }
    /// Drops the connection now, sending nothing more and reporting nothing more.
    fn abort(&self);
}

/// The RDMA provider an `iser://` connection runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IserProvider {
    /// ironsan's software iWARP RNIC in this process (over the kernel's TCP).
    #[default]
    Software,
    /// The first device rdma-core reports (libibverbs/librdmacm: Linux siw or a hardware RNIC);
    /// only in a build with the `rdma-core` feature.
    RdmaCore,
}

impl std::str::FromStr for IserProvider {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "software" => Ok(IserProvider::Software),
            "rdma-core" => Ok(IserProvider::RdmaCore),
            _ => Err(format!(
                "unknown RDMA provider '{s}': say software or rdma-core"
            )),
        }
    }
}

/// How an initiator's connection is opened: the session's settings a transport reads.
#[derive(Clone, Copy)]
pub struct ConnectSettings<'a> {
    /// The whole connect (iSER: address resolution and the MPA exchange too) ends by then.
    pub timeout: std::time::Duration,
    /// Where an iSCSI/TCP connection's bytes are recorded.
    pub trace: Option<&'a pcap_trace::PduTrace>,
    /// What an iSER connection runs on.
    pub iser_provider: IserProvider,
    /// iSER: the target may end a command with Send with Invalidate of its STag.
    pub iser_remote_invalidation: bool,
    /// iSER on the software RNIC: how long its engine polls on after its last work.
    pub iser_poll: std::time::Duration,
    /// iSCSI/TCP: how long the connection's reader polls its socket after each PDU.
    pub tcp_poll: std::time::Duration,
}

/// Opens an initiator's connections, of whatever transport is asked for: the initiator is
/// handed one by whoever composes it with the transports, and sees only the
/// [`crate::InitiatorChannel`] it yields.
#[async_trait::async_trait]
pub trait Connector: Send + Sync {
    /// A connection of `transport` to `addr` (`host:port`), ready for login; the error says
    /// why not in one line.
    async fn connect(
        &self,
        transport: crate::TransportKind,
        addr: &str,
        settings: &ConnectSettings<'_>,
    ) -> Result<Box<dyn crate::InitiatorChannel>, String>;
}
