//! ErrorRecoveryLevel 2 decisions of the target session core: which task an acknowledged
//! status ends, and how a TASK REASSIGN is answered. The kept tasks themselves, with the
//! connections they are allegiant to, are the driver's (`erl2.rs`), which asks these
//! questions of what it holds.

use iscsi_wire::{tmf, Bhs};

/// The task whose status a retained status PDU carries (a SCSI Response, or a Data-In with
/// the status in it); `None` for status that ends no task (NOP-In, Logout Response …).
pub fn status_of(bhs: &Bhs) -> Option<u32> {
    match bhs {
        Bhs::ScsiResponse(r) => Some(r.itt),
        Bhs::DataIn(d) if d.status_present => Some(d.itt),
        _ => None,
    }
}

/// The kept task a TASK REASSIGN names, as the session finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptView {
    /// The connection it is allegiant to is still in the session.
    pub allegiant_live: bool,
}

/// The answer to a TASK REASSIGN (in a session at level 2: below it the request is
/// answered "not supported" by `tmf_plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reassign {
    NoTask,
    /// Its connection has not failed: it may not move.
    StillAllegiant,
    /// It moves to the connection the request came on: a task that has executed has its
    /// response sent again there, a write asks for all its data again by R2T once the
    /// answer is out.
    Move,
}

impl Reassign {
    /// The Task Management Response's response code.
    pub fn response(self) -> u8 {
        match self {
            Reassign::NoTask => tmf::RSP_NO_TASK,
            Reassign::StillAllegiant => tmf::RSP_STILL_ALLEGIANT,
            Reassign::Move => tmf::RSP_COMPLETE,
        }
    }
}

/// Decides a TASK REASSIGN of the task found (`None`: no task kept under the referenced
/// ITT).
pub fn reassign(kept: Option<KeptView>) -> Reassign {
    match kept {
        None => Reassign::NoTask,
        Some(k) if k.allegiant_live => Reassign::StillAllegiant,
        Some(_) => Reassign::Move,
    }
}
