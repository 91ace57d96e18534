//! Reading a CDB: operation codes, field readers, and what an opcode implies (CDB length,
//! data-out length, whether it runs under a reservation or without a medium). Used by the
//! LUN pipeline's checks as much as by the command handlers.

/// Operation codes handled by the engine.
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNC_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const SANITIZE: u8 = 0x48;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PR_IN: u8 = 0x5E;
    pub const PR_OUT: u8 = 0x5F;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const ORWRITE_16: u8 = 0x8B;
    pub const WRITE_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNC_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const WRITE_ATOMIC_16: u8 = 0x9C;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;
    pub const READ_DEFECT_12: u8 = 0xB7;

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u8 = 0x10;
    pub const SA_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN service action.
    pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
}

/// Big-endian field readers over a CDB or parameter list that never panic: a field past
/// the end reads as zero (CDB lengths are checked up front by `min_cdb_len`).
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([get(b, at), get(b, at + 1)])
}
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([get(b, at), get(b, at + 1), get(b, at + 2), get(b, at + 3)])
}
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    ((be32(b, at) as u64) << 32) | be32(b, at + 4) as u64
}
pub(crate) fn get(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

/// CDB length implied by the operation code's group (SPC-4 4.2.5.1).
pub(crate) fn min_cdb_len(opcode: u8) -> usize {
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 6,
    }
}

/// Bytes of data-out the CDB announces (SPDTL) for data-out commands, or None for
/// commands without data-out.
pub(crate) fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u64> {
    let bs = block_size as u64;
    let opcode = get(cdb, 0);
    Some(match opcode {
        op::WRITE_6 => {
            let n = get(cdb, 4) as u64;
            if n == 0 {
                256 * bs
            } else {
                n * bs
            }
        }
        op::WRITE_10 | op::WRITE_VERIFY_10 => be16(cdb, 7) as u64 * bs,
        op::WRITE_12 | op::WRITE_VERIFY_12 => be32(cdb, 6) as u64 * bs,
        op::WRITE_16 | op::WRITE_VERIFY_16 | op::ORWRITE_16 => be32(cdb, 10) as u64 * bs,
        op::WRITE_ATOMIC_16 => be16(cdb, 12) as u64 * bs,
        op::VERIFY_10 if get(cdb, 1) & 0x06 != 0 => be16(cdb, 7) as u64 * bs,
        op::VERIFY_12 if get(cdb, 1) & 0x06 != 0 => be32(cdb, 6) as u64 * bs,
        op::VERIFY_16 if get(cdb, 1) & 0x06 != 0 => be32(cdb, 10) as u64 * bs,
        op::COMPARE_AND_WRITE => 2 * get(cdb, 13) as u64 * bs,
        op::WRITE_SAME_10 | op::WRITE_SAME_16 if get(cdb, 1) & 0x01 == 0 => bs,
        op::MODE_SELECT_6 => get(cdb, 4) as u64,
        op::MODE_SELECT_10 | op::UNMAP | op::SANITIZE => be16(cdb, 7) as u64,
        op::PR_OUT => be32(cdb, 5) as u64,
        op::EXTENDED_COPY => be32(cdb, 10) as u64,
        _ => return None,
    })
}

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
