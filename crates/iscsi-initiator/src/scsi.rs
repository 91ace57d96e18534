//! SCSI commands the initiator helpers issue: CDB builders (READ/WRITE choosing the 10- or
//! 16-byte form by LBA and length) and parsers for the data they return. Operation codes,
//! status codes and sense data are `scsi-spec`'s, re-exported here.

/// Status codes and decoded sense data with readable names: the shared SCSI vocabulary,
/// so the target builds and the capture analyzer names them the same way.
pub use scsi_spec::{sense::key as sense_key, status, Sense};

/// Operation codes: the shared vocabulary's.
pub use scsi_spec::cdb::op;

pub fn test_unit_ready() -> Vec<u8> {
    vec![op::TEST_UNIT_READY, 0, 0, 0, 0, 0]
}

/// INQUIRY: the standard page (`page = None`) or a VPD page.
pub fn inquiry(page: Option<u8>, alloc: u16) -> Vec<u8> {
    let a = alloc.to_be_bytes();
    match page {
        None => vec![op::INQUIRY, 0, 0, a[0], a[1], 0],
        Some(p) => vec![op::INQUIRY, 1, p, a[0], a[1], 0],
    }
}

pub fn read_capacity10() -> Vec<u8> {
    vec![op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

pub fn read_capacity16(alloc: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    c[1] = op::SA_READ_CAPACITY_16;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

pub fn report_luns(alloc: u32) -> Vec<u8> {
    let mut c = vec![0u8; 12];
    c[0] = op::REPORT_LUNS;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ or WRITE of `blocks` blocks at `lba`: the 10-byte form when the LBA fits 32 bits
/// and the length 16 bits, the 16-byte form otherwise. `fua` sets Force Unit Access.
pub fn read_write(write: bool, lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    let flags = if fua { 0x08 } else { 0 };
    if lba <= u32::MAX as u64 && blocks <= u16::MAX as u32 {
        let mut c = vec![0u8; 10];
        c[0] = if write { op::WRITE_10 } else { op::READ_10 };
        c[1] = flags;
        c[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
        c[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
        c
    } else {
        let mut c = vec![0u8; 16];
        c[0] = if write { op::WRITE_16 } else { op::READ_16 };
        c[1] = flags;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
        c
    }
}

/// SYNCHRONIZE CACHE of the whole medium (10- or 16-byte form as the range needs).
pub fn synchronize_cache(lba: u64, blocks: u32) -> Vec<u8> {
    if lba <= u32::MAX as u64 && blocks <= u16::MAX as u32 {
        let mut c = vec![0u8; 10];
        c[0] = op::SYNC_CACHE_10;
        c[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
        c[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
        c
    } else {
        let mut c = vec![0u8; 16];
        c[0] = op::SYNC_CACHE_16;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
        c
    }
}

/// UNMAP CDB and its parameter list for the given (LBA, blocks) extents.
pub fn unmap(extents: &[(u64, u32)]) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 8 + 16 * extents.len()];
    let n = (16 * extents.len()) as u16;
    p[0..2].copy_from_slice(&(n + 6).to_be_bytes());
    p[2..4].copy_from_slice(&n.to_be_bytes());
    for (i, (lba, len)) in extents.iter().enumerate() {
        let at = 8 + 16 * i;
        p[at..at + 8].copy_from_slice(&lba.to_be_bytes());
        p[at + 8..at + 12].copy_from_slice(&len.to_be_bytes());
    }
    let mut c = vec![0u8; 10];
    c[0] = op::UNMAP;
    c[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
    (c, p)
}

/// Capacity of a logical unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub blocks: u64,
    pub block_size: u32,
    /// Logical block provisioning management enabled (thin provisioning).
    pub thin: bool,
}

impl Capacity {
    pub fn bytes(&self) -> u64 {
        self.blocks * self.block_size as u64
    }

    /// READ CAPACITY(10) data.
    pub fn parse10(b: &[u8]) -> Option<Capacity> {
        if b.len() < 8 {
            return None;
        }
        let last = u32::from_be_bytes(b[0..4].try_into().ok()?) as u64;
        Some(Capacity {
            blocks: last + 1,
            block_size: u32::from_be_bytes(b[4..8].try_into().ok()?),
            thin: false,
        })
    }

    /// READ CAPACITY(16) data.
    pub fn parse16(b: &[u8]) -> Option<Capacity> {
        if b.len() < 12 {
            return None;
        }
        let last = u64::from_be_bytes(b[0..8].try_into().ok()?);
        Some(Capacity {
            blocks: last.checked_add(1)?,
            block_size: u32::from_be_bytes(b[8..12].try_into().ok()?),
            thin: b.len() > 14 && b[14] & 0x80 != 0,
        })
    }
}

/// The standard INQUIRY data fields people look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    pub peripheral_qualifier: u8,
    pub device_type: u8,
    pub removable: bool,
    pub version: u8,
    pub vendor: String,
    pub product: String,
    pub revision: String,
}

/// Text of an ASCII field without its padding: trailing spaces, and trailing NULs too (LIO
/// counts a NUL terminator in the length of its unit serial number page).
fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_string()
}

impl Inquiry {
    pub fn parse(b: &[u8]) -> Option<Inquiry> {
        if b.len() < 36 {
            return None;
        }
        Some(Inquiry {
            peripheral_qualifier: b[0] >> 5,
            device_type: b[0] & 0x1f,
            removable: b[1] & 0x80 != 0,
            version: b[2],
            vendor: ascii(&b[8..16]),
            product: ascii(&b[16..32]),
            revision: ascii(&b[32..36]),
        })
    }

    pub fn device_type_name(&self) -> &'static str {
        match self.device_type {
            0x00 => "direct access block device",
            0x01 => "sequential access device",
            0x05 => "CD/DVD device",
            0x0c => "storage array controller",
            0x0d => "enclosure services device",
            0x11 => "object-based storage device (OSD)",
            0x1f => "unknown or no device",
            _ => "other device type",
        }
    }
}

/// LUN numbers from REPORT LUNS data.
pub fn parse_report_luns(b: &[u8]) -> Option<Vec<u16>> {
    if b.len() < 8 {
        return None;
    }
    let len = u32::from_be_bytes(b[0..4].try_into().ok()?) as usize;
    let avail = (b.len() - 8).min(len) / 8;
    Some(
        (0..avail)
            .map(|i| {
                let raw = u64::from_be_bytes(b[8 + 8 * i..16 + 8 * i].try_into().expect("8"));
                iscsi_wire::lun_from_wire(raw)
            })
            .collect(),
    )
}

/// Page codes listed by the Supported VPD Pages page (0x00).
pub fn parse_vpd_page_list(b: &[u8]) -> Vec<u8> {
    if b.len() < 4 {
        return Vec::new();
    }
    let n = u16::from_be_bytes([b[2], b[3]]) as usize;
    b[4..].iter().take(n).copied().collect()
}

/// The unit serial number (VPD page 0x80).
pub fn parse_unit_serial(b: &[u8]) -> Option<String> {
    if b.len() < 4 || b[1] != 0x80 {
        return None;
    }
    let n = u16::from_be_bytes([b[2], b[3]]) as usize;
    Some(ascii(&b[4..(4 + n).min(b.len())]).trim().to_string())
}

/// How many times a command is sent while it ends in UNIT ATTENTION.
pub const UNIT_ATTENTION_TRIES: usize = 6;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unit_serial_without_padding() {
        // LIO's page 0x80: the length counts a NUL after the serial number.
        let mut lio = vec![0x00, 0x80, 0x00, 0x25];
        lio.extend_from_slice(b"db7bc58a-2344-464d-ad4a-407fc79302aa\0");
        assert_eq!(
            parse_unit_serial(&lio).as_deref(),
            Some("db7bc58a-2344-464d-ad4a-407fc79302aa")
        );
        let padded = [0x00, 0x80, 0x00, 0x06, b' ', b'S', b'N', b'1', b' ', b' '];
        assert_eq!(parse_unit_serial(&padded).as_deref(), Some("SN1"));
    }

    #[test]
    fn ten_or_sixteen() {
        let c = read_write(false, 100, 8, false);
        assert_eq!(c, vec![0x28, 0, 0, 0, 0, 100, 0, 0, 8, 0]);
        let c = read_write(true, 1 << 33, 8, true);
        assert_eq!(c[0], 0x8a);
        assert_eq!(c[1], 0x08);
        assert_eq!(u64::from_be_bytes(c[2..10].try_into().unwrap()), 1 << 33);
        // 16 MiB of 512-byte blocks does not fit READ(10)'s 16-bit length.
        let c = read_write(false, 0, 32768, false);
        assert_eq!(c[0], 0x28);
        let c = read_write(false, 0, 65536, false);
        assert_eq!(c[0], 0x88);
        assert_eq!(u32::from_be_bytes(c[10..14].try_into().unwrap()), 65536);
    }

    #[test]
    fn capacity_and_luns() {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&((1u64 << 21) - 1).to_be_bytes());
        b[8..12].copy_from_slice(&512u32.to_be_bytes());
        b[14] = 0x80;
        let c = Capacity::parse16(&b).unwrap();
        assert_eq!((c.blocks, c.block_size, c.thin), (1 << 21, 512, true));
        assert_eq!(c.bytes(), 1 << 30);
        let mut r = vec![0u8; 24];
        r[3] = 16;
        r[8..16].copy_from_slice(&iscsi_wire::lun_to_wire(0).to_be_bytes());
        r[16..24].copy_from_slice(&iscsi_wire::lun_to_wire(300).to_be_bytes());
        assert_eq!(parse_report_luns(&r).unwrap(), vec![0, 300]);
    }

    #[test]
    fn unmap_list() {
        let (c, p) = unmap(&[(8, 16)]);
        assert_eq!(c[0], 0x42);
        assert_eq!(u16::from_be_bytes([c[7], c[8]]), 24);
        assert_eq!(u16::from_be_bytes([p[0], p[1]]), 22);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 16);
        assert_eq!(u64::from_be_bytes(p[8..16].try_into().unwrap()), 8);
        assert_eq!(u32::from_be_bytes(p[16..20].try_into().unwrap()), 16);
    }

    proptest! {
        #[test]
        fn rw_cdb_round_trip(lba in any::<u64>(), blocks in any::<u32>(), write in any::<bool>()) {
            let c = read_write(write, lba, blocks, false);
            let (got_lba, got_blocks) = if c.len() == 10 {
                (u32::from_be_bytes(c[2..6].try_into().unwrap()) as u64,
                 u16::from_be_bytes([c[7], c[8]]) as u32)
            } else {
                (u64::from_be_bytes(c[2..10].try_into().unwrap()),
                 u32::from_be_bytes(c[10..14].try_into().unwrap()))
            };
            prop_assert_eq!((got_lba, got_blocks), (lba, blocks));
        }

        #[test]
        fn parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Sense::parse(&b);
            let _ = Capacity::parse16(&b);
            let _ = Capacity::parse10(&b);
            let _ = Inquiry::parse(&b);
            let _ = parse_report_luns(&b);
            let _ = parse_vpd_page_list(&b);
            let _ = parse_unit_serial(&b);
        }
    }
}
