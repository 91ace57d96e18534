//! One SCSI command as the transport hands it over, the response it gets back, and how a
//! response is assembled from a command's outcome (residuals against the transport's
//! expected length). Everything above (tasks, LUNs, the device) speaks these types.

use std::sync::Arc;

use bytes::Bytes;

use crate::status;

/// Identity of an I_T nexus (for iSCSI: one session), allocated by the runtime.
/// Reservations, unit attentions and PREVENT state are kept per nexus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NexusId(pub u64);

/// SAM task attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    Untagged,
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

/// Residual of the transfer, comparing what the CDB asked for (SPDTL) with the
/// transport's expected data transfer length (EDTL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    None,
    /// EDTL exceeded what was transferred by this many bytes.
    Underflow(u32),
    /// The command wanted this many bytes more than EDTL allowed.
    Overflow(u32),
}

/// One SCSI command as the transport received it.
#[derive(Debug, Clone)]
pub struct Command {
    pub nexus: NexusId,
    pub lun: u64,
    /// The CDB (6..260 bytes; a transport may pad a short CDB to 16 bytes).
    pub cdb: Bytes,
    pub attr: TaskAttr,
    /// Transport task tag (iSCSI ITT), used by [`crate::Device::abort_task`].
    pub tag: u64,
    /// Expected data transfer length from the transport.
    pub expected_len: u32,
    /// The transport will accept data-in (iSCSI R bit).
    pub read: bool,
    /// The initiator sent data-out (iSCSI W bit).
    pub write: bool,
    /// All data-out the initiator sent (length <= `expected_len`).
    pub data_out: Bytes,
    /// A bidirectional command's expected data-in length (iSCSI's Bidirectional Expected
    /// Read-Data Length AHS); `expected_len` is then its data-out length.
    pub bidi_read_len: Option<u32>,
    /// Where READ data is produced, when the transport lends buffers: the backend reads
    /// into one, and what the buffer noted comes back in [`Response::data_in_note`].
    pub read_buffers: Option<std::sync::Arc<dyn storage::ReadBufSource>>,
}

/// The outcome of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u8,
    /// Raw sense bytes (CHECK CONDITION only).
    pub sense: Option<Bytes>,
    /// Data-in, already truncated to `expected_len` (empty unless `Command::read`).
    pub data_in: Bytes,
    /// What the lent read buffer noted (see [`Command::read_buffers`]), when `data_in`
    /// is exactly what was read into it (no cut made the note stale).
    pub data_in_note: Option<storage::BufNote>,
    pub residual: Residual,
    /// A bidirectional command's data-in residual (`residual` is then its data-out's);
    /// `None` for any other command.
    pub bidi_read_residual: Option<Residual>,
    /// The task was aborted by task management: the transport must not send this.
    pub aborted: bool,
}

impl Response {
    /// The response of a command that ended without data: `status` (with `sense`), no
    /// data-in, no residual. A transport answers a command that never reached its logical
    /// unit with it too (TASK SET FULL, a data phase error).
    pub fn unexecuted(status: u8, sense: Option<Bytes>) -> Self {
        Response {
            status,
            sense,
            data_in: Bytes::new(),
            data_in_note: None,
            residual: Residual::None,
            bidi_read_residual: None,
            aborted: false,
        }
    }

    pub(crate) fn aborted() -> Self {
        Response {
            status: status::TASK_ABORTED,
            sense: None,
            data_in: Bytes::new(),
            data_in_note: None,
            residual: Residual::None,
            bidi_read_residual: None,
            aborted: true,
        }
    }
}

/// What the device knows about an I_T nexus.
#[derive(Debug, Clone)]
pub(crate) struct NexusInfo {
    /// Initiator port name, e.g. "iqn.1994-05.com.example:host,i,0x23d000000001".
    pub port: Arc<str>,
    /// TransportID for PERSISTENT RESERVE IN READ FULL STATUS.
    pub transport_id: Bytes,
    /// The relative target port identifier of the device the nexus reaches it through.
    pub rel_port: u16,
}

pub(crate) fn residual(wanted: u64, edtl: u64) -> Residual {
    if wanted > edtl {
        Residual::Overflow((wanted - edtl).min(u32::MAX as u64) as u32)
    } else if wanted < edtl {
        Residual::Underflow((edtl - wanted) as u32)
    } else {
        Residual::None
    }
}

/// Response for a command that produced data-in (possibly none).
pub(crate) fn finish_data_in(cmd: &Command, data: Bytes, st: u8) -> Response {
    let edtl = cmd.expected_len as u64;
    let wanted = data.len() as u64;
    if !cmd.read {
        // Data the transport cannot carry (no R bit): drop it, report it as overflow.
        let residual = if wanted > 0 {
            Residual::Overflow(wanted.min(u32::MAX as u64) as u32)
        } else {
            residual(0, edtl)
        };
        return Response {
            status: st,
            sense: None,
            data_in: Bytes::new(),
            data_in_note: None,
            residual,
            bidi_read_residual: None,
            aborted: false,
        };
    }
    let mut data = data;
    if wanted > edtl {
        data.truncate(edtl as usize);
    }
    Response {
        status: st,
        sense: None,
        data_in: data,
        data_in_note: None,
        residual: residual(wanted, edtl),
        bidi_read_residual: None,
        aborted: false,
    }
}

/// Response for a data-out command that wanted `out_len` bytes.
pub(crate) fn finish_out(cmd: &Command, out_len: u64, st: u8) -> Response {
    Response {
        status: st,
        sense: None,
        data_in: Bytes::new(),
        data_in_note: None,
        residual: residual(out_len, cmd.expected_len as u64),
        bidi_read_residual: None,
        aborted: false,
    }
}

pub(crate) fn finish_error(_cmd: &Command, st: u8, sense: Option<Bytes>) -> Response {
    Response::unexecuted(st, sense)
}
