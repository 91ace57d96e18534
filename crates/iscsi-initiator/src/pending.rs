//! A command handed to a session, until its status is awaited: the core's completion on a
//! single path, or the multipath router's, which may move the command between paths.

use tokio::sync::oneshot;

use crate::core::{CommandResult, Reply, TaskError};
use crate::Error;

/// A command sent (or queued) whose completion has not been awaited yet.
pub struct PendingCommand {
    pub(crate) itt: u32,
    pub(crate) rx: Pending,
}

pub(crate) enum Pending {
    /// On a session's connection: the core's completion.
    Sent(oneshot::Receiver<Result<Reply, TaskError>>),
    /// Carried by a multipath session's router, which may move it between paths.
    Routed(oneshot::Receiver<Result<CommandResult, Error>>),
    /// Never sent.
    Failed(Error),
}

impl PendingCommand {
    /// A command whose completion `rx` delivers (multipath routing, test paths).
    pub(crate) fn routed(rx: oneshot::Receiver<Result<CommandResult, Error>>) -> PendingCommand {
        PendingCommand {
            itt: 0,
            rx: Pending::Routed(rx),
        }
    }

    /// The command's Initiator Task Tag (for [`crate::Session::abort_task`]; 0 on a multipath
    /// session, whose commands may move between paths).
    pub fn itt(&self) -> u32 {
        self.itt
    }

    /// Waits for the status.
    pub async fn wait(self) -> Result<CommandResult, Error> {
        let rx = match self.rx {
            Pending::Sent(rx) => rx,
            Pending::Routed(rx) => {
                return rx
                    .await
                    .unwrap_or(Err(Error::Task(TaskError::SessionClosed)))
            }
            Pending::Failed(e) => return Err(e),
        };
        match rx.await {
            Ok(Ok(Reply::Scsi(r))) => Ok(r),
            Ok(Ok(other)) => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
            Ok(Err(e)) => Err(Error::Task(e)),
            Err(_) => Err(Error::Task(TaskError::SessionClosed)),
        }
    }
}
