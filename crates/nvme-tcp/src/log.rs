//! Log pages (Get Log Page): the identifiers, the command's fields, the SMART / Health
//! Information page, the Changed Namespace List, and the Discovery log page with its
//! entries (NVMe over Fabrics 1.1).

use crate::le::{get16, get32, put16, put32};
use crate::sqe::Sqe;

/// Log page: Error Information (64 bytes an entry).
pub const LID_ERROR: u8 = 0x01;
/// Log page: SMART / Health Information (512 bytes).
pub const LID_SMART: u8 = 0x02;
/// Log page: Changed Namespace List (4096 bytes).
pub const LID_CHANGED_NS: u8 = 0x04;
/// Log page: Discovery (NVMe over Fabrics).
pub const LID_DISCOVERY: u8 = 0x70;

/// Bytes of one Error Information entry.
pub const ERROR_ENTRY_LEN: usize = 64;
/// Bytes of the SMART / Health Information page.
pub const SMART_LEN: usize = 512;
/// Bytes of the Changed Namespace List.
pub const CHANGED_NS_LEN: usize = 4096;
/// Bytes of the discovery log page's header, and of each entry.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

/// The fields of a Get Log Page command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    /// Log page identifier.
    pub lid: u8,
    /// Log specific field.
    pub lsp: u8,
    /// Retain Asynchronous Event: reading does not clear the event.
    pub rae: bool,
    /// Bytes asked for (NUMD + 1 dwords).
    pub len: u64,
    /// Byte offset into the page.
    pub offset: u64,
}

impl GetLogPage {
    /// The fields of `sqe` (a Get Log Page command).
    pub fn parse(sqe: &Sqe) -> GetLogPage {
        let (c10, c11) = (sqe.cdw(10), sqe.cdw(11));
        let numd = u64::from(c10 >> 16) | (u64::from(c11 & 0xFFFF) << 16);
        GetLogPage {
            lid: c10 as u8,
            lsp: ((c10 >> 8) & 0x7F) as u8,
            rae: c10 & (1 << 15) != 0,
            len: (numd + 1) * 4,
            offset: u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32),
        }
    }

    /// A Get Log Page command for `len` bytes (a multiple of 4, at least 4) of `lid` from
    /// `offset`.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(crate::sqe::admin::GET_LOG_PAGE, cid);
        s.set_nsid(0xFFFF_FFFF);
        let numd = (self.len / 4).saturating_sub(1);
        s.set_cdw(
            10,
            u32::from(self.lid)
                | (u32::from(self.lsp & 0x7F) << 8)
                | (u32::from(self.rae) << 15)
                | ((numd as u32 & 0xFFFF) << 16),
        );
        s.set_cdw(11, (numd >> 16) as u32 & 0xFFFF);
        s.set_cdw(12, self.offset as u32);
        s.set_cdw(13, (self.offset >> 32) as u32);
        s.set_sgl(crate::sqe::SglDescriptor::transport(self.len as u32));
        s
    }
}

/// The SMART / Health Information fields kept here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Smart {
    /// Composite temperature in kelvins.
    pub temperature: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Available spare threshold, percent.
    pub spare_threshold: u8,
    /// Data units (1000 blocks of 512 bytes) read.
    pub data_units_read: u64,
    /// Data units written.
    pub data_units_written: u64,
    /// Read commands completed.
    pub host_reads: u64,
    /// Write commands completed.
    pub host_writes: u64,
}

impl Smart {
    /// The 512 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0; SMART_LEN];
        put16(&mut b, 1, self.temperature);
        b[3] = self.available_spare;
        b[4] = self.spare_threshold;
        for (at, v) in [
            (32, self.data_units_read),
            (48, self.data_units_written),
            (64, self.host_reads),
            (80, self.host_writes),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// The Changed Namespace List: up to 1024 NSIDs (more: the first entry FFFFFFFFh).
pub fn changed_ns_list(nsids: &[u32]) -> Vec<u8> {
    let mut b = vec![0; CHANGED_NS_LEN];
    if nsids.len() > CHANGED_NS_LEN / 4 {
        put32(&mut b, 0, 0xFFFF_FFFF);
        return b;
    }
    for (i, n) in nsids.iter().enumerate() {
        put32(&mut b, i * 4, *n);
    }
    b
}

/// Transport type of a discovery entry: TCP.
pub const TRTYPE_TCP: u8 = 3;
/// Address family: IPv4.
pub const ADRFAM_IPV4: u8 = 1;
/// Address family: IPv6.
pub const ADRFAM_IPV6: u8 = 2;
/// Subsystem type: a discovery subsystem (referral).
pub const SUBTYPE_DISCOVERY: u8 = 1;
/// Subsystem type: an NVM subsystem.
pub const SUBTYPE_NVME: u8 = 2;
/// TREQ: secure channel not required.
pub const TREQ_NOT_REQUIRED: u8 = 0x02;

/// One discovery log page entry: where an NVM subsystem is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type.
    pub trtype: u8,
    /// Address family.
    pub adrfam: u8,
    /// Subsystem type.
    pub subtype: u8,
    /// Transport requirements.
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (FFFFh: dynamic).
    pub cntlid: u16,
    /// Admin submission queue size the host may use.
    pub asqsz: u16,
    /// Transport service ID: the port, in ASCII.
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address: the IP address, in ASCII.
    pub traddr: String,
}

fn put_str(b: &mut [u8], s: &str) {
    let n = s.len().min(b.len().saturating_sub(1));
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

impl DiscoveryEntry {
    /// The 1024 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0; DISCOVERY_RECORD_LEN];
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put16(&mut b, 4, self.portid);
        put16(&mut b, 6, self.cntlid);
        put16(&mut b, 8, self.asqsz);
        put_str(&mut b[32..64], &self.trsvcid);
        put_str(&mut b[256..512], &self.subnqn);
        put_str(&mut b[512..768], &self.traddr);
        b
    }

    /// The fields of 1024 bytes (shorter: `None`).
    pub fn parse(b: &[u8]) -> Option<DiscoveryEntry> {
        if b.len() < DISCOVERY_RECORD_LEN {
            return None;
        }
        Some(DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: get16(b, 4),
            cntlid: get16(b, 6),
            asqsz: get16(b, 8),
            trsvcid: get_str(&b[32..64]),
            subnqn: get_str(&b[256..512]),
            traddr: get_str(&b[512..768]),
        })
    }
}

/// The whole discovery log page: the header (generation counter, number of records,
/// record format 0), then the entries.
pub fn discovery_page(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0; DISCOVERY_RECORD_LEN];
    b[0..8].copy_from_slice(&genctr.to_le_bytes());
    b[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        b.extend_from_slice(&e.to_bytes());
    }
    b
}

/// The generation counter and entries of a discovery log page (as many whole entries as
/// `b` holds).
pub fn parse_discovery_page(b: &[u8]) -> Option<(u64, Vec<DiscoveryEntry>)> {
    if b.len() < DISCOVERY_RECORD_LEN {
        return None;
    }
    let genctr = u64::from(get32(b, 0)) | (u64::from(get32(b, 4)) << 32);
    let n = u64::from(get32(b, 8)) | (u64::from(get32(b, 12)) << 32);
    let entries = b[DISCOVERY_RECORD_LEN..]
        .chunks_exact(DISCOVERY_RECORD_LEN)
        .take(n.min(4096) as usize)
        .filter_map(DiscoveryEntry::parse)
        .collect();
    Some((genctr, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_log_page_round_trips() {
        let g = GetLogPage {
            lid: LID_DISCOVERY,
            lsp: 0,
            rae: true,
            len: 4096 * 70,
            offset: 1024,
        };
        assert_eq!(GetLogPage::parse(&g.to_sqe(3)), g);
    }

    #[test]
    fn discovery_round_trips() {
        let e = DiscoveryEntry {
            trtype: TRTYPE_TCP,
            adrfam: ADRFAM_IPV4,
            subtype: SUBTYPE_NVME,
            treq: TREQ_NOT_REQUIRED,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-01.org.example:s".into(),
            traddr: "127.0.0.1".into(),
        };
        let page = discovery_page(5, &[e.clone(), e.clone()]);
        assert_eq!(page.len(), 3 * 1024);
        assert_eq!(parse_discovery_page(&page), Some((5, vec![e.clone(), e])));
        assert_eq!(parse_discovery_page(&page[..10]), None);
    }

    #[test]
    fn changed_list_overflows_to_ffffffff() {
        assert_eq!(&changed_ns_list(&[1, 2])[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
        let many: Vec<u32> = (1..=1025).collect();
        assert_eq!(&changed_ns_list(&many)[..4], &[0xFF; 4]);
        assert_eq!(Smart::default().to_bytes().len(), 512);
    }
}
