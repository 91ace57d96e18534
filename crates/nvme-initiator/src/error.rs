//! The driver's errors: typed, with the NVMe status of a failed command.

use crate::host::{HostError, SubmitError};
use nvme_tcp::cqe::Status;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A socket operation failed.
    #[error("{what}: {message}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's message.
        message: String,
        /// Its kind.
        kind: std::io::ErrorKind,
    },
    /// The connection was closed.
    #[error("connection closed {0}")]
    Closed(String),
    /// The connection ended on a protocol error or a TermReq.
    #[error(transparent)]
    Connection(HostError),
    /// The command could not be sent.
    #[error(transparent)]
    Submit(SubmitError),
    /// The controller completed a command with an error status.
    #[error("{command} failed: {}{}", status.code, if status.dnr { " (do not retry)" } else { "" })]
    Status {
        /// The command.
        command: &'static str,
        /// The completion's status.
        status: Status,
    },
    /// A C2HData PDU of the command failed its data digest.
    #[error("{0}: data digest error in the read data")]
    DataDigest(&'static str),
    /// Nothing came in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The controller does not offer what is needed, or a call's arguments are invalid.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>, e: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            message: e.to_string(),
            kind: e.kind(),
        }
    }

    /// The NVMe status, when a command failed with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}
