//! The ironsan iSCSI initiator: it issues exactly the SCSI commands it is asked for, as
//! fast as the wire allows, and reports what happened. It parses libiscsi-style URLs
//! ([`IscsiUrl`]), discovers targets (SendTargets), logs in with full negotiation, CHAP,
//! mutual CHAP and CRC32C digests, and runs sessions of one or more connections with many
//! commands outstanding (up to the target's CmdSN window), immediate, unsolicited and
//! solicited write data, NOP keepalive, task management, logout, reconnection by
//! session reinstatement, and at ErrorRecoveryLevel 1 and 2 recovery inside the session
//! (SNACK and command retry; a lost connection logged in again and its commands moved to it
//! with TASK REASSIGN). The protocol logic is the sans-IO [`core::SessionCore`]; a thin
//! tokio driver ([`Session`]) hands its commands and PDUs to each connection's
//! `datamover::InitiatorDatamover` (opened by the session's `datamover::Connector`, which
//! the `transports` crate composes), which runs the data phases and reports
//! statuses with their read data placed. SCSI helpers (INQUIRY, READ
//! CAPACITY, READ/WRITE 10/16, SYNCHRONIZE CACHE, UNMAP, REPORT LUNS, raw CDBs) sit on top.
//! The access generator behind `ironsan bench` is the `bench` crate's.
//!
//! A URL that lists several portals of one logical unit (`iscsi://h1,h2:3261/iqn/0`:
//! gateways exporting the same LUN) gives a multipath [`Session`] ([`multipath`]): one
//! session per portal, the LU's identity checked on each, commands sent to the best path by
//! its ALUA state and moved to another when it fails, without an error to the caller.
//!
//! ```no_run
//! use iscsi_initiator::{IscsiUrl, Session, SessionConfig, SessionConnector};
//!
//! // `connector`: the transports' (`transports::connector()`).
//! # async fn demo(connector: SessionConnector) -> Result<(), iscsi_initiator::Error> {
//! let url = IscsiUrl::parse_lun("iscsi://127.0.0.1/iqn.2026-11.org.ironsan:default/0")?;
//! let mut cfg = SessionConfig::from_url(&url);
//! cfg.connector = Some(connector);
//! let session = Session::connect(&url, cfg).await?;
//! let lun = session.default_lun();
//! let cap = session.capacity(lun).await?;
//! let data = vec![0xa5u8; 1 << 20];
//! session.write(lun, 0, cap.block_size, data.clone().into()).await?;
//! let back = session.read(lun, 0, (1 << 20) / cap.block_size, cap.block_size).await?;
//! assert_eq!(&back[..], &data[..]);
//! session.logout().await?;
//! # Ok(())
//! # }
//! ```

mod conn;
pub mod core;
pub mod multipath;
mod pending;
pub mod scsi;
mod session;
pub mod url;

pub use crate::core::{CommandRequest, CommandResult, RecoveryStats, Residual, TaskError};
pub use datamover::IserProvider;
pub use iscsi_login::{ChapCredentials, DigestPreference, DiscoveredTarget, LoginError};
pub use multipath::{AluaState, MultipathConfig, PathStatus};
pub use pending::PendingCommand;
pub use session::{
    discover, Session, SessionConfig, SessionConnector, TraceFile, DEFAULT_INITIATOR_NAME,
};
pub use url::{parse_portal, IscsiUrl, UrlError};

/// Everything that can go wrong, each with a one-line explanation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("cannot connect to {addr}: {why}")]
    Connect { addr: String, why: String },
    /// The target refused the login (its status class/detail explained) or broke it.
    #[error("{0}")]
    Login(LoginError),
    #[error("connection error: {0}")]
    Io(String),
    #[error("protocol error from the target: {0}")]
    Protocol(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("{0}")]
    Task(TaskError),
    /// A command ended with a status other than GOOD.
    #[error("{what} failed: {}{}", scsi::status::name(*status).unwrap_or("unknown status"), sense.map(|s| format!(", {s}")).unwrap_or_default())]
    Scsi {
        what: String,
        status: u8,
        sense: Option<scsi::Sense>,
    },
    /// A request that cannot be made (bad offset, size...).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn io(e: std::io::Error) -> Error {
        Error::Io(e.to_string())
    }
}

impl CommandResult {
    /// Whether it ended in CHECK CONDITION with the sense key UNIT ATTENTION: the target
    /// reports a change (power on, LUNs or capacity changed, ...) and did not execute the
    /// command.
    pub fn is_unit_attention(&self) -> bool {
        self.status == scsi::status::CHECK_CONDITION
            && scsi::Sense::parse(&self.sense)
                .is_some_and(|s| s.key == scsi::sense_key::UNIT_ATTENTION)
    }

    /// Whether it ended in NOT READY, ASYMMETRIC ACCESS STATE TRANSITION (04h/0Ah): a
    /// gateway changing its ALUA state did not execute the command.
    pub fn is_alua_transition(&self) -> bool {
        multipath::verdict(self) == multipath::Verdict::Transitioning
    }

    /// The result if its status is GOOD, else [`Error::Scsi`] naming `what` failed, with the
    /// status and decoded sense.
    pub fn good(self, what: &str) -> Result<CommandResult, Error> {
        if self.status == scsi::status::GOOD {
            return Ok(self);
        }
        Err(Error::Scsi {
            what: what.to_string(),
            status: self.status,
            sense: scsi::Sense::parse(&self.sense),
        })
    }
}
