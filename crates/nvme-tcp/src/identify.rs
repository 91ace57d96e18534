//! The Identify data structures (4 KiB each) a controller returns and a host reads: the
//! controller's (CNS 01h), a namespace's (CNS 00h), the active namespace ID list (CNS 02h)
//! and a namespace's identification descriptors (CNS 03h), with the fields NVMe over
//! Fabrics uses at their NVM Express Base 2.0 offsets.

use crate::le::{get16, get32, put16, put32};

/// Bytes of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// Controller type (CNTRLTYPE, byte 111).
pub mod cntrltype {
    /// An I/O controller.
    pub const IO: u8 = 1;
    /// A discovery controller.
    pub const DISCOVERY: u8 = 2;
}

/// ONCS bit: Compare.
pub const ONCS_COMPARE: u16 = 1 << 0;
/// ONCS bit: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// FUSES bit: fused Compare and Write.
pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;
/// SGLS bits 1:0 = 01b: SGLs supported, no alignment requirement.
pub const SGLS_SUPPORTED: u32 = 1;
/// SGLS bit 2: Keyed SGL Data Block descriptors (RDMA; not NVMe/TCP's).
pub const SGLS_KEYED: u32 = 1 << 2;
/// SGLS bit 20: the Address field of SGL Data Block descriptors may be an offset (in-capsule
/// data).
pub const SGLS_OFFSET: u32 = 1 << 20;
/// OAES bit 8: Namespace Attribute Notices.
pub const OAES_NS_ATTRIBUTE: u32 = 1 << 8;
/// OAES bit 31: Discovery Log Page Change Notification.
pub const OAES_DISCOVERY_CHANGE: u32 = 1 << 31;
/// VER of NVM Express 1.3.
pub const VERSION_1_3: u32 = 0x0001_0300;

/// The Identify Controller data structure's fields used here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    /// PCI vendor ID.
    pub vid: u16,
    /// Serial number (20 ASCII characters, space padded).
    pub sn: String,
    /// Model number (40).
    pub mn: String,
    /// Firmware revision (8).
    pub fr: String,
    /// Maximum data transfer size as a power of two of the minimum page size (4 KiB); 0 no
    /// limit.
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (as the VS register).
    pub ver: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// Controller type.
    pub cntrltype: u8,
    /// Abort command limit (0's based).
    pub acl: u8,
    /// Asynchronous event request limit (0's based).
    pub aerl: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries (0's based).
    pub elpe: u8,
    /// Keep alive support: granularity in 100 ms units (0: not supported).
    pub kas: u16,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (highest NSID).
    pub nn: u32,
    /// Optional NVM command support.
    pub oncs: u16,
    /// Fused operations supported.
    pub fuses: u16,
    /// Volatile write cache present (bit 0).
    pub vwc: u8,
    /// SGL support.
    pub sgls: u32,
    /// NVM subsystem NQN.
    pub subnqn: String,
    /// I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    /// In-capsule data offset, in 16-byte units.
    pub icdoff: u16,
    /// Maximum SGL data block descriptors.
    pub msdbd: u8,
}

fn put_ascii(b: &mut [u8], s: &str) {
    b.fill(b' ');
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn put_nul(b: &mut [u8], s: &str) {
    b.fill(0);
    let n = s.len().min(b.len() - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

impl IdentifyController {
    /// The 4096 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0; IDENTIFY_LEN];
        put16(&mut b, 0, self.vid);
        put16(&mut b, 2, self.vid);
        put_ascii(&mut b[4..24], &self.sn);
        put_ascii(&mut b[24..64], &self.mn);
        put_ascii(&mut b[64..72], &self.fr);
        b[77] = self.mdts;
        put16(&mut b, 78, self.cntlid);
        put32(&mut b, 80, self.ver);
        put32(&mut b, 92, self.oaes);
        b[111] = self.cntrltype;
        b[258] = self.acl;
        b[259] = self.aerl;
        b[261] = self.lpa;
        b[262] = self.elpe;
        put16(&mut b, 320, self.kas);
        // SQES/CQES: required and maximum entry sizes 64 and 16 bytes.
        b[512] = 0x66;
        b[513] = 0x44;
        put16(&mut b, 514, self.maxcmd);
        put32(&mut b, 516, self.nn);
        put16(&mut b, 520, self.oncs);
        put16(&mut b, 522, self.fuses);
        b[525] = self.vwc;
        put32(&mut b, 536, self.sgls);
        put_nul(&mut b[768..1024], &self.subnqn);
        put32(&mut b, 1792, self.ioccsz);
        put32(&mut b, 1796, self.iorcsz);
        put16(&mut b, 1800, self.icdoff);
        b[1803] = self.msdbd;
        b
    }

    /// The fields of 4096 bytes (shorter input: `None`).
    pub fn parse(b: &[u8]) -> Option<IdentifyController> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        Some(IdentifyController {
            vid: get16(b, 0),
            sn: ascii(&b[4..24]),
            mn: ascii(&b[24..64]),
            fr: ascii(&b[64..72]),
            mdts: b[77],
            cntlid: get16(b, 78),
            ver: get32(b, 80),
            oaes: get32(b, 92),
            cntrltype: b[111],
            acl: b[258],
            aerl: b[259],
            lpa: b[261],
            elpe: b[262],
            kas: get16(b, 320),
            maxcmd: get16(b, 514),
            nn: get32(b, 516),
            oncs: get16(b, 520),
            fuses: get16(b, 522),
            vwc: b[525],
            sgls: get32(b, 536),
            subnqn: ascii(&b[768..1024]),
            ioccsz: get32(b, 1792),
            iorcsz: get32(b, 1796),
            icdoff: get16(b, 1800),
            msdbd: b[1803],
        })
    }
}

/// NSFEAT bit 0: thin provisioning (NUSE may be below NCAP; deallocation).
pub const NSFEAT_THIN: u8 = 1;
/// DLFEAT: deallocated blocks read as zeroes (bits 2:0 = 001b) and Write Zeroes may
/// deallocate (bit 3).
pub const DLFEAT_ZEROES: u8 = 0b1001;
/// NSATTR bit 0: the namespace is write protected.
pub const NSATTR_WRITE_PROTECTED: u8 = 1;

/// The Identify Namespace data structure's fields used here (one LBA format, no metadata).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    /// Namespace capacity.
    pub ncap: u64,
    /// Namespace utilization.
    pub nuse: u64,
    /// Namespace features.
    pub nsfeat: u8,
    /// Namespace multi-path and sharing (bit 0: may be attached to several controllers).
    pub nmic: u8,
    /// Deallocate logical block features.
    pub dlfeat: u8,
    /// Namespace attributes.
    pub nsattr: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
    /// LBA data size of the one LBA format, as a power of two.
    pub lbads: u8,
}

impl IdentifyNamespace {
    /// The 4096 bytes (NLBAF 0, FLBAS 0: LBA format 0 in use).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0; IDENTIFY_LEN];
        b[0..8].copy_from_slice(&self.nsze.to_le_bytes());
        b[8..16].copy_from_slice(&self.ncap.to_le_bytes());
        b[16..24].copy_from_slice(&self.nuse.to_le_bytes());
        b[24] = self.nsfeat;
        b[30] = self.nmic;
        b[33] = self.dlfeat;
        b[99] = self.nsattr;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        put32(&mut b, 128, u32::from(self.lbads) << 16);
        b
    }

    /// The fields of 4096 bytes (shorter input: `None`); LBADS is LBA format FLBAS's.
    pub fn parse(b: &[u8]) -> Option<IdentifyNamespace> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        let u64at = |at: usize| u64::from(get32(b, at)) | (u64::from(get32(b, at + 4)) << 32);
        let flbas = usize::from(b[26] & 0xF);
        let mut nguid = [0; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0; 8];
        eui64.copy_from_slice(&b[120..128]);
        Some(IdentifyNamespace {
            nsze: u64at(0),
            ncap: u64at(8),
            nuse: u64at(16),
            nsfeat: b[24],
            nmic: b[30],
            dlfeat: b[33],
            nsattr: b[99],
            nguid,
            eui64,
            lbads: (get32(b, 128 + 4 * flbas) >> 16) as u8,
        })
    }
}

/// The active namespace ID list: the IDs above `after`, ascending, at most 1024.
pub fn active_ns_list(nsids: impl IntoIterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut ids: Vec<u32> = nsids.into_iter().filter(|&n| n > after).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut b = vec![0; IDENTIFY_LEN];
    for (i, id) in ids.into_iter().take(IDENTIFY_LEN / 4).enumerate() {
        put32(&mut b, i * 4, id);
    }
    b
}

/// Namespace identifier type: IEEE EUI-64.
pub const NIDT_EUI64: u8 = 1;
/// Namespace identifier type: NGUID.
pub const NIDT_NGUID: u8 = 2;
/// Namespace identifier type: UUID.
pub const NIDT_UUID: u8 = 3;
/// Namespace identifier type: command set identifier.
pub const NIDT_CSI: u8 = 4;

/// The namespace identification descriptor list: (type, identifier) pairs in order.
pub fn ns_descriptors(ids: &[(u8, &[u8])]) -> Vec<u8> {
    let mut b = Vec::with_capacity(IDENTIFY_LEN);
    for (t, id) in ids {
        if b.len() + 4 + id.len() > IDENTIFY_LEN || id.len() > 255 {
            break;
        }
        b.extend_from_slice(&[*t, id.len() as u8, 0, 0]);
        b.extend_from_slice(id);
    }
    b.resize(IDENTIFY_LEN, 0);
    b
}

/// The (type, identifier) pairs of a namespace identification descriptor list.
pub fn parse_ns_descriptors(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() && b[at] != 0 {
        let len = usize::from(b[at + 1]);
        let Some(id) = b.get(at + 4..at + 4 + len) else {
            break;
        };
        out.push((b[at], id.to_vec()));
        at += 4 + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_round_trips() {
        let c = IdentifyController {
            vid: 0x1d1d,
            sn: "0123456789abcdef".into(),
            mn: "ironsan".into(),
            fr: "0.1".into(),
            mdts: 8,
            cntlid: 7,
            ver: VERSION_1_3,
            oaes: OAES_NS_ATTRIBUTE,
            cntrltype: cntrltype::IO,
            kas: 1,
            maxcmd: 128,
            nn: 4,
            oncs: ONCS_DSM | ONCS_WRITE_ZEROES,
            sgls: SGLS_SUPPORTED | SGLS_OFFSET,
            subnqn: "nqn.2026-01.org.example:s".into(),
            ioccsz: 516,
            iorcsz: 1,
            msdbd: 1,
            ..Default::default()
        };
        let b = c.to_bytes();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[24..31], b"ironsan");
        assert_eq!(b[31], b' ');
        assert_eq!(IdentifyController::parse(&b), Some(c));
        assert_eq!(IdentifyController::parse(&b[..100]), None);
    }

    #[test]
    fn namespace_round_trips() {
        let n = IdentifyNamespace {
            nsze: 1 << 20,
            ncap: 1 << 20,
            nuse: 1 << 20,
            nsfeat: NSFEAT_THIN,
            nguid: [7; 16],
            eui64: [9; 8],
            lbads: 12,
            ..Default::default()
        };
        let b = n.to_bytes();
        assert_eq!(b[130], 12);
        assert_eq!(IdentifyNamespace::parse(&b), Some(n));
    }

    #[test]
    fn lists() {
        let b = active_ns_list([3, 1, 2, 1], 1);
        assert_eq!(&b[..12], &[2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        let d = ns_descriptors(&[(NIDT_EUI64, &[1; 8]), (NIDT_NGUID, &[2; 16])]);
        assert_eq!(
            parse_ns_descriptors(&d),
            vec![(NIDT_EUI64, vec![1; 8]), (NIDT_NGUID, vec![2; 16])]
        );
        assert!(parse_ns_descriptors(&[1, 200, 0, 0, 5]).is_empty());
    }
}
