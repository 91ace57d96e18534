//! Reading a CDB: operation codes and their names, big-endian field readers that never
//! panic, what an opcode implies (CDB length, data-out length, the blocks a READ or WRITE
//! moves), and a one-line description ("READ(10) LBA 123 len 64").

/// Operation codes (SPC-4, SBC-3, OSD-2).
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const FORMAT_UNIT: u8 = 0x04;
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
    pub const WRITE_BUFFER: u8 = 0x3B;
    pub const READ_BUFFER: u8 = 0x3C;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const SANITIZE: u8 = 0x48;
    pub const LOG_SENSE: u8 = 0x4D;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PR_IN: u8 = 0x5E;
    pub const PR_OUT: u8 = 0x5F;
    /// Variable-length CDB (SPC-4 4.2.4), the form of every OSD-2 command.
    pub const VARIABLE_LENGTH: u8 = 0x7F;
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

/// Big-endian field readers over a CDB or parameter list that never panic: a byte past
/// the end reads as zero (the target checks CDB lengths up front with [`min_cdb_len`]).
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([byte(b, at), byte(b, at + 1)])
}
pub fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, byte(b, at), byte(b, at + 1), byte(b, at + 2)])
}
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([
        byte(b, at),
        byte(b, at + 1),
        byte(b, at + 2),
        byte(b, at + 3),
    ])
}
pub fn be64(b: &[u8], at: usize) -> u64 {
    ((be32(b, at) as u64) << 32) | be32(b, at + 4) as u64
}
pub fn byte(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

/// The command's name as SBC/SPC print it; `None` for an opcode not named here.
pub fn opcode_name(opcode: u8) -> Option<&'static str> {
    Some(match opcode {
        op::TEST_UNIT_READY => "TEST UNIT READY",
        op::REQUEST_SENSE => "REQUEST SENSE",
        op::FORMAT_UNIT => "FORMAT UNIT",
        op::READ_6 => "READ(6)",
        op::WRITE_6 => "WRITE(6)",
        op::INQUIRY => "INQUIRY",
        op::MODE_SELECT_6 => "MODE SELECT(6)",
        op::MODE_SENSE_6 => "MODE SENSE(6)",
        op::START_STOP_UNIT => "START STOP UNIT",
        op::PREVENT_ALLOW => "PREVENT ALLOW MEDIUM REMOVAL",
        op::READ_CAPACITY_10 => "READ CAPACITY(10)",
        op::READ_10 => "READ(10)",
        op::WRITE_10 => "WRITE(10)",
        op::WRITE_VERIFY_10 => "WRITE AND VERIFY(10)",
        op::VERIFY_10 => "VERIFY(10)",
        op::PRE_FETCH_10 => "PRE-FETCH(10)",
        op::SYNC_CACHE_10 => "SYNCHRONIZE CACHE(10)",
        op::WRITE_BUFFER => "WRITE BUFFER",
        op::READ_BUFFER => "READ BUFFER",
        op::WRITE_SAME_10 => "WRITE SAME(10)",
        op::UNMAP => "UNMAP",
        op::LOG_SENSE => "LOG SENSE",
        op::MODE_SELECT_10 => "MODE SELECT(10)",
        op::MODE_SENSE_10 => "MODE SENSE(10)",
        op::PR_IN => "PERSISTENT RESERVE IN",
        op::PR_OUT => "PERSISTENT RESERVE OUT",
        op::VARIABLE_LENGTH => "VARIABLE LENGTH",
        op::EXTENDED_COPY => "EXTENDED COPY",
        op::READ_16 => "READ(16)",
        op::COMPARE_AND_WRITE => "COMPARE AND WRITE",
        op::WRITE_16 => "WRITE(16)",
        op::WRITE_VERIFY_16 => "WRITE AND VERIFY(16)",
        op::VERIFY_16 => "VERIFY(16)",
        op::PRE_FETCH_16 => "PRE-FETCH(16)",
        op::SYNC_CACHE_16 => "SYNCHRONIZE CACHE(16)",
        op::WRITE_SAME_16 => "WRITE SAME(16)",
        op::SERVICE_ACTION_IN_16 => "SERVICE ACTION IN(16)",
        op::REPORT_LUNS => "REPORT LUNS",
        op::MAINTENANCE_IN => "MAINTENANCE IN",
        op::READ_12 => "READ(12)",
        op::WRITE_12 => "WRITE(12)",
        op::WRITE_VERIFY_12 => "WRITE AND VERIFY(12)",
        op::VERIFY_12 => "VERIFY(12)",
        _ => return None,
    })
}

/// CDB length implied by the operation code's group (SPC-4 4.2.5.1).
pub fn min_cdb_len(opcode: u8) -> usize {
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
pub fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u64> {
    let bs = block_size as u64;
    let opcode = byte(cdb, 0);
    let blocks = u64::from(block_range(cdb).1);
    Some(match opcode {
        op::WRITE_6
        | op::WRITE_10
        | op::WRITE_VERIFY_10
        | op::WRITE_12
        | op::WRITE_VERIFY_12
        | op::WRITE_16
        | op::WRITE_VERIFY_16
        | op::ORWRITE_16
        | op::WRITE_ATOMIC_16 => blocks * bs,
        // BYTCHK set: the data to compare comes with the command.
        op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 if byte(cdb, 1) & 0x06 != 0 => blocks * bs,
        op::COMPARE_AND_WRITE => 2 * blocks * bs,
        op::WRITE_SAME_10 | op::WRITE_SAME_16 if byte(cdb, 1) & 0x01 == 0 => bs,
        op::MODE_SELECT_6 => byte(cdb, 4) as u64,
        op::MODE_SELECT_10 | op::UNMAP | op::SANITIZE => be16(cdb, 7) as u64,
        op::PR_OUT => be32(cdb, 5) as u64,
        op::EXTENDED_COPY => be32(cdb, 10) as u64,
        _ => return None,
    })
}

/// The LBA and number of logical blocks of a block command, read from its CDB layout
/// (SBC-3 §4.2.2): 6-byte (a 21-bit LBA, and 0 blocks meaning 256), 10-, 12- and 16-byte;
/// COMPARE AND WRITE and WRITE ATOMIC(16) have length fields of their own. Fields past a
/// short CDB read as zero.
pub fn block_range(cdb: &[u8]) -> (u64, u32) {
    let opcode = byte(cdb, 0);
    match opcode {
        op::COMPARE_AND_WRITE => (be64(cdb, 2), byte(cdb, 13) as u32),
        op::WRITE_ATOMIC_16 => (be64(cdb, 2), be16(cdb, 12) as u32),
        _ => match opcode >> 5 {
            0 => {
                let lba = be24(cdb, 1) & 0x1f_ffff;
                let blocks = match byte(cdb, 4) {
                    0 => 256,
                    n => n as u32,
                };
                (lba as u64, blocks)
            }
            1 | 2 => (be32(cdb, 2) as u64, be16(cdb, 7) as u32),
            5 => (be32(cdb, 2) as u64, be32(cdb, 6)),
            _ => (be64(cdb, 2), be32(cdb, 10)),
        },
    }
}

/// The blocks a READ or WRITE (6/10/12/16, WRITE AND VERIFY included) transfers: (LBA,
/// number of blocks). None for other commands, among them VERIFY, SYNCHRONIZE CACHE and
/// WRITE SAME, which move no application data of that length.
pub fn media_range(cdb: &[u8]) -> Option<(u64, u32)> {
    match *cdb.first()? {
        op::READ_6
        | op::WRITE_6
        | op::READ_10
        | op::WRITE_10
        | op::WRITE_VERIFY_10
        | op::READ_12
        | op::WRITE_12
        | op::WRITE_VERIFY_12
        | op::READ_16
        | op::WRITE_16
        | op::WRITE_VERIFY_16 => Some(block_range(cdb)),
        _ => None,
    }
}

/// One-line description of a CDB: its name and the fields that say what it does. A
/// variable-length CDB gets its name only (its service actions are the command set's).
pub fn describe(cdb: &[u8]) -> String {
    let Some(&opcode) = cdb.first() else {
        return "empty CDB".into();
    };
    let name = opcode_name(opcode).map_or_else(|| format!("opcode 0x{opcode:02x}"), String::from);
    match opcode {
        op::READ_6
        | op::WRITE_6
        | op::READ_10
        | op::WRITE_10
        | op::WRITE_VERIFY_10
        | op::VERIFY_10
        | op::PRE_FETCH_10
        | op::SYNC_CACHE_10
        | op::WRITE_SAME_10
        | op::READ_12
        | op::WRITE_12
        | op::WRITE_VERIFY_12
        | op::VERIFY_12
        | op::READ_16
        | op::WRITE_16
        | op::WRITE_VERIFY_16
        | op::VERIFY_16
        | op::PRE_FETCH_16
        | op::SYNC_CACHE_16
        | op::WRITE_SAME_16
        | op::COMPARE_AND_WRITE => {
            let (lba, len) = block_range(cdb);
            format!("{name} LBA {lba} len {len}")
        }
        op::INQUIRY => {
            let evpd = byte(cdb, 1) & 1 != 0;
            let page = byte(cdb, 2);
            let alloc = be16(cdb, 3);
            if evpd {
                format!("{name} VPD page 0x{page:02x} alloc {alloc}")
            } else {
                format!("{name} standard alloc {alloc}")
            }
        }
        op::MODE_SENSE_6 => format!(
            "{name} page 0x{:02x} alloc {}",
            byte(cdb, 2) & 0x3f,
            byte(cdb, 4)
        ),
        op::MODE_SENSE_10 => format!(
            "{name} page 0x{:02x} alloc {}",
            byte(cdb, 2) & 0x3f,
            be16(cdb, 7)
        ),
        op::SERVICE_ACTION_IN_16 => match byte(cdb, 1) & 0x1f {
            op::SA_READ_CAPACITY_16 => format!("READ CAPACITY(16) alloc {}", be32(cdb, 10)),
            op::SA_GET_LBA_STATUS => format!("GET LBA STATUS LBA {}", be64(cdb, 2)),
            sa => format!("{name} service action 0x{sa:02x}"),
        },
        op::REPORT_LUNS => format!("{name} alloc {}", be32(cdb, 6)),
        op::REQUEST_SENSE => format!("{name} alloc {}", byte(cdb, 4)),
        op::PR_IN | op::PR_OUT => {
            format!("{name} service action 0x{:02x}", byte(cdb, 1) & 0x1f)
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn descriptions() {
        let mut r10 = [0u8; 10];
        r10[0] = op::READ_10;
        r10[2..6].copy_from_slice(&123u32.to_be_bytes());
        r10[7..9].copy_from_slice(&64u16.to_be_bytes());
        assert_eq!(describe(&r10), "READ(10) LBA 123 len 64");
        assert_eq!(media_range(&r10), Some((123, 64)));
        assert_eq!(
            describe(&[op::READ_6, 0, 0, 5, 0, 0]),
            "READ(6) LBA 5 len 256"
        );
        assert_eq!(describe(&[0xc7]), "opcode 0xc7");
        assert_eq!(describe(&[]), "empty CDB");
        let mut rc16 = [0u8; 16];
        rc16[0] = op::SERVICE_ACTION_IN_16;
        rc16[1] = op::SA_READ_CAPACITY_16;
        rc16[13] = 32;
        assert_eq!(describe(&rc16), "READ CAPACITY(16) alloc 32");
        assert_eq!(media_range(&rc16), None);
    }

    #[test]
    fn block_ranges_of_every_layout() {
        assert_eq!(
            block_range(&[op::READ_6, 0xff, 0x00, 0x05, 0, 0]),
            (0x1f_0005, 256)
        );
        let mut c10 = [0u8; 10];
        c10[0] = op::WRITE_10;
        c10[2..6].copy_from_slice(&7u32.to_be_bytes());
        c10[7..9].copy_from_slice(&9u16.to_be_bytes());
        assert_eq!(block_range(&c10), (7, 9));
        let mut c12 = [0u8; 12];
        c12[0] = op::READ_12;
        c12[6..10].copy_from_slice(&70_000u32.to_be_bytes());
        assert_eq!(block_range(&c12), (0, 70_000));
        let mut c16 = [0u8; 16];
        c16[0] = op::COMPARE_AND_WRITE;
        c16[2..10].copy_from_slice(&(1u64 << 40).to_be_bytes());
        c16[10] = 0xff; // reserved: not part of the length
        c16[13] = 1;
        assert_eq!(block_range(&c16), (1 << 40, 1));
        c16[0] = op::WRITE_ATOMIC_16;
        c16[12..14].copy_from_slice(&3u16.to_be_bytes());
        assert_eq!(block_range(&c16), (1 << 40, 3));
        c16[0] = op::WRITE_16;
        assert_eq!(block_range(&c16), (1 << 40, 0xff00_0003));
        assert_eq!(data_out_len(&c16, 512), Some(0xff00_0003 * 512));
        assert_eq!(block_range(&[op::READ_16]), (0, 0));
    }

    #[test]
    fn fields_past_the_end_read_as_zero() {
        assert_eq!(be32(&[1, 2], 0), 0x0102_0000);
        assert_eq!(be64(&[], 3), 0);
        assert_eq!(min_cdb_len(op::READ_16), 16);
        assert_eq!(
            data_out_len(&[op::WRITE_10, 0, 0, 0, 0, 0, 0, 0, 2, 0], 512),
            Some(1024)
        );
        assert_eq!(data_out_len(&[op::READ_10], 512), None);
    }

    proptest! {
        #[test]
        fn readers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..40), at in 0usize..48) {
            let _ = (be16(&b, at), be24(&b, at), be32(&b, at), be64(&b, at));
            let _ = (describe(&b), media_range(&b), data_out_len(&b, 512));
        }
    }
}
