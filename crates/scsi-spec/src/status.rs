//! SCSI status codes (SAM-5) and their names.

pub const GOOD: u8 = 0x00;
pub const CHECK_CONDITION: u8 = 0x02;
pub const CONDITION_MET: u8 = 0x04;
pub const BUSY: u8 = 0x08;
pub const RESERVATION_CONFLICT: u8 = 0x18;
pub const TASK_SET_FULL: u8 = 0x28;
pub const ACA_ACTIVE: u8 = 0x30;
pub const TASK_ABORTED: u8 = 0x40;

/// The status name as SAM-5 prints it; `None` for a code it does not define.
pub fn name(status: u8) -> Option<&'static str> {
    Some(match status {
        GOOD => "GOOD",
        CHECK_CONDITION => "CHECK CONDITION",
        CONDITION_MET => "CONDITION MET",
        BUSY => "BUSY",
        RESERVATION_CONFLICT => "RESERVATION CONFLICT",
        TASK_SET_FULL => "TASK SET FULL",
        ACA_ACTIVE => "ACA ACTIVE",
        TASK_ABORTED => "TASK ABORTED",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(CHECK_CONDITION), Some("CHECK CONDITION"));
        assert_eq!(name(ACA_ACTIVE), Some("ACA ACTIVE"));
        assert_eq!(name(0x22), None);
    }
}
