//! The attribute pages of each object: computed ones (information, quotas,
//! timestamps, current command) and stored ones, with the rules for setting them.

use crate::attr::{number as n, page, page_identification, AttrId, Attribute, ALL};
use crate::store::{Kind, OsdError, Store};

/// What the command just done reports in the current command page (0xFFFFFFFE).
#[derive(Debug, Clone, Copy, Default)]
pub struct CurrentCommand {
    pub object_type: u8,
    pub partition: u64,
    pub object: u64,
    /// APPEND's starting byte address.
    pub append_address: Option<u64>,
}

/// The object attributes are read from or written to.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub partition: u64,
    pub object: u64,
    pub kind: Kind,
}

/// First page number of each object type's range (osd_attributes ranges).
fn range_base(kind: Kind) -> u32 {
    match kind {
        Kind::User => 0x0000_0000,
        Kind::Partition => 0x3000_0000,
        Kind::Collection => 0x6000_0000,
        Kind::Root => 0x9000_0000,
    }
}

/// Whether `page` belongs to objects of `kind` (common pages belong to all).
pub fn page_fits(kind: Kind, page: u32) -> bool {
    let base = range_base(kind);
    page >= 0xF000_0000 || (page >= base && page - base < 0x3000_0000)
}

/// Pages this logical unit computes for an object of `kind`.
fn standard_pages(kind: Kind) -> Vec<u32> {
    let base = range_base(kind);
    let mut pages = vec![base + 1, base + 3];
    if kind != Kind::Collection {
        pages.insert(1, base + 2);
    }
    pages
}

fn be(v: u64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

fn time6(ms: u64) -> Vec<u8> {
    ms.to_be_bytes()[2..].to_vec()
}

/// All defined attributes of one page of the target.
pub fn page_attributes(
    store: &Store,
    t: &Target,
    page_no: u32,
    cc: &CurrentCommand,
    now: u64,
) -> Result<Vec<Attribute>, OsdError> {
    if page_no == page::CURRENT_COMMAND {
        return Ok(current_command(cc));
    }
    if !page_fits(t.kind, page_no) {
        return Ok(Vec::new());
    }
    let offset = page_no - range_base(t.kind);
    let mut attrs = match offset {
        1 => information(store, t, now)?,
        2 if t.kind != Kind::Collection => quotas(store, t)?,
        3 => timestamps(store, t)?,
        _ => Vec::new(),
    };
    if !attrs.is_empty() {
        let names = ["", "Information", "Quotas", "Timestamps"];
        let name = format!("{:?} {}", t.kind, names[offset as usize]);
        attrs.insert(0, Attribute::new(page_no, 0, page_identification(&name)));
    }
    let stored = store.page_attrs(t.partition, t.object, page_no)?;
    for (number, value) in stored {
        if !attrs.iter().any(|a| a.number == number) {
            attrs.push(Attribute::new(page_no, number, value));
        }
    }
    attrs.sort_by_key(|a| a.number);
    for a in &mut attrs {
        a.page = page_no;
    }
    Ok(attrs)
}

fn current_command(cc: &CurrentCommand) -> Vec<Attribute> {
    let p = page::CURRENT_COMMAND;
    let mut v = vec![
        Attribute::new(p, n::CC_OBJECT_TYPE, vec![cc.object_type]),
        Attribute::new(p, n::CC_PARTITION_ID, be(cc.partition)),
        Attribute::new(p, n::CC_OBJECT_ID, be(cc.object)),
    ];
    if let Some(a) = cc.append_address {
        v.push(Attribute::new(p, n::CC_APPEND_ADDRESS, be(a)));
    }
    v
}

fn information(store: &Store, t: &Target, now: u64) -> Result<Vec<Attribute>, OsdError> {
    let (p, o) = (t.partition, t.object);
    let mut v = Vec::new();
    match t.kind {
        Kind::Root => {
            let mut system_id = b"ironsan osd".to_vec();
            system_id.resize(20, 0);
            v.push((n::ROOT_SYSTEM_ID, system_id));
            v.push((n::ROOT_VENDOR, b"IRONSAN ".to_vec()));
            v.push((n::ROOT_PRODUCT, b"OSD-2 LU        ".to_vec()));
            v.push((n::ROOT_TOTAL_CAPACITY, be(store.capacity()?)));
            v.push((n::USED_CAPACITY, be(store.used(0)?)));
            v.push((n::ROOT_NUMBER_OF_PARTITIONS, be(store.count(0)?)));
            v.push((n::ROOT_CLOCK, time6(now)));
        }
        Kind::Partition => {
            v.push((n::PARTITION_ID, be(p)));
            v.push((n::USED_CAPACITY, be(store.used(p)?)));
            v.push((n::NUMBER_OF_OBJECTS, be(store.count(p)?)));
        }
        Kind::Collection => {
            v.push((n::PARTITION_ID, be(p)));
            v.push((n::OBJECT_ID, be(o)));
            v.push((n::USED_CAPACITY, be(0)));
        }
        Kind::User => {
            v.push((n::PARTITION_ID, be(p)));
            v.push((n::OBJECT_ID, be(o)));
            v.push((n::USED_CAPACITY, be(store.allocated(p, o)?)));
            v.push((n::LOGICAL_LENGTH, be(store.length(p, o)?)));
        }
    }
    let page_no = range_base(t.kind) + 1;
    Ok(v.into_iter()
        .map(|(num, val)| Attribute::new(page_no, num, val))
        .collect())
}

fn quotas(store: &Store, t: &Target) -> Result<Vec<Attribute>, OsdError> {
    let page_no = range_base(t.kind) + 2;
    let numbers: &[u32] = match t.kind {
        Kind::User => &[n::MAXIMUM_LENGTH],
        Kind::Partition => &[n::MAXIMUM_LENGTH, n::CAPACITY_QUOTA, n::OBJECT_COUNT_QUOTA],
        _ => &[
            n::MAXIMUM_LENGTH,
            n::CAPACITY_QUOTA,
            n::OBJECT_COUNT_QUOTA,
            0x20002,
        ],
    };
    let mut v = Vec::new();
    for &num in numbers {
        // An unset quota is "no limit": all ones.
        let value = store.attr(t.partition, t.object, page_no, num)?;
        v.push(Attribute::new(
            page_no,
            num,
            value.unwrap_or_else(|| be(u64::MAX)),
        ));
    }
    Ok(v)
}

fn timestamps(store: &Store, t: &Target) -> Result<Vec<Attribute>, OsdError> {
    let page_no = range_base(t.kind) + 3;
    let times = store.times(t.partition, t.object)?;
    let mut v = vec![
        (n::ATTRIBUTES_ACCESSED_TIME, times.attr_accessed),
        (n::ATTRIBUTES_MODIFIED_TIME, times.attr_modified),
    ];
    if t.kind != Kind::Root {
        v.insert(0, (n::CREATED_TIME, times.created));
        v.push((n::DATA_ACCESSED_TIME, times.data_accessed));
        v.push((n::DATA_MODIFIED_TIME, times.data_modified));
    }
    Ok(v.into_iter()
        .map(|(num, ms)| Attribute::new(page_no, num, time6(ms)))
        .collect())
}

/// The attributes a get list names, expanding "all pages" and "all in page";
/// an attribute that is not defined comes back with no value.
pub fn retrieve(
    store: &Store,
    t: &Target,
    ids: &[AttrId],
    cc: &CurrentCommand,
    now: u64,
) -> Result<Vec<Attribute>, OsdError> {
    let mut out = Vec::new();
    for id in ids {
        if id.page == ALL {
            for p in all_pages(store, t)? {
                out.extend(page_attributes(store, t, p, cc, now)?);
            }
            continue;
        }
        let attrs = page_attributes(store, t, id.page, cc, now)?;
        if id.number == ALL {
            out.extend(attrs);
        } else {
            let found = attrs.into_iter().find(|a| a.number == id.number);
            out.push(found.unwrap_or(Attribute {
                page: id.page,
                number: id.number,
                value: None,
            }));
        }
    }
    Ok(out)
}

fn all_pages(store: &Store, t: &Target) -> Result<Vec<u32>, OsdError> {
    let mut pages = standard_pages(t.kind);
    for p in store.stored_pages(t.partition, t.object)? {
        if !pages.contains(&p) {
            pages.push(p);
        }
    }
    pages.sort_unstable();
    Ok(pages)
}

/// How setting an attribute affects the object.
#[derive(Debug, PartialEq, Eq)]
pub enum SetEffect {
    /// Store the value (empty: remove it).
    Store,
    /// Change the user object's logical length.
    Length(u64),
    /// Join (Some) or leave (None) a collection.
    Membership(Option<u64>),
}

/// Whether an attribute may be set on the target, and what setting it does.
/// `None` refuses it (a read-only, unknown standard or wrong-range attribute).
pub fn set_effect(kind: Kind, page_no: u32, number: u32, value: &[u8]) -> Option<SetEffect> {
    if !page_fits(kind, page_no) || page_no >= 0xF000_0000 || number == 0 || number == ALL {
        return None;
    }
    let offset = page_no - range_base(kind);
    if offset >= 0x10000 {
        return Some(SetEffect::Store);
    }
    let eight = value.len() == 8 || value.is_empty();
    let as_u64 = || crate::cdb::be64(value);
    match (kind, offset, number) {
        (_, 1, n::USERNAME) if kind != Kind::Root => Some(SetEffect::Store),
        (Kind::User, 1, n::LOGICAL_LENGTH) if value.len() == 8 => Some(SetEffect::Length(as_u64())),
        (Kind::User, 2, n::MAXIMUM_LENGTH) if eight => Some(SetEffect::Store),
        (Kind::Partition, 2, n::CAPACITY_QUOTA | n::OBJECT_COUNT_QUOTA) if eight => {
            Some(SetEffect::Store)
        }
        (Kind::User, 4, _) if value.is_empty() => Some(SetEffect::Membership(None)),
        (Kind::User, 4, _) if value.len() == 8 => Some(SetEffect::Membership(Some(as_u64()))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges() {
        assert!(page_fits(Kind::User, 0x10000));
        assert!(!page_fits(Kind::User, 0x3000_0001));
        assert!(page_fits(Kind::Partition, 0x3000_0001));
        assert!(page_fits(Kind::Root, 0x9000_0001));
        assert!(page_fits(Kind::Collection, page::CURRENT_COMMAND));
    }

    #[test]
    fn set_rules() {
        assert_eq!(
            set_effect(Kind::User, 0x10000, 5, b"x"),
            Some(SetEffect::Store)
        );
        assert_eq!(
            set_effect(Kind::User, 1, n::LOGICAL_LENGTH, &9u64.to_be_bytes()),
            Some(SetEffect::Length(9))
        );
        assert_eq!(set_effect(Kind::User, 1, n::USED_CAPACITY, &[0; 8]), None);
        assert_eq!(set_effect(Kind::User, 1, 0, b"x"), None);
        assert_eq!(set_effect(Kind::Partition, 0x10000, 1, b"x"), None);
        assert_eq!(set_effect(Kind::User, page::CURRENT_COMMAND, 2, b"x"), None);
    }
}
