//! Reading a CDB: the shared vocabulary's operation codes, field readers and lengths
//! (`scsi_spec::cdb`), and what an opcode implies for this engine (whether it runs under
//! a reservation or without a medium). Used by the LUN pipeline's checks as much as by
//! the command handlers.

pub use scsi_spec::cdb::op;
pub(crate) use scsi_spec::cdb::{be16, be32, be64, block_range, byte, data_out_len, min_cdb_len};

/// Commands a nexus may run while another holds a RESERVE(6) reservation (SPC-2 5.5.1).
pub(crate) fn allowed_under_reserve6(opcode: u8) -> bool {
    matches!(
        opcode,
        op::INQUIRY
            | op::REQUEST_SENSE
            | op::REPORT_LUNS
            | op::RELEASE_6
            | op::PR_IN
            | op::MAINTENANCE_IN
    )
}

/// Commands that need the medium (fail NOT READY when it is ejected).
pub(crate) fn needs_medium(opcode: u8) -> bool {
    !matches!(
        opcode,
        op::INQUIRY
            | op::REQUEST_SENSE
            | op::REPORT_LUNS
            | op::START_STOP_UNIT
            | op::PREVENT_ALLOW
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::PR_IN
            | op::PR_OUT
            | op::RESERVE_6
            | op::RELEASE_6
            | op::MAINTENANCE_IN
    )
}
