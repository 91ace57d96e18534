//! Human-readable SCSI: CDBs ("READ(10) LBA 123 len 64"), status bytes and sense data.

fn be16(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]) as u64)
}
fn be24(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 3)
        .map_or(0, |s| u32::from_be_bytes([0, s[0], s[1], s[2]]) as u64)
}
fn be32(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as u64)
}
fn be64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_be_bytes(a)
    })
}

/// The command's name as SBC/SPC print it.
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        0x00 => "TEST UNIT READY",
        0x03 => "REQUEST SENSE",
        0x04 => "FORMAT UNIT",
        0x08 => "READ(6)",
        0x0a => "WRITE(6)",
        0x12 => "INQUIRY",
        0x15 => "MODE SELECT(6)",
        0x1a => "MODE SENSE(6)",
        0x1b => "START STOP UNIT",
        0x1e => "PREVENT ALLOW MEDIUM REMOVAL",
        0x25 => "READ CAPACITY(10)",
        0x28 => "READ(10)",
        0x2a => "WRITE(10)",
        0x2e => "WRITE AND VERIFY(10)",
        0x2f => "VERIFY(10)",
        0x34 => "PRE-FETCH(10)",
        0x35 => "SYNCHRONIZE CACHE(10)",
        0x3b => "WRITE BUFFER",
        0x3c => "READ BUFFER",
        0x41 => "WRITE SAME(10)",
        0x42 => "UNMAP",
        0x4d => "LOG SENSE",
        0x55 => "MODE SELECT(10)",
        0x5a => "MODE SENSE(10)",
        0x5e => "PERSISTENT RESERVE IN",
        0x5f => "PERSISTENT RESERVE OUT",
        0x7f => "VARIABLE LENGTH",
        0x83 => "EXTENDED COPY",
        0x88 => "READ(16)",
        0x89 => "COMPARE AND WRITE",
        0x8a => "WRITE(16)",
        0x8e => "WRITE AND VERIFY(16)",
        0x8f => "VERIFY(16)",
        0x90 => "PRE-FETCH(16)",
        0x91 => "SYNCHRONIZE CACHE(16)",
        0x93 => "WRITE SAME(16)",
        0x9e => "SERVICE ACTION IN(16)",
        0xa0 => "REPORT LUNS",
        0xa3 => "MAINTENANCE IN",
        0xa8 => "READ(12)",
        0xaa => "WRITE(12)",
        0xae => "WRITE AND VERIFY(12)",
        0xaf => "VERIFY(12)",
        _ => "",
    }
}

/// READ(6)/WRITE(6): 21-bit LBA and a transfer length where 0 means 256 blocks.
fn rw6_range(cdb: &[u8]) -> (u64, u32) {
    let lba = be24(cdb, 1) & 0x1f_ffff;
    let len = cdb
        .get(4)
        .map_or(0, |&l| if l == 0 { 256 } else { l as u32 });
    (lba, len)
}

/// The blocks a READ or WRITE (6/10/12/16) transfers: (LBA, number of blocks). None for
/// other commands, among them VERIFY, SYNCHRONIZE CACHE and WRITE SAME, which move no
/// application data of that length.
pub fn media_range(cdb: &[u8]) -> Option<(u64, u32)> {
    let &op = cdb.first()?;
    match op {
        0x08 | 0x0a => Some(rw6_range(cdb)),
        0x28 | 0x2a | 0x2e => Some((be32(cdb, 2), be16(cdb, 7) as u32)),
        0xa8 | 0xaa | 0xae => Some((be32(cdb, 2), be32(cdb, 6) as u32)),
        0x88 | 0x8a | 0x8e => Some((be64(cdb, 2), be32(cdb, 10) as u32)),
        _ => None,
    }
}

/// One-line description of a CDB.
pub fn describe_cdb(cdb: &[u8]) -> String {
    let Some(&op) = cdb.first() else {
        return "empty CDB".into();
    };
    let name = opcode_name(op);
    let name = if name.is_empty() {
        format!("opcode 0x{op:02x}")
    } else {
        name.to_string()
    };
    match op {
        0x08 | 0x0a => {
            let (lba, len) = rw6_range(cdb);
            format!("{name} LBA {lba} len {len}")
        }
        0x28 | 0x2a | 0x2e | 0x2f | 0x34 | 0x35 | 0x41 => {
            format!("{name} LBA {} len {}", be32(cdb, 2), be16(cdb, 7))
        }
        0xa8 | 0xaa | 0xae | 0xaf => {
            format!("{name} LBA {} len {}", be32(cdb, 2), be32(cdb, 6))
        }
        0x88 | 0x8a | 0x8e | 0x8f | 0x90 | 0x91 | 0x93 => {
            format!("{name} LBA {} len {}", be64(cdb, 2), be32(cdb, 10))
        }
        0x89 => format!(
            "{name} LBA {} len {}",
            be64(cdb, 2),
            cdb.get(13).copied().unwrap_or(0)
        ),
        0x12 => {
            let evpd = cdb.get(1).is_some_and(|b| b & 1 != 0);
            let page = cdb.get(2).copied().unwrap_or(0);
            let alloc = be16(cdb, 3);
            if evpd {
                format!("{name} VPD page 0x{page:02x} alloc {alloc}")
            } else {
                format!("{name} standard alloc {alloc}")
            }
        }
        0x1a => format!(
            "{name} page 0x{:02x} alloc {}",
            cdb.get(2).map_or(0, |p| p & 0x3f),
            cdb.get(4).copied().unwrap_or(0)
        ),
        0x5a => format!(
            "{name} page 0x{:02x} alloc {}",
            cdb.get(2).map_or(0, |p| p & 0x3f),
            be16(cdb, 7)
        ),
        0x9e => {
            let sa = cdb.get(1).map_or(0, |s| s & 0x1f);
            match sa {
                0x10 => format!("READ CAPACITY(16) alloc {}", be32(cdb, 10)),
                0x12 => format!("GET LBA STATUS LBA {}", be64(cdb, 2)),
                _ => format!("{name} service action 0x{sa:02x}"),
            }
        }
        0xa0 => format!("{name} alloc {}", be32(cdb, 6)),
        0x03 => format!("{name} alloc {}", cdb.get(4).copied().unwrap_or(0)),
        0x7f => describe_osd(cdb),
        0x5e | 0x5f => format!(
            "{name} service action 0x{:02x}",
            cdb.get(1).map_or(0, |s| s & 0x1f)
        ),
        _ => name,
    }
}

/// An OSD-2 command (variable-length CDB): its service action and the object it names.
fn describe_osd(cdb: &[u8]) -> String {
    use osd::cdb::ServiceAction as A;
    let Ok(c) = osd::cdb::Cdb::parse(cdb) else {
        return format!("VARIABLE LENGTH service action 0x{:04x}", be16(cdb, 8));
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
    let text = s.asc_name().map(|t| format!(" ({t})")).unwrap_or_default();
    format!(
        "{} ASC/ASCQ 0x{:02x}/0x{:02x}{text}",
        s.key_name(),
        s.asc,
        s.ascq
    )
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
            "ILLEGAL REQUEST ASC/ASCQ 0x24/0x00 (invalid field in CDB)"
        );
        assert_eq!(
            describe_sense(&[0x72, 0x06, 0x29, 0x01]),
            "UNIT ATTENTION ASC/ASCQ 0x29/0x01 (power on occurred)"
        );
        assert_eq!(
            describe_sense(&[0x70]),
            "NO SENSE ASC/ASCQ 0x00/0x00 (no additional sense information)"
        );
    }
}
