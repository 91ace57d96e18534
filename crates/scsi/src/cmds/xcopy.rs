//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS within this target.

use crate::device::{Command, Device};
use crate::lun::{CmdResult, Fail, Lun};
use crate::sense::{asc, Sense};
use crate::tasks::TaskGuard;

impl Lun {
    pub(crate) async fn extended_copy(
        &self,
        _dev: &Device,
        _cmd: &Command,
        _guard: &TaskGuard<'_>,
    ) -> CmdResult {
        Err(Fail::Check(Sense::illegal(asc::INVALID_OPCODE)))
    }

    pub(crate) fn receive_copy_results(&self, _cmd: &Command) -> CmdResult {
        Err(Fail::Check(Sense::illegal(asc::INVALID_OPCODE)))
    }
}
