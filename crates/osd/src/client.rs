//! The initiator side: a CDB plus the data-out each command needs, and parsers
//! for what comes back (LIST data, retrieved attribute lists, the current
//! command page).

use crate::attr::{self, number as n, page, AttrId, Attribute};
use crate::cdb::{be32, be64, AttrParams, Cdb, ServiceAction as A};
use crate::offset::Offset;

/// Data-in room asked for when a command retrieves the current command page.
const CURRENT_COMMAND_ROOM: u32 = 128;
/// Attribute lists are placed at multiples of 256 bytes, whose offsets any
/// decoder (even one applying OSD-1's unsigned exponent) reads the same.
const LIST_ALIGN: u64 = 256;

/// One command to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub cdb: Cdb,
    pub data_out: Vec<u8>,
    /// Expected data-in length (for bidirectional commands, the read length).
    pub data_in_len: u32,
}

impl Request {
    fn new(action: A, partition: u64, object: u64) -> Request {
        Request {
            cdb: Cdb::new(action, partition, object),
            data_out: Vec::new(),
            data_in_len: 0,
        }
    }

    /// Also retrieve `ids` (a get list), placed after this command's own data-in.
    pub fn get_list(mut self, ids: &[AttrId], alloc_len: u32) -> Request {
        let list = attr::encode_get_list(ids);
        let list_at = self.data_out.len() as u64;
        let list_at = list_at.next_multiple_of(LIST_ALIGN);
        self.data_out.resize(list_at as usize, 0);
        self.data_out.extend_from_slice(&list);
        let retrieved_at = u64::from(self.data_in_len).next_multiple_of(LIST_ALIGN);
        self.cdb.attrs = AttrParams::List {
            get_list_len: list.len() as u32,
            get_list_offset: Offset::from_bytes(list_at),
            alloc_len,
            retrieved_offset: Offset::from_bytes(retrieved_at),
            set_list_len: 0,
            set_list_offset: None,
        };
        self.data_in_len = retrieved_at as u32 + alloc_len;
        self
    }

    /// Also retrieve one whole page, placed after this command's own data-in.
    pub fn get_page(mut self, page_no: u32, alloc_len: u32) -> Request {
        let retrieved_at = u64::from(self.data_in_len).next_multiple_of(LIST_ALIGN);
        self.cdb.attrs = AttrParams::Page {
            get_page: page_no,
            alloc_len,
            retrieved_offset: Offset::from_bytes(retrieved_at),
            set_page: 0,
            set_number: 0,
            set_len: 0,
            set_offset: None,
        };
        self.data_in_len = retrieved_at as u32 + alloc_len;
        self
    }

    /// Where the retrieved attributes start in data-in, if any are asked for.
    pub fn retrieved_at(&self) -> Option<usize> {
        match &self.cdb.attrs {
            AttrParams::Page {
                retrieved_offset, ..
            }
            | AttrParams::List {
                retrieved_offset, ..
            } => retrieved_offset.map(|o| o.bytes() as usize),
            _ => None,
        }
    }
}

/// FORMAT OSD with the given capacity (0 keeps the configured one).
pub fn format(capacity: u64) -> Request {
    let mut r = Request::new(A::FormatOsd, 0, 0);
    r.cdb.length = capacity;
    r
}

/// CREATE PARTITION (`partition` 0: the device chooses; the current command page tells).
pub fn create_partition(partition: u64) -> Request {
    Request::new(A::CreatePartition, partition, 0)
        .get_page(page::CURRENT_COMMAND, CURRENT_COMMAND_ROOM)
}

pub fn remove_partition(partition: u64) -> Request {
    Request::new(A::RemovePartition, partition, 0)
}

/// CREATE `count` user objects (`object` 0: the device chooses; the current
/// command page names the last one created).
pub fn create(partition: u64, object: u64, count: u16) -> Request {
    let mut r = Request::new(A::Create, partition, object);
    r.cdb.length = u64::from(count) << 48;
    r.get_page(page::CURRENT_COMMAND, CURRENT_COMMAND_ROOM)
}

pub fn create_collection(partition: u64, collection: u64) -> Request {
    Request::new(A::CreateCollection, partition, collection)
        .get_page(page::CURRENT_COMMAND, CURRENT_COMMAND_ROOM)
}

pub fn remove(partition: u64, object: u64) -> Request {
    Request::new(A::Remove, partition, object)
}

/// REMOVE COLLECTION; `force` removes it even with members (FCR).
pub fn remove_collection(partition: u64, collection: u64, force: bool) -> Request {
    let mut r = Request::new(A::RemoveCollection, partition, collection);
    r.cdb.command_options = u8::from(force);
    r
}

pub fn write(partition: u64, object: u64, offset: u64, data: &[u8]) -> Request {
    let mut r = Request::new(A::Write, partition, object);
    r.cdb.length = data.len() as u64;
    r.cdb.start = offset;
    r.data_out = data.to_vec();
    r
}

/// APPEND; the current command page tells where the data went.
pub fn append(partition: u64, object: u64, data: &[u8]) -> Request {
    let mut r = Request::new(A::Append, partition, object);
    r.cdb.length = data.len() as u64;
    r.data_out = data.to_vec();
    r.get_page(page::CURRENT_COMMAND, CURRENT_COMMAND_ROOM)
}

pub fn read(partition: u64, object: u64, offset: u64, len: u32) -> Request {
    let mut r = Request::new(A::Read, partition, object);
    r.cdb.length = u64::from(len);
    r.cdb.start = offset;
    r.data_in_len = len;
    r
}

pub fn clear(partition: u64, object: u64, offset: u64, len: u64) -> Request {
    let mut r = Request::new(A::Clear, partition, object);
    r.cdb.length = len;
    r.cdb.start = offset;
    r
}

pub fn punch(partition: u64, object: u64, offset: u64, len: u64) -> Request {
    let mut r = clear(partition, object, offset, len);
    r.cdb.action = A::Punch;
    r
}

pub fn flush(partition: u64, object: u64) -> Request {
    Request::new(A::Flush, partition, object)
}

pub fn flush_partition(partition: u64) -> Request {
    Request::new(A::FlushPartition, partition, 0)
}

pub fn flush_osd() -> Request {
    Request::new(A::FlushOsd, 0, 0)
}

/// LIST: the partitions of the root (`partition` 0) or the user objects of a
/// partition, from `initial` on, in at most `alloc_len` bytes.
pub fn list(partition: u64, initial: u64, alloc_len: u32) -> Request {
    let mut r = Request::new(A::List, partition, 0);
    r.cdb.length = u64::from(alloc_len);
    r.cdb.start = initial;
    r.data_in_len = alloc_len;
    r
}

/// LIST COLLECTION: the members of a collection, or (collection 0) the collections of a partition.
pub fn list_collection(partition: u64, collection: u64, initial: u64, alloc_len: u32) -> Request {
    let mut r = Request::new(A::ListCollection, partition, collection);
    r.cdb.length = u64::from(alloc_len);
    r.cdb.start = initial;
    r.data_in_len = alloc_len;
    r
}

/// GET ATTRIBUTES of a list of attributes; the retrieved list is at data-in 0.
pub fn get_attributes(partition: u64, object: u64, ids: &[AttrId], alloc_len: u32) -> Request {
    Request::new(A::GetAttributes, partition, object).get_list(ids, alloc_len)
}

/// GET ATTRIBUTES of one whole page; the retrieved list is at data-in 0.
pub fn get_page(partition: u64, object: u64, page_no: u32, alloc_len: u32) -> Request {
    Request::new(A::GetAttributes, partition, object).get_page(page_no, alloc_len)
}

/// SET ATTRIBUTES from a set list in data-out.
pub fn set_attributes(partition: u64, object: u64, attrs: &[Attribute]) -> Request {
    let mut r = Request::new(A::SetAttributes, partition, object);
    let list = attr::encode_value_list(attrs);
    r.cdb.attrs = AttrParams::List {
        get_list_len: 0,
        get_list_offset: None,
        alloc_len: 0,
        retrieved_offset: None,
        set_list_len: list.len() as u32,
        set_list_offset: Offset::from_bytes(0),
    };
    r.data_out = list;
    r
}

/// Why data-in could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("LIST data shorter than its 24-byte header")]
    ShortList,
    #[error(transparent)]
    AttrList(#[from] attr::ListError),
}

/// One LIST / LIST COLLECTION answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Where to continue (the next call's initial id); 0 when the list is complete.
    pub continuation: u64,
    pub list_id: u32,
    /// Object descriptor format: 0x01 partitions, 0x11 collections, 0x21 user objects.
    pub format: u8,
    pub ids: Vec<u64>,
}

/// Parses LIST / LIST COLLECTION data-in.
pub fn parse_list(data_in: &[u8]) -> Result<ListPage, ParseError> {
    if data_in.len() < 24 {
        return Err(ParseError::ShortList);
    }
    let listed = (be64(&data_in[0..8]) as usize)
        .saturating_add(8)
        .min(data_in.len());
    let ids = data_in[24..listed.max(24)]
        .chunks_exact(8)
        .map(be64)
        .collect();
    Ok(ListPage {
        continuation: be64(&data_in[8..16]),
        list_id: be32(&data_in[16..20]),
        format: data_in[23] >> 2,
        ids,
    })
}

/// Parses the retrieved attributes list at `at` in data-in; a list cut at the
/// allocation length yields its complete entries.
pub fn parse_retrieved(data_in: &[u8], at: usize) -> Result<Vec<Attribute>, ParseError> {
    let list = data_in.get(at..).unwrap_or(&[]);
    Ok(attr::decode_retrieved_list(list)?)
}

/// The current command page's facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CurrentCommand {
    pub object_type: u8,
    pub partition: u64,
    pub object: u64,
    pub append_address: Option<u64>,
}

/// Picks the current command page out of retrieved attributes.
pub fn current_command(attrs: &[Attribute]) -> Option<CurrentCommand> {
    let value = |num: u32| {
        attrs
            .iter()
            .find(|a| a.page == page::CURRENT_COMMAND && a.number == num)
            .and_then(|a| a.value.clone())
    };
    let u64_of = |num: u32| value(num).filter(|v| v.len() == 8).map(|v| be64(&v));
    Some(CurrentCommand {
        object_type: *value(n::CC_OBJECT_TYPE)?.first()?,
        partition: u64_of(n::CC_PARTITION_ID)?,
        object: u64_of(n::CC_OBJECT_ID)?,
        append_address: u64_of(n::CC_APPEND_ADDRESS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_with_get_list_places_the_list_after_the_data() {
        let ids = [AttrId {
            page: 1,
            number: 0x82,
        }];
        let r = write(0x10000, 0x10000, 0, &[7; 300]).get_list(&ids, 64);
        assert_eq!(r.data_out.len(), 512 + 16);
        match r.cdb.attrs {
            AttrParams::List {
                get_list_offset, ..
            } => {
                assert_eq!(get_list_offset.unwrap().bytes(), 512)
            }
            _ => panic!("list mode expected"),
        }
        assert_eq!(r.retrieved_at(), Some(0));
        assert_eq!(r.data_in_len, 64);
    }

    #[test]
    fn parse_list_reads_ids_and_continuation() {
        let mut d = (16u64 + 16).to_be_bytes().to_vec();
        d.extend_from_slice(&0x10005u64.to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 0x21 << 2]);
        d.extend_from_slice(&0x10001u64.to_be_bytes());
        d.extend_from_slice(&0x10002u64.to_be_bytes());
        let l = parse_list(&d).unwrap();
        assert_eq!(l.ids, vec![0x10001, 0x10002]);
        assert_eq!((l.continuation, l.list_id, l.format), (0x10005, 9, 0x21));
    }

    #[test]
    fn create_asks_for_the_current_command_page() {
        let r = create(0x10000, 0, 3);
        let b = r.cdb.encode();
        assert_eq!(&b[32..34], &[0, 3]);
        assert_eq!(b[11] & 0x30, 0x20);
        assert_eq!(&b[52..56], &page::CURRENT_COMMAND.to_be_bytes());
    }
}
