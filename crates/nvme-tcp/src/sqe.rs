//! The 64-byte submission queue entry as a typed view, its SGL descriptor, the opcodes of
//! the admin, NVM and Fabrics command sets, and the Fabrics commands' fields (Connect and
//! its 1 KiB data, Property Get/Set, the controller registers they address).

use crate::le::{get16, get32, put16, put32};

/// Bytes of a submission queue entry.
pub const SQE_LEN: usize = 64;

/// A submission queue entry (a command), little-endian fields at fixed offsets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe([u8; SQE_LEN]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("flags", &format_args!("{:#04x}", self.flags()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("sgl", &self.sgl())
            .field("cdw10_15", &[10, 11, 12, 13, 14, 15].map(|i| self.cdw(i)))
            .finish()
    }
}

/// Fused operation of a command (flags bits 1:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fuse {
    /// A normal command.
    Normal,
    /// First command of a fused operation (Compare of Compare-and-Write).
    First,
    /// Second command of a fused operation (Write of Compare-and-Write).
    Second,
    /// The reserved value 11b.
    Reserved,
}

/// Where a command's data goes, from its opcode's bits 1:0 (Fabrics: FCTYPE's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// No data.
    None,
    /// Host to controller (a write).
    HostToController,
    /// Controller to host (a read).
    ControllerToHost,
    /// Both (not used by NVMe/TCP commands).
    Bidirectional,
}

impl DataDirection {
    fn from_bits(b: u8) -> DataDirection {
        match b & 3 {
            0 => DataDirection::None,
            1 => DataDirection::HostToController,
            2 => DataDirection::ControllerToHost,
            _ => DataDirection::Bidirectional,
        }
    }
}

/// PSDT (flags bits 7:6): PRPs, or SGLs. NVMe over Fabrics uses SGLs only.
pub const PSDT_SGL_MPTR_CONTIGUOUS: u8 = 0b01;
/// PSDT: SGL, metadata pointer to a segment.
pub const PSDT_SGL_MPTR_SGL: u8 = 0b10;

/// SGL descriptor identifier (type in bits 7:4, sub type 3:0) of in-capsule data: a Data
/// Block descriptor with the Offset sub type.
pub const SGL_INCAPSULE: u8 = 0x01;
/// SGL descriptor identifier of data moved by the transport (R2T/H2CData, C2HData): a
/// Transport Data Block descriptor with the transport-specific sub type Ah.
pub const SGL_TRANSPORT: u8 = 0x5A;

/// The 16-byte SGL descriptor of a command's data pointer (SGL1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SglDescriptor {
    /// Address, or for in-capsule data the offset into the capsule's data.
    pub address: u64,
    /// Length of the data.
    pub length: u32,
    /// Descriptor identifier: type in bits 7:4, sub type in bits 3:0.
    pub id: u8,
}

impl SglDescriptor {
    /// In-capsule data of `length` bytes at offset 0.
    pub fn in_capsule(length: u32) -> SglDescriptor {
        SglDescriptor {
            address: 0,
            length,
            id: SGL_INCAPSULE,
        }
    }

    /// `length` bytes moved by R2T/H2CData or C2HData.
    pub fn transport(length: u32) -> SglDescriptor {
        SglDescriptor {
            address: 0,
            length,
            id: SGL_TRANSPORT,
        }
    }
}

impl Default for Sqe {
    fn default() -> Sqe {
        Sqe([0; SQE_LEN])
    }
}

impl Sqe {
    /// A command with `opcode` and `cid`, SGL data pointer (PSDT 01b), everything else 0.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        s.0[1] = PSDT_SGL_MPTR_CONTIGUOUS << 6;
        s.set_cid(cid);
        s
    }

    /// The entry from its bytes.
    pub fn from_bytes(b: [u8; SQE_LEN]) -> Sqe {
        Sqe(b)
    }

    /// The entry's bytes.
    pub fn as_bytes(&self) -> &[u8; SQE_LEN] {
        &self.0
    }

    /// Opcode (CDW0 bits 7:0).
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// Flags byte (CDW0 bits 15:8): FUSE and PSDT.
    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    /// The fused operation bits.
    pub fn fuse(&self) -> Fuse {
        match self.0[1] & 3 {
            0 => Fuse::Normal,
            1 => Fuse::First,
            2 => Fuse::Second,
            _ => Fuse::Reserved,
        }
    }

    /// Sets the fused operation bits.
    pub fn set_fuse(&mut self, fuse: Fuse) {
        let v = match fuse {
            Fuse::Normal => 0,
            Fuse::First => 1,
            Fuse::Second => 2,
            Fuse::Reserved => 3,
        };
        self.0[1] = (self.0[1] & !3) | v;
    }

    /// PSDT (flags bits 7:6).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// Command identifier.
    pub fn cid(&self) -> u16 {
        get16(&self.0, 2)
    }

    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        put16(&mut self.0, 2, cid);
    }

    /// Namespace identifier.
    pub fn nsid(&self) -> u32 {
        get32(&self.0, 4)
    }

    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, nsid: u32) {
        put32(&mut self.0, 4, nsid);
    }

    /// Command dword `i` (0 to 15).
    pub fn cdw(&self, i: usize) -> u32 {
        get32(&self.0, (i % 16) * 4)
    }

    /// Sets command dword `i` (10 to 15 are the command's own; 0 to 9 have fields above).
    pub fn set_cdw(&mut self, i: usize, v: u32) {
        put32(&mut self.0, (i % 16) * 4, v);
    }

    /// The SGL descriptor of the data pointer (bytes 24 to 39).
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor {
            address: u64::from(get32(&self.0, 24)) | (u64::from(get32(&self.0, 28)) << 32),
            length: get32(&self.0, 32),
            id: self.0[39],
        }
    }

    /// Sets the SGL descriptor.
    pub fn set_sgl(&mut self, d: SglDescriptor) {
        put32(&mut self.0, 24, d.address as u32);
        put32(&mut self.0, 28, (d.address >> 32) as u32);
        put32(&mut self.0, 32, d.length);
        self.0[36..39].fill(0);
        self.0[39] = d.id;
    }

    /// Where the command's data goes.
    pub fn direction(&self) -> DataDirection {
        if self.opcode() == fabrics::OPCODE {
            DataDirection::from_bits(self.fctype())
        } else {
            DataDirection::from_bits(self.opcode())
        }
    }

    /// Fabrics command type (byte 4 of a command with opcode 7Fh).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Starting LBA of an NVM Read, Write, Compare or Write Zeroes (CDW10-11).
    pub fn slba(&self) -> u64 {
        u64::from(self.cdw(10)) | (u64::from(self.cdw(11)) << 32)
    }

    /// Number of logical blocks of an NVM Read, Write, Compare or Write Zeroes (CDW12 bits
    /// 15:0 are 0's based; this is the count).
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xFFFF) + 1
    }

    /// Force Unit Access (CDW12 bit 30).
    pub fn fua(&self) -> bool {
        self.cdw(12) & (1 << 30) != 0
    }

    /// An NVM Read or Write (or Compare) of `blocks` (1 to 65536) from `slba`.
    pub fn rw(opcode: u8, cid: u16, nsid: u32, slba: u64, blocks: u32) -> Sqe {
        let mut s = Sqe::new(opcode, cid);
        s.set_nsid(nsid);
        s.set_cdw(10, slba as u32);
        s.set_cdw(11, (slba >> 32) as u32);
        s.set_cdw(12, blocks.saturating_sub(1) & 0xFFFF);
        s
    }
}

/// Admin command opcodes.
pub mod admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;

    /// Identify CNS (CDW10 bits 7:0): a namespace's data structure.
    pub const CNS_NAMESPACE: u8 = 0x00;
    /// Identify CNS: the controller's data structure.
    pub const CNS_CONTROLLER: u8 = 0x01;
    /// Identify CNS: the active namespace ID list.
    pub const CNS_ACTIVE_NSIDS: u8 = 0x02;
    /// Identify CNS: a namespace's identification descriptors.
    pub const CNS_NS_DESCRIPTORS: u8 = 0x03;

    /// Feature identifier (CDW10 bits 7:0): Volatile Write Cache.
    pub const FEAT_VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Feature identifier: Number of Queues.
    pub const FEAT_NUMBER_OF_QUEUES: u8 = 0x07;
    /// Feature identifier: Asynchronous Event Configuration.
    pub const FEAT_ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// Feature identifier: Keep Alive Timer.
    pub const FEAT_KEEP_ALIVE_TIMER: u8 = 0x0F;

    /// The name of an admin opcode.
    pub fn name(opcode: u8) -> Option<&'static str> {
        Some(match opcode {
            GET_LOG_PAGE => "Get Log Page",
            IDENTIFY => "Identify",
            ABORT => "Abort",
            SET_FEATURES => "Set Features",
            GET_FEATURES => "Get Features",
            ASYNC_EVENT_REQUEST => "Asynchronous Event Request",
            KEEP_ALIVE => "Keep Alive",
            super::fabrics::OPCODE => "Fabrics",
            _ => return None,
        })
    }
}

/// NVM command set opcodes.
pub mod nvm {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare (the first command of a fused Compare-and-Write).
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management (deallocate ranges).
    pub const DATASET_MANAGEMENT: u8 = 0x09;

    /// Dataset Management CDW11 bit 2: deallocate the ranges.
    pub const DSM_DEALLOCATE: u32 = 1 << 2;
    /// Bytes of one Dataset Management range (attributes, length in blocks, SLBA).
    pub const DSM_RANGE_LEN: usize = 16;

    /// The name of an NVM opcode.
    pub fn name(opcode: u8) -> Option<&'static str> {
        Some(match opcode {
            FLUSH => "Flush",
            WRITE => "Write",
            READ => "Read",
            COMPARE => "Compare",
            WRITE_ZEROES => "Write Zeroes",
            DATASET_MANAGEMENT => "Dataset Management",
            super::fabrics::OPCODE => "Fabrics",
            _ => return None,
        })
    }

    /// One Dataset Management range.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DsmRange {
        /// Context attributes.
        pub attributes: u32,
        /// Length in logical blocks.
        pub blocks: u32,
        /// Starting LBA.
        pub slba: u64,
    }

    /// The ranges in a Dataset Management command's data (a trailing partial range is
    /// ignored).
    pub fn dsm_ranges(data: &[u8]) -> impl Iterator<Item = DsmRange> + '_ {
        data.chunks_exact(DSM_RANGE_LEN).map(|r| DsmRange {
            attributes: super::get32(r, 0),
            blocks: super::get32(r, 4),
            slba: u64::from(super::get32(r, 8)) | (u64::from(super::get32(r, 12)) << 32),
        })
    }
}

/// The Fabrics command set (opcode 7Fh, FCTYPE in byte 4).
pub mod fabrics {
    use super::{get16, get32, put16, put32, Sqe};

    /// The opcode of every Fabrics command.
    pub const OPCODE: u8 = 0x7F;
    /// FCTYPE Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// FCTYPE Connect.
    pub const CONNECT: u8 = 0x01;
    /// FCTYPE Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// FCTYPE Disconnect.
    pub const DISCONNECT: u8 = 0x08;

    /// Bytes of the Connect command's data.
    pub const CONNECT_DATA_LEN: usize = 1024;
    /// Connect CATTR bit 2: SQ flow control disabled (the host ignores SQHD).
    pub const CATTR_SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;
    /// Connect CNTLID asking for any controller of the dynamic model.
    pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

    /// Controller register offsets (Property Get/Set).
    pub mod reg {
        /// Controller Capabilities (8 bytes).
        pub const CAP: u32 = 0x00;
        /// Version (4 bytes).
        pub const VS: u32 = 0x08;
        /// Controller Configuration (4 bytes).
        pub const CC: u32 = 0x14;
        /// Controller Status (4 bytes).
        pub const CSTS: u32 = 0x1C;
        /// NVM Subsystem Reset (4 bytes).
        pub const NSSR: u32 = 0x20;
    }

    /// The name of an FCTYPE.
    pub fn name(fctype: u8) -> Option<&'static str> {
        Some(match fctype {
            PROPERTY_SET => "Property Set",
            CONNECT => "Connect",
            PROPERTY_GET => "Property Get",
            DISCONNECT => "Disconnect",
            _ => return None,
        })
    }

    /// The fields of a Connect command.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Connect {
        /// Record format (0).
        pub recfmt: u16,
        /// Queue to create: 0 the admin queue, else an I/O queue.
        pub qid: u16,
        /// Submission queue size, 0's based.
        pub sqsize: u16,
        /// Connect attributes (bit 2: SQ flow control disabled).
        pub cattr: u8,
        /// Keep Alive Timeout in milliseconds (admin queue).
        pub kato: u32,
    }

    impl Connect {
        /// The fields of `sqe` (any command; the caller checks opcode and FCTYPE).
        pub fn parse(sqe: &Sqe) -> Connect {
            let b = sqe.as_bytes();
            Connect {
                recfmt: get16(b, 40),
                qid: get16(b, 42),
                sqsize: get16(b, 44),
                cattr: b[46],
                kato: get32(b, 48),
            }
        }

        /// A Connect command with these fields, its 1 KiB of data in the capsule.
        pub fn to_sqe(&self, cid: u16) -> Sqe {
            let mut s = Sqe::new(OPCODE, cid);
            let b = &mut s.0;
            b[4] = CONNECT;
            put16(b, 40, self.recfmt);
            put16(b, 42, self.qid);
            put16(b, 44, self.sqsize);
            b[46] = self.cattr;
            put32(b, 48, self.kato);
            s.set_sgl(super::SglDescriptor::in_capsule(CONNECT_DATA_LEN as u32));
            s
        }

        /// SQ flow control is off: the controller may end reads with SUCCESS.
        pub fn sq_flow_control_disabled(&self) -> bool {
            self.cattr & CATTR_SQ_FLOW_CONTROL_DISABLE != 0
        }
    }

    /// The 1 KiB of data of a Connect command.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ConnectData {
        /// Host identifier.
        pub hostid: [u8; 16],
        /// Controller ID asked for (FFFFh: any, dynamic model).
        pub cntlid: u16,
        /// NVM subsystem NQN.
        pub subnqn: String,
        /// Host NQN.
        pub hostnqn: String,
    }

    /// Why Connect data is not valid.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum ConnectDataError {
        /// Not 1024 bytes.
        #[error("Connect data is {0} bytes, not 1024")]
        Length(usize),
        /// An NQN is not UTF-8 or not NUL-terminated within its 256 bytes.
        #[error("the {0} is not a NUL-terminated UTF-8 string")]
        Nqn(&'static str),
    }

    fn nqn(field: &[u8], what: &'static str) -> Result<String, ConnectDataError> {
        let end = field
            .iter()
            .position(|&b| b == 0)
            .ok_or(ConnectDataError::Nqn(what))?;
        std::str::from_utf8(&field[..end])
            .map(str::to_owned)
            .map_err(|_| ConnectDataError::Nqn(what))
    }

    impl ConnectData {
        /// Parses the data of a Connect command.
        pub fn parse(data: &[u8]) -> Result<ConnectData, ConnectDataError> {
            if data.len() != CONNECT_DATA_LEN {
                return Err(ConnectDataError::Length(data.len()));
            }
            let mut hostid = [0; 16];
            hostid.copy_from_slice(&data[..16]);
            Ok(ConnectData {
                hostid,
                cntlid: get16(data, 16),
                subnqn: nqn(&data[256..512], "subsystem NQN")?,
                hostnqn: nqn(&data[512..768], "host NQN")?,
            })
        }

        /// The 1024 bytes (NQNs longer than 255 bytes are cut).
        pub fn to_bytes(&self) -> Vec<u8> {
            let mut b = vec![0; CONNECT_DATA_LEN];
            b[..16].copy_from_slice(&self.hostid);
            put16(&mut b, 16, self.cntlid);
            for (at, s) in [(256, &self.subnqn), (512, &self.hostnqn)] {
                let n = s.len().min(255);
                b[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
            }
            b
        }
    }

    /// Property Get or Set: the register, its size, and (Set) the value.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Property {
        /// Register offset.
        pub offset: u32,
        /// 8-byte access (ATTRIB bits 2:0 = 1), else 4 bytes.
        pub eight_bytes: bool,
        /// Value written (Property Set).
        pub value: u64,
    }

    impl Property {
        /// The fields of a Property Get/Set command.
        pub fn parse(sqe: &Sqe) -> Property {
            let b = sqe.as_bytes();
            Property {
                eight_bytes: b[40] & 7 == 1,
                offset: get32(b, 44),
                value: u64::from(get32(b, 48)) | (u64::from(get32(b, 52)) << 32),
            }
        }

        /// A Property Get (`fctype` PROPERTY_GET) or Set (PROPERTY_SET) command.
        pub fn to_sqe(&self, fctype: u8, cid: u16) -> Sqe {
            let mut s = Sqe::new(OPCODE, cid);
            let b = &mut s.0;
            b[4] = fctype;
            b[40] = u8::from(self.eight_bytes);
            put32(b, 44, self.offset);
            put32(b, 48, self.value as u32);
            put32(b, 52, (self.value >> 32) as u32);
            s
        }
    }
}
