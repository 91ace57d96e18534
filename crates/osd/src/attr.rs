//! OSD-2 attribute lists (7.1.4): an 8-byte header (list type in the low nibble
//! of byte 0, list length u32 at 4) followed by get entries (type 0x1: page,
//! number) or value entries (type 0x9: page, number, 6 reserved, length u16,
//! value, padded to a multiple of 8).

use crate::cdb::{be16, be32};

/// List type of a get list (page/number pairs only).
pub const LIST_GET: u8 = 0x1;
/// List type of a set list or a retrieved list (entries with values).
pub const LIST_VALUES: u8 = 0x9;
/// Value length that marks an undefined attribute in a retrieved list.
pub const UNDEFINED_LEN: u16 = 0xFFFF;
/// Largest value an entry can carry.
pub const MAX_VALUE_LEN: usize = 0xFFFE;
/// Page or number meaning "all" in a get list.
pub const ALL: u32 = 0xFFFF_FFFF;

/// Attribute page numbers used by this logical unit.
pub mod page {
    pub const USER_INFO: u32 = 0x0000_0001;
    pub const USER_QUOTAS: u32 = 0x0000_0002;
    pub const USER_TIMESTAMPS: u32 = 0x0000_0003;
    pub const USER_COLLECTIONS: u32 = 0x0000_0004;
    pub const PARTITION_INFO: u32 = 0x3000_0001;
    pub const PARTITION_QUOTAS: u32 = 0x3000_0002;
    pub const PARTITION_TIMESTAMPS: u32 = 0x3000_0003;
    pub const COLLECTION_INFO: u32 = 0x6000_0001;
    pub const COLLECTION_TIMESTAMPS: u32 = 0x6000_0003;
    pub const ROOT_INFO: u32 = 0x9000_0001;
    pub const ROOT_QUOTAS: u32 = 0x9000_0002;
    pub const ROOT_TIMESTAMPS: u32 = 0x9000_0003;
    pub const CURRENT_COMMAND: u32 = 0xFFFF_FFFE;
}

/// Attribute numbers used by this logical unit.
pub mod number {
    pub const PAGE_IDENTIFICATION: u32 = 0x0;
    pub const PARTITION_ID: u32 = 0x1;
    pub const OBJECT_ID: u32 = 0x2;
    pub const USERNAME: u32 = 0x9;
    pub const USED_CAPACITY: u32 = 0x81;
    pub const LOGICAL_LENGTH: u32 = 0x82;
    pub const NUMBER_OF_OBJECTS: u32 = 0xC1;
    pub const ROOT_SYSTEM_ID: u32 = 0x3;
    pub const ROOT_VENDOR: u32 = 0x4;
    pub const ROOT_PRODUCT: u32 = 0x5;
    pub const ROOT_TOTAL_CAPACITY: u32 = 0x80;
    pub const ROOT_NUMBER_OF_PARTITIONS: u32 = 0xC0;
    pub const ROOT_CLOCK: u32 = 0x100;
    pub const MAXIMUM_LENGTH: u32 = 0x1;
    pub const CAPACITY_QUOTA: u32 = 0x10001;
    pub const OBJECT_COUNT_QUOTA: u32 = 0x10002;
    pub const CREATED_TIME: u32 = 0x1;
    pub const ATTRIBUTES_ACCESSED_TIME: u32 = 0x2;
    pub const ATTRIBUTES_MODIFIED_TIME: u32 = 0x3;
    pub const DATA_ACCESSED_TIME: u32 = 0x4;
    pub const DATA_MODIFIED_TIME: u32 = 0x5;
    pub const CC_OBJECT_TYPE: u32 = 0x2;
    pub const CC_PARTITION_ID: u32 = 0x3;
    pub const CC_OBJECT_ID: u32 = 0x4;
    pub const CC_APPEND_ADDRESS: u32 = 0x5;
}

/// An attribute name: (page, number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttrId {
    pub page: u32,
    pub number: u32,
}

/// An attribute and its value; `None` is an undefined attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    pub page: u32,
    pub number: u32,
    pub value: Option<Vec<u8>>,
}

impl Attribute {
    /// A defined attribute.
    pub fn new(page: u32, number: u32, value: impl Into<Vec<u8>>) -> Attribute {
        Attribute {
            page,
            number,
            value: Some(value.into()),
        }
    }
}

/// Why a list could not be decoded; `at` is the byte offset in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed attribute list at byte {at}")]
pub struct ListError {
    pub at: usize,
}

/// Encodes a get list.
pub fn encode_get_list(ids: &[AttrId]) -> Vec<u8> {
    let mut out = header(LIST_GET, ids.len() * 8);
    for id in ids {
        out.extend_from_slice(&id.page.to_be_bytes());
        out.extend_from_slice(&id.number.to_be_bytes());
    }
    out
}

/// Encodes a set or retrieved list. Values longer than 0xFFFE bytes are cut.
pub fn encode_value_list(attrs: &[Attribute]) -> Vec<u8> {
    let mut out = header(LIST_VALUES, 0);
    for a in attrs {
        encode_entry(a, &mut out);
    }
    let len = (out.len() - 8) as u32;
    out[4..8].copy_from_slice(&len.to_be_bytes());
    out
}

fn encode_entry(a: &Attribute, out: &mut Vec<u8>) {
    out.extend_from_slice(&a.page.to_be_bytes());
    out.extend_from_slice(&a.number.to_be_bytes());
    out.extend_from_slice(&[0; 6]);
    match &a.value {
        None => out.extend_from_slice(&UNDEFINED_LEN.to_be_bytes()),
        Some(v) => {
            let v = &v[..v.len().min(MAX_VALUE_LEN)];
            out.extend_from_slice(&(v.len() as u16).to_be_bytes());
            out.extend_from_slice(v);
            out.resize(out.len().next_multiple_of(8), 0);
        }
    }
}

fn header(list_type: u8, len: usize) -> Vec<u8> {
    let mut out = vec![list_type, 0, 0, 0];
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out
}

/// The entries' bytes of a list of `want` type, bounded by its length field.
fn body(buf: &[u8], want: u8) -> Result<&[u8], ListError> {
    if buf.len() < 8 {
        return Err(ListError { at: 0 });
    }
    if buf[0] & 0x0F != want {
        return Err(ListError { at: 0 });
    }
    let len = be32(&buf[4..8]) as usize;
    // Initiators may leave the length zero (the target sets it): then the buffer bounds it.
    let end = if len == 0 { buf.len() } else { 8 + len };
    buf.get(8..end).ok_or(ListError { at: 4 })
}

/// Decodes a get list.
pub fn decode_get_list(buf: &[u8]) -> Result<Vec<AttrId>, ListError> {
    let entries = body(buf, LIST_GET)?;
    if entries.len() % 8 != 0 {
        return Err(ListError { at: 4 });
    }
    Ok(entries
        .chunks_exact(8)
        .map(|e| AttrId {
            page: be32(&e[0..4]),
            number: be32(&e[4..8]),
        })
        .collect())
}

/// Decodes a set or retrieved list.
pub fn decode_value_list(buf: &[u8]) -> Result<Vec<Attribute>, ListError> {
    let entries = body(buf, LIST_VALUES)?;
    let mut out = Vec::new();
    let mut at = 0;
    while at < entries.len() {
        let e = entries.get(at..at + 16).ok_or(ListError { at: 8 + at })?;
        let len = be16(&e[14..16]);
        let (value, used) = if len == UNDEFINED_LEN {
            (None, 16)
        } else {
            let end = at + 16 + len as usize;
            let v = entries
                .get(at + 16..end)
                .ok_or(ListError { at: 8 + at + 14 })?;
            (Some(v.to_vec()), (16 + len as usize).next_multiple_of(8))
        };
        out.push(Attribute {
            page: be32(&e[0..4]),
            number: be32(&e[4..8]),
            value,
        });
        // A retrieved list cut at the allocation length may lack the last pad.
        at = (at + used).min(entries.len());
    }
    Ok(out)
}

/// Decodes a retrieved list that may have been cut at the allocation length
/// (its length field still counts the whole list): the complete entries.
pub fn decode_retrieved_list(buf: &[u8]) -> Result<Vec<Attribute>, ListError> {
    if buf.len() < 8 || buf[0] & 0x0F != LIST_VALUES {
        return Err(ListError { at: 0 });
    }
    let mut whole = buf.to_vec();
    let len = (be32(&buf[4..8]) as usize).min(buf.len() - 8);
    // Drop a trailing entry the cut left incomplete.
    let mut complete = 0;
    while complete + 16 <= len {
        let value_len = be16(&whole[8 + complete + 14..8 + complete + 16]);
        let entry = match value_len {
            UNDEFINED_LEN => 16,
            n => 16 + n as usize,
        };
        if complete + entry > len {
            break;
        }
        complete = (complete + entry.next_multiple_of(8)).min(len);
    }
    whole[4..8].copy_from_slice(&(complete as u32).to_be_bytes());
    whole.truncate(8 + complete);
    decode_value_list(&whole)
}

/// The 40-byte page identification (attribute 0 of every page): vendor, then page name.
pub fn page_identification(name: &str) -> Vec<u8> {
    let mut v = b"IRONSAN ".to_vec();
    let mut n = name.as_bytes().to_vec();
    n.resize(32, b' ');
    v.extend_from_slice(&n);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_list_round_trips_with_padding() {
        let attrs = vec![
            Attribute::new(0x10000, 1, b"abc".to_vec()),
            Attribute::new(0x10000, 2, vec![1; 8]),
            Attribute {
                page: 1,
                number: 9,
                value: None,
            },
        ];
        let bytes = encode_value_list(&attrs);
        assert_eq!(bytes[0], 0x9);
        assert_eq!(bytes.len(), 8 + 24 + 24 + 16);
        assert_eq!(be32(&bytes[4..8]) as usize, bytes.len() - 8);
        assert_eq!(&bytes[8 + 14..8 + 16], &[0, 3]);
        assert_eq!(decode_value_list(&bytes).unwrap(), attrs);
    }

    #[test]
    fn get_list_round_trips() {
        let ids = [
            AttrId {
                page: 1,
                number: 0x82,
            },
            AttrId { page: 2, number: 1 },
        ];
        let bytes = encode_get_list(&ids);
        assert_eq!(&bytes[..8], &[1, 0, 0, 0, 0, 0, 0, 16]);
        assert_eq!(decode_get_list(&bytes).unwrap(), ids);
    }

    #[test]
    fn malformed_lists_are_errors() {
        assert!(decode_get_list(&[1, 0, 0]).is_err());
        assert!(decode_get_list(&[9, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode_get_list(&[1, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0]).is_err());
        let mut v = encode_value_list(&[Attribute::new(1, 1, vec![0; 20])]);
        v.truncate(30);
        assert!(decode_value_list(&v).is_err());
        // An entry claiming more value bytes than the list holds.
        let mut w = encode_value_list(&[Attribute::new(1, 1, vec![0; 4])]);
        w[8 + 15] = 200;
        assert!(decode_value_list(&w).is_err());
    }

    #[test]
    fn a_cut_retrieved_list_yields_its_complete_entries() {
        let attrs = vec![
            Attribute::new(1, 1, vec![1; 8]),
            Attribute::new(1, 2, vec![2; 30]),
        ];
        let bytes = encode_value_list(&attrs);
        assert_eq!(decode_retrieved_list(&bytes).unwrap(), attrs);
        let cut = &bytes[..8 + 24 + 20];
        assert!(decode_value_list(cut).is_err());
        assert_eq!(decode_retrieved_list(cut).unwrap(), attrs[..1]);
        // Exactly the entries without the last pad.
        let unpadded = &bytes[..bytes.len() - 2];
        assert_eq!(decode_retrieved_list(unpadded).unwrap(), attrs);
    }

    #[test]
    fn page_identification_is_40_bytes() {
        assert_eq!(page_identification("x").len(), 40);
    }
}
