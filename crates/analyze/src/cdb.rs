//! Human-readable SCSI: CDBs ("READ(10) LBA 123 len 64"), status bytes and sense data, in
//! the shared vocabulary's words (`scsi_spec`), with OSD-2 commands named by the OSD codec.

pub use scsi_spec::cdb::media_range;
use scsi_spec::cdb::op;

/// One-line description of a CDB.
pub fn describe_cdb(cdb: &[u8]) -> String {
    match cdb.first() {
        Some(&op::VARIABLE_LENGTH) => describe_osd(cdb),
        _ => scsi_spec::cdb::describe(cdb),
    }
}

/// An OSD-2 command (variable-length CDB): its service action and the object it names.
fn describe_osd(cdb: &[u8]) -> String {
    use osd::cdb::ServiceAction as A;
    let Ok(c) = osd::cdb::Cdb::parse(cdb) else {
        return format!(
            "VARIABLE LENGTH service action 0x{:04x}",
            scsi_spec::cdb::be16(cdb, 8)
        );
    };
    let mut d = format!("OSD {} partition 0x{:x}", c.action.name(), c.partition);
    if c.object != 0 {
        d += &format!(" object 0x{:x}", c.object);
    }
    match c.action {
        A::Read | A::Write | A::Clear | A::Punch => {
            d += &format!(" offset {} len {}", c.start, c.length)
        }
        A::Append => d += &format!(" len {}", c.length),
        _ => {}
    }
    d
}

/// SCSI status byte name.
pub fn status_name(status: u8) -> String {
    scsi_spec::status::name(status).map_or_else(|| format!("status 0x{status:02x}"), String::from)
}

/// Sense data (fixed 0x70/0x71 or descriptor 0x72/0x73 format) in one line.
pub fn describe_sense(sense: &[u8]) -> String {
    let Some(&code) = sense.first() else {
        return "no sense data".into();
    };
    // The parser reads fields past the end of truncated sense from a capture as zero, so
    // such sense still gets a line.
    let Some(s) = scsi_spec::Sense::parse(sense) else {
        return format!("sense response code 0x{:02x}", code & 0x7f);
    };
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_cdbs() {
        let mut r10 = [0u8; 10];
        r10[0] = 0x28;
        r10[2..6].copy_from_slice(&123u32.to_be_bytes());
        r10[7..9].copy_from_slice(&64u16.to_be_bytes());
        assert_eq!(describe_cdb(&r10), "READ(10) LBA 123 len 64");
        let mut w16 = [0u8; 16];
        w16[0] = 0x8a;
        w16[2..10].copy_from_slice(&(1u64 << 33).to_be_bytes());
        w16[10..14].copy_from_slice(&8u32.to_be_bytes());
        assert_eq!(describe_cdb(&w16), "WRITE(16) LBA 8589934592 len 8");
        assert_eq!(
            describe_cdb(&[0x08, 0, 0, 5, 0, 0]),
            "READ(6) LBA 5 len 256"
        );
        assert_eq!(describe_cdb(&[0xc7]), "opcode 0xc7");
        let w = osd::client::write(0x10000, 0x10001, 4096, &[0; 100])
            .cdb
            .encode();
        assert_eq!(
            describe_cdb(&w),
            "OSD WRITE partition 0x10000 object 0x10001 offset 4096 len 100"
        );
        let p = osd::client::create_partition(0x20000).cdb.encode();
        assert_eq!(describe_cdb(&p), "OSD CREATE PARTITION partition 0x20000");
        assert_eq!(
            describe_cdb(&w[..16]),
            "VARIABLE LENGTH service action 0x8886"
        );
        assert_eq!(describe_cdb(&[]), "empty CDB");
    }

    #[test]
    fn sense_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x24;
        assert_eq!(
            describe_sense(&fixed),
            "ILLEGAL REQUEST (ASC/ASCQ 0x24/0x00: invalid field in CDB)"
        );
        assert_eq!(
            describe_sense(&[0x72, 0x06, 0x29, 0x01]),
            "UNIT ATTENTION (ASC/ASCQ 0x29/0x01: power on occurred)"
        );
        assert_eq!(
            describe_sense(&[0x70]),
            "NO SENSE (ASC/ASCQ 0x00/0x00: no additional sense information)"
        );
    }
}
