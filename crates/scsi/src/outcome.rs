//! What a command handler comes to: data and status ([`Done`]) or a failure ([`Fail`]).
//! Shared by the LUN pipeline, the command handlers and persistent reservations.

use bytes::Bytes;

use crate::sense::Sense;
use crate::status;
use crate::tasks::Aborted;

/// How a command failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fail {
    Check(Sense),
    Status(u8),
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Fail {
        Fail::Check(s)
    }
}

/// An aborted task's wait ends its command; `Lun::execute` then answers it as aborted.
impl From<Aborted> for Fail {
    fn from(_: Aborted) -> Fail {
        Fail::Status(status::TASK_ABORTED)
    }
}

/// A successful command: its data-in (already cut to the allocation length) and status.
pub(crate) struct Done {
    pub data: Bytes,
    /// What a lent read buffer noted while the medium read filled it.
    pub note: Option<storage::BufNote>,
    pub status: u8,
}

impl Done {
    pub fn none() -> Result<Done, Fail> {
        Ok(Done {
            data: Bytes::new(),
            note: None,
            status: status::GOOD,
        })
    }
    pub fn data(data: impl Into<Bytes>) -> Result<Done, Fail> {
        Ok(Done {
            data: data.into(),
            note: None,
            status: status::GOOD,
        })
    }
    /// Data built in a Vec, cut to the CDB's allocation length.
    pub fn alloc(mut data: Vec<u8>, alloc_len: usize) -> Result<Done, Fail> {
        data.truncate(alloc_len);
        Ok(Done {
            data: Bytes::from(data),
            note: None,
            status: status::GOOD,
        })
    }
}

pub(crate) type CmdResult = Result<Done, Fail>;
