//! OSD-2 CDBs: the 236-byte variable-length CDB (opcode 0x7F, ADDITIONAL CDB
//! LENGTH 228), parsed into [`Cdb`] and encoded back for an initiator.

use crate::offset::{raw_of, Offset};
use crate::sense::SenseCode;

/// Total OSD-2 CDB length.
pub const CDB_LEN: usize = 236;
/// The variable-length CDB operation code.
pub const OPCODE: u8 = 0x7F;
/// ADDITIONAL CDB LENGTH of an OSD-2 CDB.
pub const ADDITIONAL_CDB_LENGTH: u8 = 228;
/// Where the 104-byte capability starts.
pub const CAPABILITY_AT: usize = 80;

/// Field offsets used in sense field pointers.
pub mod field {
    pub const ADDITIONAL_CDB_LENGTH: u16 = 7;
    pub const SERVICE_ACTION: u16 = 8;
    pub const OPTIONS: u16 = 10;
    pub const ATTRIBUTE_FORMAT: u16 = 11;
    pub const PARTITION_ID: u16 = 16;
    pub const OBJECT_ID: u16 = 24;
    pub const LENGTH: u16 = 32;
    pub const STARTING_ADDRESS: u16 = 40;
    pub const ATTRIBUTE_PARAMETERS: u16 = 52;
    pub const CAPABILITY_FORMAT: u16 = 80;
    pub const SECURITY_METHOD: u16 = 82;
    pub const CAPABILITY_OBJECT_TYPE: u16 = 128;
    pub const ALLOWED_PARTITION_ID: u16 = 152;
    pub const ALLOWED_OBJECT_ID: u16 = 160;
}

/// The OSD-2 service actions this crate knows (code = 0x8880 + n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceAction {
    FormatOsd,
    Create,
    List,
    Punch,
    Read,
    Write,
    Append,
    Flush,
    Clear,
    Remove,
    CreatePartition,
    RemovePartition,
    GetAttributes,
    SetAttributes,
    CreateCollection,
    RemoveCollection,
    ListCollection,
    FlushCollection,
    FlushPartition,
    FlushOsd,
}

const ACTIONS: [(ServiceAction, u16, &str); 20] = [
    (ServiceAction::FormatOsd, 0x8881, "FORMAT OSD"),
    (ServiceAction::Create, 0x8882, "CREATE"),
    (ServiceAction::List, 0x8883, "LIST"),
    (ServiceAction::Punch, 0x8884, "PUNCH"),
    (ServiceAction::Read, 0x8885, "READ"),
    (ServiceAction::Write, 0x8886, "WRITE"),
    (ServiceAction::Append, 0x8887, "APPEND"),
    (ServiceAction::Flush, 0x8888, "FLUSH"),
    (ServiceAction::Clear, 0x8889, "CLEAR"),
    (ServiceAction::Remove, 0x888A, "REMOVE"),
    (ServiceAction::CreatePartition, 0x888B, "CREATE PARTITION"),
    (ServiceAction::RemovePartition, 0x888C, "REMOVE PARTITION"),
    (ServiceAction::GetAttributes, 0x888E, "GET ATTRIBUTES"),
    (ServiceAction::SetAttributes, 0x888F, "SET ATTRIBUTES"),
    (ServiceAction::CreateCollection, 0x8895, "CREATE COLLECTION"),
    (ServiceAction::RemoveCollection, 0x8896, "REMOVE COLLECTION"),
    (ServiceAction::ListCollection, 0x8897, "LIST COLLECTION"),
    (ServiceAction::FlushCollection, 0x889A, "FLUSH COLLECTION"),
    (ServiceAction::FlushPartition, 0x889B, "FLUSH PARTITION"),
    (ServiceAction::FlushOsd, 0x889C, "FLUSH OSD"),
];

impl ServiceAction {
    /// The SERVICE ACTION field value.
    pub fn code(self) -> u16 {
        ACTIONS
            .iter()
            .find(|(a, _, _)| *a == self)
            .map_or(0, |(_, c, _)| *c)
    }

    /// The action for a SERVICE ACTION value, if supported.
    pub fn from_code(code: u16) -> Option<ServiceAction> {
        ACTIONS
            .iter()
            .find(|(_, c, _)| *c == code)
            .map(|(a, _, _)| *a)
    }

    /// The command's name in the standard ("CREATE PARTITION").
    pub fn name(self) -> &'static str {
        ACTIONS
            .iter()
            .find(|(a, _, _)| *a == self)
            .map_or("", |(_, _, n)| n)
    }
}

/// Get/set attribute parameters (CDB bytes 52..80), by the format in byte 11 bits 5..4.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AttrParams {
    /// Format 0: no attributes requested.
    #[default]
    None,
    /// Format 0x10: set one attribute whose value (≤ 18 bytes) is in the CDB.
    SetOne {
        page: u32,
        number: u32,
        value: Vec<u8>,
    },
    /// Format 0x20: get one whole page, set one attribute from data-out.
    Page {
        get_page: u32,
        alloc_len: u32,
        retrieved_offset: Option<Offset>,
        set_page: u32,
        set_number: u32,
        set_len: u32,
        set_offset: Option<Offset>,
    },
    /// Format 0x30: get list and set list in data-out, retrieved list in data-in.
    List {
        get_list_len: u32,
        get_list_offset: Option<Offset>,
        alloc_len: u32,
        retrieved_offset: Option<Offset>,
        set_list_len: u32,
        set_list_offset: Option<Offset>,
    },
}

impl AttrParams {
    fn format(&self) -> u8 {
        match self {
            AttrParams::None => 0x00,
            AttrParams::SetOne { .. } => 0x10,
            AttrParams::Page { .. } => 0x20,
            AttrParams::List { .. } => 0x30,
        }
    }
}

/// Object types in a capability (and in the current command page).
pub mod object_type {
    pub const ROOT: u8 = 0x01;
    pub const PARTITION: u8 = 0x02;
    pub const COLLECTION: u8 = 0x40;
    pub const USER: u8 = 0x80;
}

/// The capability fields this logical unit looks at (the rest encode as zero).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capability {
    /// Byte 0 low nibble: 0 none, 1 or 2 a capability is present.
    pub format: u8,
    /// Byte 2 low nibble: 0 NOSEC, 1 CAPKEY, 2 CMDRSP, 3 ALLDATA.
    pub security_method: u8,
    /// Byte 48.
    pub object_type: u8,
    /// Bytes 49..54.
    pub permissions: [u8; 5],
    /// Byte 55 high nibble: 1 object, 2 partition/root, 3 collection.
    pub descriptor_type: u8,
    /// Bytes 72..80 of the capability.
    pub allowed_partition: u64,
    /// Bytes 80..88 of the capability.
    pub allowed_object: u64,
}

impl Capability {
    /// A NOSEC capability with every permission, for the given object.
    pub fn nosec_all(partition: u64, object: u64, collection: bool) -> Capability {
        let (object_type, descriptor_type) = match (partition, object) {
            (0, _) => (object_type::ROOT, 2),
            (_, 0) => (object_type::PARTITION, 2),
            _ if collection => (object_type::COLLECTION, 3),
            _ => (object_type::USER, 1),
        };
        Capability {
            format: 1,
            security_method: 0,
            object_type,
            // READ..APPEND in the first byte, DEV_MGMT/GLOBAL/POL_SEC in the second.
            permissions: [0xFF, 0xE0, 0, 0, 0],
            descriptor_type,
            allowed_partition: partition,
            allowed_object: object,
        }
    }

    fn parse(c: &[u8]) -> Capability {
        Capability {
            format: c[0] & 0x0F,
            security_method: c[2] & 0x0F,
            object_type: c[48],
            permissions: [c[49], c[50], c[51], c[52], c[53]],
            descriptor_type: c[55] >> 4,
            allowed_partition: be64(&c[72..80]),
            allowed_object: be64(&c[80..88]),
        }
    }

    fn encode(&self, c: &mut [u8]) {
        c[0] = self.format & 0x0F;
        c[2] = self.security_method & 0x0F;
        c[48] = self.object_type;
        c[49..54].copy_from_slice(&self.permissions);
        c[55] = self.descriptor_type << 4;
        c[72..80].copy_from_slice(&self.allowed_partition.to_be_bytes());
        c[80..88].copy_from_slice(&self.allowed_object.to_be_bytes());
    }
}

/// A parsed OSD-2 CDB. Fields that a service action does not use are zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cdb {
    pub action: ServiceAction,
    /// Byte 10: DPO 0x10, FUA 0x08, isolation bits 2..0 (FLUSH*: the flush scope).
    pub options: u8,
    /// Byte 11 without the attribute format bits (sort order, LIST ATTR, FCR, remove scope).
    pub command_options: u8,
    /// Byte 12: 0 update timestamps, 0x7F bypass.
    pub timestamp_control: u8,
    pub partition: u64,
    /// User object or collection id (requested id for CREATE*).
    pub object: u64,
    /// Bytes 32..40: LENGTH, allocation length (LIST), formatted capacity (FORMAT OSD);
    /// CREATE keeps its NUMBER OF USER OBJECTS in the top two bytes.
    pub length: u64,
    /// Bytes 40..48: STARTING BYTE ADDRESS, or initial object id (LIST).
    pub start: u64,
    /// Bytes 48..52: list identifier (LIST) or CDB continuation length.
    pub list_id: u32,
    pub attrs: AttrParams,
    pub capability: Capability,
}

impl Cdb {
    /// A CDB for `action` on (partition, object) with a NOSEC all-permission capability.
    pub fn new(action: ServiceAction, partition: u64, object: u64) -> Cdb {
        let collection = matches!(
            action,
            ServiceAction::CreateCollection
                | ServiceAction::RemoveCollection
                | ServiceAction::ListCollection
                | ServiceAction::FlushCollection
        );
        Cdb {
            action,
            options: 0,
            command_options: 0,
            timestamp_control: 0,
            partition,
            object,
            length: 0,
            start: 0,
            list_id: 0,
            attrs: AttrParams::None,
            capability: Capability::nosec_all(partition, object, collection),
        }
    }

    /// CREATE's NUMBER OF USER OBJECTS (bytes 32..34); zero means one.
    pub fn number_of_objects(&self) -> u16 {
        (self.length >> 48) as u16
    }

    /// Parses a CDB. Errors are the sense to report.
    pub fn parse(cdb: &[u8]) -> Result<Cdb, SenseCode> {
        if cdb.first() != Some(&OPCODE) {
            return Err(SenseCode::invalid_opcode());
        }
        // OSD-1's 200-byte CDB, a truncated one and a padded one all fail here.
        if cdb.len() < 8 || cdb[7] != ADDITIONAL_CDB_LENGTH || cdb.len() != CDB_LEN {
            return Err(SenseCode::invalid_field_in_cdb(
                field::ADDITIONAL_CDB_LENGTH,
            ));
        }
        let action = ServiceAction::from_code(be16(&cdb[8..10]))
            .ok_or(SenseCode::invalid_field_in_cdb(field::SERVICE_ACTION))?;
        Ok(Cdb {
            action,
            options: cdb[10],
            command_options: cdb[11] & !0x30,
            timestamp_control: cdb[12],
            partition: be64(&cdb[16..24]),
            object: be64(&cdb[24..32]),
            length: be64(&cdb[32..40]),
            start: be64(&cdb[40..48]),
            list_id: be32(&cdb[48..52]),
            attrs: parse_attr_params(cdb[11] & 0x30, &cdb[52..80])?,
            capability: Capability::parse(&cdb[CAPABILITY_AT..CAPABILITY_AT + 104]),
        })
    }

    /// The 236 wire bytes.
    pub fn encode(&self) -> [u8; CDB_LEN] {
        let mut b = [0u8; CDB_LEN];
        b[0] = OPCODE;
        b[7] = ADDITIONAL_CDB_LENGTH;
        b[8..10].copy_from_slice(&self.action.code().to_be_bytes());
        b[10] = self.options;
        b[11] = (self.command_options & !0x30) | self.attrs.format();
        b[12] = self.timestamp_control;
        b[16..24].copy_from_slice(&self.partition.to_be_bytes());
        b[24..32].copy_from_slice(&self.object.to_be_bytes());
        b[32..40].copy_from_slice(&self.length.to_be_bytes());
        b[40..48].copy_from_slice(&self.start.to_be_bytes());
        b[48..52].copy_from_slice(&self.list_id.to_be_bytes());
        encode_attr_params(&self.attrs, &mut b[52..80]);
        self.capability
            .encode(&mut b[CAPABILITY_AT..CAPABILITY_AT + 104]);
        // Integrity check value offsets are unused under NOSEC.
        b[228..232].copy_from_slice(&u32::MAX.to_be_bytes());
        b[232..236].copy_from_slice(&u32::MAX.to_be_bytes());
        b
    }
}

fn offset_at(p: &[u8], at: usize) -> Result<Option<Offset>, SenseCode> {
    Offset::decode(be32(&p[at..at + 4]))
        .map_err(|()| SenseCode::invalid_field_in_cdb(field::ATTRIBUTE_PARAMETERS + at as u16))
}

fn parse_attr_params(format: u8, p: &[u8]) -> Result<AttrParams, SenseCode> {
    Ok(match format {
        0x00 => AttrParams::None,
        0x10 => {
            let len = be16(&p[8..10]) as usize;
            if len > 18 {
                return Err(SenseCode::invalid_field_in_cdb(
                    field::ATTRIBUTE_PARAMETERS + 8,
                ));
            }
            AttrParams::SetOne {
                page: be32(&p[0..4]),
                number: be32(&p[4..8]),
                value: p[10..10 + len].to_vec(),
            }
        }
        0x20 => AttrParams::Page {
            get_page: be32(&p[0..4]),
            alloc_len: be32(&p[4..8]),
            retrieved_offset: offset_at(p, 8)?,
            set_page: be32(&p[12..16]),
            set_number: be32(&p[16..20]),
            set_len: be32(&p[20..24]),
            set_offset: offset_at(p, 24)?,
        },
        _ => AttrParams::List {
            get_list_len: be32(&p[0..4]),
            get_list_offset: offset_at(p, 4)?,
            alloc_len: be32(&p[8..12]),
            retrieved_offset: offset_at(p, 12)?,
            set_list_len: be32(&p[16..20]),
            set_list_offset: offset_at(p, 20)?,
        },
    })
}

fn encode_attr_params(attrs: &AttrParams, p: &mut [u8]) {
    let mut put = |at: usize, v: u32| p[at..at + 4].copy_from_slice(&v.to_be_bytes());
    match attrs {
        AttrParams::None => {}
        AttrParams::SetOne {
            page,
            number,
            value,
        } => {
            put(0, *page);
            put(4, *number);
            let len = value.len().min(18);
            p[8..10].copy_from_slice(&(len as u16).to_be_bytes());
            p[10..10 + len].copy_from_slice(&value[..len]);
        }
        AttrParams::Page {
            get_page,
            alloc_len,
            retrieved_offset,
            set_page,
            set_number,
            set_len,
            set_offset,
        } => {
            put(0, *get_page);
            put(4, *alloc_len);
            put(8, raw_of(*retrieved_offset));
            put(12, *set_page);
            put(16, *set_number);
            put(20, *set_len);
            put(24, raw_of(*set_offset));
        }
        AttrParams::List {
            get_list_len,
            get_list_offset,
            alloc_len,
            retrieved_offset,
            set_list_len,
            set_list_offset,
        } => {
            put(0, *get_list_len);
            put(4, raw_of(*get_list_offset));
            put(8, *alloc_len);
            put(12, raw_of(*retrieved_offset));
            put(16, *set_list_len);
            put(20, raw_of(*set_list_offset));
            put(24, 0);
        }
    }
}

pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_parse_round_trips() {
        let mut cdb = Cdb::new(ServiceAction::Write, 0x10000, 0x10003);
        cdb.length = 4096;
        cdb.start = 512;
        cdb.options = 0x08;
        cdb.attrs = AttrParams::List {
            get_list_len: 16,
            get_list_offset: Offset::from_bytes(4096),
            alloc_len: 256,
            retrieved_offset: Offset::from_bytes(0),
            set_list_len: 0,
            set_list_offset: None,
        };
        let bytes = cdb.encode();
        assert_eq!(bytes[0], 0x7F);
        assert_eq!(bytes[7], 228);
        assert_eq!(&bytes[8..10], &[0x88, 0x86]);
        assert_eq!(bytes[11] & 0x30, 0x30);
        assert_eq!(Cdb::parse(&bytes).unwrap(), cdb);
    }

    #[test]
    fn osd1_cdb_is_refused_at_byte_7() {
        let mut b = vec![0u8; 200];
        b[0] = 0x7F;
        b[7] = 192;
        b[8..10].copy_from_slice(&0x8805u16.to_be_bytes());
        let e = Cdb::parse(&b).unwrap_err();
        assert_eq!((e.key, e.asc, e.field), (5, 0x24, Some((true, 7))));
    }

    #[test]
    fn unknown_service_action_points_at_byte_8() {
        let mut b = Cdb::new(ServiceAction::Read, 0, 0).encode();
        b[8..10].copy_from_slice(&0x8805u16.to_be_bytes()); // OSD-1 READ
        let e = Cdb::parse(&b).unwrap_err();
        assert_eq!(e.field, Some((true, 8)));
    }

    #[test]
    fn every_action_code_round_trips() {
        for (a, c, name) in ACTIONS {
            assert_eq!(a.code(), c);
            assert_eq!(ServiceAction::from_code(c), Some(a));
            assert_eq!(a.name(), name);
        }
    }

    #[test]
    fn set_one_value_in_cdb() {
        let mut cdb = Cdb::new(ServiceAction::SetAttributes, 0x10000, 0x10000);
        cdb.attrs = AttrParams::SetOne {
            page: 0x10000,
            number: 7,
            value: b"hello".to_vec(),
        };
        let b = cdb.encode();
        assert_eq!(&b[60..62], &[0, 5]);
        assert_eq!(&b[62..67], b"hello");
        assert_eq!(Cdb::parse(&b).unwrap().attrs, cdb.attrs);
    }
}
