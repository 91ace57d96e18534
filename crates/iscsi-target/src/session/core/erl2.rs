//! ErrorRecoveryLevel 2 decisions of the target session core: whether an arriving task is
//! kept for reassignment, which task an acknowledged status ends and when, and how a TASK
//! REASSIGN is answered. The kept tasks themselves, with the connections they are
//! allegiant to, are the driver's (`erl2.rs`), which asks these questions of what it holds.

use iscsi_wire::{tmf, Bhs};

/// A kept task under an arriving command's ITT, as the command finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepDecision {
    /// Keep the arriving task (replacing a kept one whose response went out: the initiator
    /// reuses an ITT only once it has the status).
    Keep,
    /// A task with the ITT is still in progress: the arriving one is a copy of its command,
    /// which the CmdSN window turns away; nothing new is kept.
    InProgress,
}

/// Whether a command arriving under an ITT is kept; `existing`: the kept task under that
/// ITT, and whether its response was produced.
pub(crate) fn keep(existing_has_response: Option<bool>) -> KeepDecision {
    match existing_has_response {
        Some(false) => KeepDecision::InProgress,
        _ => KeepDecision::Keep,
    }
}

/// The task whose status a retained status PDU carries (a SCSI Response, or a Data-In with
/// the status in it); `None` for status that ends no task (NOP-In, Logout Response …).
pub(crate) fn status_of(bhs: &Bhs) -> Option<u32> {
    match bhs {
        Bhs::ScsiResponse(r) => Some(r.itt),
        Bhs::DataIn(d) if d.status_present => Some(d.itt),
        _ => None,
    }
}

/// Whether an acknowledgement (ExpStatSN past the status of a kept task, on connection
/// `on_allegiant`) ends the kept task: only on the connection it is allegiant to, and only
/// once its response was produced (a reassigned task's first status is not its status now).
pub(crate) fn acknowledged(on_allegiant: bool, has_response: bool) -> bool {
    on_allegiant && has_response
}

/// The kept task a TASK REASSIGN names, as the session finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeptView {
    /// The connection it is allegiant to is still in the session.
    pub(crate) allegiant_live: bool,
    /// It has executed: its response is kept.
    pub(crate) executed: bool,
}

/// The answer to a TASK REASSIGN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reassign {
    /// Below level 2.
    NotSupported,
    NoTask,
    /// Its connection has not failed: it may not move.
    StillAllegiant,
    /// It moves to the connection the request came on; `resend`: its response goes again
    /// there (all its Data-In from DataSN 0, its status with that connection's StatSN),
    /// else a write asks for all its data again by R2T once the answer is out.
    Move {
        resend: bool,
    },
}

impl Reassign {
    /// The Task Management Response's response code.
    pub(crate) fn response(self) -> u8 {
        match self {
            Reassign::NotSupported => tmf::RSP_REASSIGN_NOT_SUPPORTED,
            Reassign::NoTask => tmf::RSP_NO_TASK,
            Reassign::StillAllegiant => tmf::RSP_STILL_ALLEGIANT,
            Reassign::Move { .. } => tmf::RSP_COMPLETE,
        }
    }
}

/// Decides a TASK REASSIGN in a session at level 2 (`erl2`) of the task found (`None`: no
/// task kept under the referenced ITT).
pub(crate) fn reassign(erl2: bool, kept: Option<KeptView>) -> Reassign {
    match (erl2, kept) {
        (false, _) => Reassign::NotSupported,
        (true, None) => Reassign::NoTask,
        (true, Some(k)) if k.allegiant_live => Reassign::StillAllegiant,
        (true, Some(k)) => Reassign::Move { resend: k.executed },
    }
}
