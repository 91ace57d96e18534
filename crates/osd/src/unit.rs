//! The OSD logical unit: one command in, status + sense + data-in out.

use std::path::Path;
use std::sync::Mutex;

use crate::attr::{self, AttrId, Attribute};
use crate::cdb::{field, AttrParams, Cdb, ServiceAction};
use crate::pages::{self, CurrentCommand, SetEffect, Target};
use crate::sense::SenseCode;
use crate::store::{now_ms, Kind, OsdError, Store};

/// CDB byte 10: force unit access (the write is durable before GOOD).
const FUA: u8 = 0x08;

/// SCSI status GOOD.
pub const GOOD: u8 = 0x00;
/// SCSI status CHECK CONDITION.
pub const CHECK_CONDITION: u8 = 0x02;

/// What a command returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// GOOD (0) or CHECK CONDITION (2).
    pub status: u8,
    pub sense: Option<SenseCode>,
    /// At most the initiator's expected data-in length; the caller reports the residual.
    pub data_in: Vec<u8>,
}

impl Reply {
    fn refused(sense: SenseCode) -> Reply {
        Reply {
            status: CHECK_CONDITION,
            sense: Some(sense),
            data_in: Vec::new(),
        }
    }
}

/// An OSD-2 logical unit over a directory. Send + Sync; commands are serialized.
pub struct OsdUnit {
    store: Mutex<Store>,
}

pub(crate) type Outcome<T> = Result<T, SenseCode>;

impl From<OsdError> for SenseCode {
    fn from(e: OsdError) -> SenseCode {
        tracing::warn!(error = %e, "osd backing store failed");
        SenseCode::internal_failure()
    }
}

impl OsdUnit {
    /// Opens the store in `dir`, creating the directory and database if absent.
    /// `capacity_bytes` is the capacity of a new store (FORMAT OSD may change it).
    pub fn open(dir: &Path, capacity_bytes: u64) -> Result<OsdUnit, OsdError> {
        Ok(OsdUnit {
            store: Mutex::new(Store::open(dir, capacity_bytes)?),
        })
    }

    /// One command. `data_out` is all the data-out the initiator sent; `data_in_len` is the
    /// initiator's expected data-in length (the bidirectional read length for bidi commands).
    pub fn execute(&self, cdb: &[u8], data_out: &[u8], data_in_len: u32) -> Reply {
        let mut reply = match Cdb::parse(cdb) {
            Err(sense) => Reply::refused(sense),
            Ok(cdb) => {
                let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
                let mut cmd = Command {
                    store: &mut store,
                    cdb: &cdb,
                    data_out,
                    data_in_len,
                    now: now_ms(),
                };
                cmd.run()
            }
        };
        // A READ past the end is answered, not refused: it is not logged.
        let refused = reply
            .sense
            .as_ref()
            .filter(|s| s.key != crate::sense::key::RECOVERED_ERROR);
        if let Some(s) = refused {
            let action = cdb.get(8..10).map(|b| u16::from_be_bytes([b[0], b[1]]));
            tracing::debug!(?action, key = s.key, asc = s.asc, ascq = s.ascq, field = ?s.field,
                object = ?s.object, "osd command refused");
        }
        reply.data_in.truncate(data_in_len as usize);
        reply
    }
}

// The caller shares one unit between connections.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<OsdUnit>();
};

/// Attributes to get, as the CDB asks.
enum Gets {
    None,
    Page(u32),
    List(Vec<AttrId>),
}

/// What a command function produced.
struct Done {
    target: Target,
    data: Vec<u8>,
    cc: CurrentCommand,
    recovered: Option<SenseCode>,
}

struct Command<'a> {
    store: &'a mut Store,
    cdb: &'a Cdb,
    data_out: &'a [u8],
    data_in_len: u32,
    now: u64,
}

impl Command<'_> {
    fn run(&mut self) -> Reply {
        match self.run_checked() {
            Ok(reply) => reply,
            Err(sense) => Reply::refused(sense),
        }
    }

    fn run_checked(&mut self) -> Outcome<Reply> {
        crate::security::check(self.cdb)?;
        let sets = self.sets()?;
        let (gets, alloc_len, retrieved_at) = self.gets()?;
        let done = self.function()?;
        self.apply_sets(&done.target, &sets)?;
        let mut data_in = done.data;
        if let (Some(at), false) = (retrieved_at, matches!(gets, Gets::None)) {
            let ids = match gets {
                Gets::Page(p) => vec![AttrId {
                    page: p,
                    number: attr::ALL,
                }],
                Gets::List(ids) => ids,
                Gets::None => Vec::new(),
            };
            let attrs = pages::retrieve(self.store, &done.target, &ids, &done.cc, self.now)?;
            self.touch(&done.target, &["attr_accessed"])?;
            let mut list = attr::encode_value_list(&attrs);
            list.truncate(alloc_len as usize);
            let offset_field = match self.cdb.attrs {
                AttrParams::Page { .. } => field::ATTRIBUTE_PARAMETERS + 8,
                _ => field::ATTRIBUTE_PARAMETERS + 12,
            };
            place(&mut data_in, at, &list, self.data_in_len, offset_field)?;
        }
        let status = if done.recovered.is_some() {
            CHECK_CONDITION
        } else {
            GOOD
        };
        Ok(Reply {
            status,
            sense: done.recovered,
            data_in,
        })
    }

    /// The attributes to set, from the CDB or data-out.
    fn sets(&self) -> Outcome<Vec<Attribute>> {
        Ok(match &self.cdb.attrs {
            AttrParams::SetOne {
                page,
                number,
                value,
            } if *page != 0 => {
                vec![Attribute::new(*page, *number, value.clone())]
            }
            AttrParams::Page {
                set_page,
                set_number,
                set_len,
                set_offset,
                ..
            } if *set_page != 0 => {
                if *set_len as usize > attr::MAX_VALUE_LEN {
                    return Err(SenseCode::invalid_field_in_cdb(72));
                }
                let at = set_offset
                    .ok_or(SenseCode::invalid_field_in_cdb(76))?
                    .bytes();
                let value = slice(self.data_out, at, u64::from(*set_len))?;
                vec![Attribute::new(*set_page, *set_number, value.to_vec())]
            }
            AttrParams::List {
                set_list_len,
                set_list_offset: Some(off),
                ..
            } if *set_list_len != 0 => {
                let list = slice(self.data_out, off.bytes(), u64::from(*set_list_len))?;
                attr::decode_value_list(list).map_err(|e| list_error(off.bytes(), e.at))?
            }
            _ => Vec::new(),
        })
    }

    /// The attributes to get, the allocation length and the retrieved attributes offset.
    fn gets(&self) -> Outcome<(Gets, u32, Option<u64>)> {
        Ok(match &self.cdb.attrs {
            AttrParams::Page {
                get_page,
                alloc_len,
                retrieved_offset,
                ..
            } if *get_page != 0 && *alloc_len != 0 => (
                Gets::Page(*get_page),
                *alloc_len,
                retrieved_offset.map(|o| o.bytes()),
            ),
            AttrParams::List {
                get_list_len,
                get_list_offset: Some(off),
                alloc_len,
                retrieved_offset,
                ..
            } if *get_list_len != 0 && *alloc_len != 0 => {
                let list = slice(self.data_out, off.bytes(), u64::from(*get_list_len))?;
                let ids = attr::decode_get_list(list).map_err(|e| list_error(off.bytes(), e.at))?;
                (
                    Gets::List(ids),
                    *alloc_len,
                    retrieved_offset.map(|o| o.bytes()),
                )
            }
            _ => (Gets::None, 0, None),
        })
    }

    fn function(&mut self) -> Outcome<Done> {
        use ServiceAction as A;
        match self.cdb.action {
            A::FormatOsd => self.format(),
            A::CreatePartition => self.create_partition(),
            A::RemovePartition => self.remove_partition(),
            A::Create => self.create(Kind::User),
            A::CreateCollection => self.create(Kind::Collection),
            A::Remove => self.remove(Kind::User),
            A::RemoveCollection => self.remove(Kind::Collection),
            A::Write => self.write(false),
            A::Append => self.write(true),
            A::Read => self.read(),
            A::Clear | A::Punch => self.clear(),
            A::Flush | A::FlushCollection | A::FlushPartition | A::FlushOsd => self.flush(),
            A::List => self.list(false),
            A::ListCollection => self.list(true),
            A::GetAttributes | A::SetAttributes => {
                let target = self.resolve(self.cdb.partition, self.cdb.object)?;
                Ok(self.done(target, Vec::new()))
            }
        }
    }

    fn done(&self, target: Target, data: Vec<u8>) -> Done {
        Done {
            cc: CurrentCommand {
                object_type: target.kind.code(),
                partition: target.partition,
                object: target.object,
                append_address: None,
            },
            target,
            data,
            recovered: None,
        }
    }

    /// The existing object (pid, oid) names; errors point at the missing id.
    fn resolve(&self, pid: u64, oid: u64) -> Outcome<Target> {
        let missing = |f| SenseCode::invalid_field_in_cdb(f).about(pid, oid);
        if pid == 0 && oid != 0 {
            return Err(missing(field::OBJECT_ID));
        }
        if self.store.kind(pid, 0)?.is_none() {
            return Err(missing(field::PARTITION_ID));
        }
        let kind = self
            .store
            .kind(pid, oid)?
            .ok_or(missing(field::OBJECT_ID))?;
        Ok(Target {
            partition: pid,
            object: oid,
            kind,
        })
    }

    fn resolve_kind(&self, pid: u64, oid: u64, want: Kind) -> Outcome<Target> {
        let t = self.resolve(pid, oid)?;
        if t.kind != want {
            let f = if oid == 0 {
                field::PARTITION_ID
            } else {
                field::OBJECT_ID
            };
            return Err(SenseCode::invalid_field_in_cdb(f).about(pid, oid));
        }
        Ok(t)
    }

    fn root(&self) -> Target {
        Target {
            partition: 0,
            object: 0,
            kind: Kind::Root,
        }
    }

    fn touch(&self, t: &Target, columns: &[&str]) -> Outcome<()> {
        if self.cdb.timestamp_control != 0x7F {
            self.store.touch(t.partition, t.object, columns, self.now)?;
        }
        Ok(())
    }

    fn format(&mut self) -> Outcome<Done> {
        // A zero formatted capacity keeps the configured one.
        let capacity = match self.cdb.length {
            0 => self.store.capacity()?,
            c => c,
        };
        self.store.format(capacity)?;
        Ok(self.done(self.root(), Vec::new()))
    }

    fn create_partition(&mut self) -> Outcome<Done> {
        let requested = self.cdb.partition;
        let pid = match requested {
            0 => self.store.next_id(0)?,
            p if p < 0x10000 || self.store.kind(p, 0)?.is_some() => {
                return Err(SenseCode::invalid_field_in_cdb(field::PARTITION_ID).about(p, 0));
            }
            p => p,
        };
        self.store.insert(pid, 0, Kind::Partition, self.now)?;
        let t = self.resolve(pid, 0)?;
        Ok(self.done(t, Vec::new()))
    }

    fn remove_partition(&mut self) -> Outcome<Done> {
        let pid = self.cdb.partition;
        if pid == 0 {
            return Err(SenseCode::invalid_field_in_cdb(field::PARTITION_ID).about(0, 0));
        }
        self.resolve_kind(pid, 0, Kind::Partition)?;
        // Remove scope 0 (byte 11 bits 2..0) refuses a partition that still holds objects.
        if self.store.count(pid)? > 0 && self.cdb.command_options & 0x07 == 0 {
            return Err(SenseCode::contains_user_objects(pid, 0));
        }
        self.store.remove(pid, 0)?;
        let root = self.root();
        self.touch(&root, &["attr_modified"])?;
        Ok(self.done(root, Vec::new()))
    }

    fn create(&mut self, kind: Kind) -> Outcome<Done> {
        let pid = self.cdb.partition;
        self.resolve_kind(pid, 0, Kind::Partition)?;
        let count = match (kind, self.cdb.number_of_objects()) {
            (Kind::User, 0) | (Kind::Collection, _) => 1,
            (_, n) => u64::from(n),
        };
        let requested = self.cdb.object;
        if requested != 0 {
            if count != 1 {
                return Err(SenseCode::invalid_field_in_cdb(field::LENGTH));
            }
            if requested < 0x10000 || self.store.kind(pid, requested)?.is_some() {
                let e = SenseCode::invalid_field_in_cdb(field::OBJECT_ID);
                return Err(e.about(pid, requested));
            }
        }
        self.check_object_count(pid, count)?;
        let first = match requested {
            0 => self.store.next_id(pid)?,
            r => r,
        };
        let last = first
            .checked_add(count - 1)
            .ok_or(SenseCode::quota_error(pid, 0))?;
        self.store.insert_range(pid, first, last, kind, self.now)?;
        let t = self.resolve(pid, last)?;
        Ok(self.done(t, Vec::new()))
    }

    fn check_object_count(&self, pid: u64, adding: u64) -> Outcome<()> {
        let quota = self
            .store
            .attr(
                pid,
                0,
                attr::page::PARTITION_QUOTAS,
                attr::number::OBJECT_COUNT_QUOTA,
            )?
            .map_or(u64::MAX, |v| crate::cdb::be64(&v));
        if self.store.count(pid)?.saturating_add(adding) > quota {
            return Err(SenseCode::quota_error(pid, 0));
        }
        Ok(())
    }

    fn remove(&mut self, kind: Kind) -> Outcome<Done> {
        let (pid, oid) = (self.cdb.partition, self.cdb.object);
        self.resolve_kind(pid, oid, kind)?;
        let forced = self.cdb.command_options & 0x01 != 0;
        if kind == Kind::Collection && !forced && !self.store.members(pid, oid, 0, 1)?.is_empty() {
            return Err(SenseCode::contains_user_objects(pid, oid));
        }
        self.store.remove(pid, oid)?;
        let partition = self.resolve(pid, 0)?;
        Ok(self.done(partition, Vec::new()))
    }

    fn write(&mut self, append: bool) -> Outcome<Done> {
        let (pid, oid) = (self.cdb.partition, self.cdb.object);
        let t = self.resolve_kind(pid, oid, Kind::User)?;
        let old_len = self.store.length(pid, oid)?;
        let start = if append { old_len } else { self.cdb.start };
        let data = slice(self.data_out, 0, self.cdb.length)?;
        let end = start
            .checked_add(data.len() as u64)
            .ok_or(SenseCode::invalid_field_in_cdb(field::STARTING_ADDRESS))?;
        let new_len = old_len.max(end);
        self.check_space(pid, oid, old_len, new_len)?;
        self.store.write(pid, oid, start, data)?;
        if new_len != old_len {
            self.store.set_length(pid, oid, new_len)?;
        }
        self.touch(&t, &["data_modified", "attr_modified"])?;
        if self.cdb.options & FUA != 0 {
            self.store.sync_object(pid, oid)?;
        }
        let mut done = self.done(t, Vec::new());
        done.cc.append_address = append.then_some(start);
        Ok(done)
    }

    /// Capacity, partition capacity quota and object maximum length all bound a new length.
    fn check_space(&self, pid: u64, oid: u64, old_len: u64, new_len: u64) -> Outcome<()> {
        if new_len <= old_len {
            return Ok(());
        }
        let grow = new_len - old_len;
        let quota = |p: u64, o: u64, page: u32, num: u32| -> Outcome<u64> {
            let v = self.store.attr(p, o, page, num)?;
            Ok(v.map_or(u64::MAX, |v| crate::cdb::be64(&v)))
        };
        let over_total = self.store.used(0)?.saturating_add(grow) > self.store.capacity()?;
        let partition_quota = quota(
            pid,
            0,
            attr::page::PARTITION_QUOTAS,
            attr::number::CAPACITY_QUOTA,
        )?;
        let over_partition = self.store.used(pid)?.saturating_add(grow) > partition_quota;
        let max_len = quota(
            pid,
            oid,
            attr::page::USER_QUOTAS,
            attr::number::MAXIMUM_LENGTH,
        )?;
        if over_total || over_partition || new_len > max_len {
            return Err(SenseCode::quota_error(pid, oid));
        }
        Ok(())
    }

    fn read(&mut self) -> Outcome<Done> {
        let (pid, oid) = (self.cdb.partition, self.cdb.object);
        let t = self.resolve_kind(pid, oid, Kind::User)?;
        // Never read more than the initiator can take.
        let want = self.cdb.length.min(u64::from(self.data_in_len));
        let data = self.store.read(pid, oid, self.cdb.start, want as usize)?;
        let logical = self.store.length(pid, oid)?;
        let past_end = self.cdb.start.saturating_add(self.cdb.length) > logical;
        self.touch(&t, &["data_accessed"])?;
        let read = data.len() as u64;
        let mut done = self.done(t, data);
        if past_end {
            done.recovered = Some(SenseCode::read_past_end(pid, oid, read));
        }
        Ok(done)
    }

    fn clear(&mut self) -> Outcome<Done> {
        let (pid, oid) = (self.cdb.partition, self.cdb.object);
        let t = self.resolve_kind(pid, oid, Kind::User)?;
        // Only bytes within the logical length are zeroed; the length does not change.
        let logical = self.store.length(pid, oid)?;
        let end = self.cdb.start.saturating_add(self.cdb.length).min(logical);
        let mut at = self.cdb.start;
        const CHUNK: u64 = 1 << 20;
        while at < end {
            let n = (end - at).min(CHUNK);
            self.store.write(pid, oid, at, &vec![0; n as usize])?;
            at += n;
        }
        self.touch(&t, &["data_modified"])?;
        Ok(self.done(t, Vec::new()))
    }

    fn flush(&mut self) -> Outcome<Done> {
        use ServiceAction as A;
        let (pid, oid) = match self.cdb.action {
            A::FlushOsd => (0, 0),
            A::FlushPartition => (self.cdb.partition, 0),
            _ => (self.cdb.partition, self.cdb.object),
        };
        let t = self.resolve(pid, oid)?;
        self.store.sync_all()?;
        Ok(self.done(t, Vec::new()))
    }

    fn list(&mut self, collection: bool) -> Outcome<Done> {
        let (pid, oid) = (self.cdb.partition, self.cdb.object);
        // Per-object attributes in the list (LIST ATTR) are not offered.
        if self.cdb.command_options & 0x40 != 0 {
            return Err(SenseCode::invalid_field_in_cdb(field::ATTRIBUTE_FORMAT));
        }
        let (t, format) = match (collection, pid, oid) {
            (false, 0, _) => (self.root(), 0x01),
            (false, _, _) => (self.resolve_kind(pid, 0, Kind::Partition)?, 0x21),
            (true, _, 0) => (self.resolve_kind(pid, 0, Kind::Partition)?, 0x11),
            (true, _, _) => (self.resolve_kind(pid, oid, Kind::Collection)?, 0x21),
        };
        let alloc = self.cdb.length.min(u64::from(self.data_in_len));
        let room = (alloc.saturating_sub(24) / 8) as usize;
        let from = self.cdb.start;
        let mut ids = match (collection, format) {
            (true, 0x21) => self.store.members(pid, oid, from, room + 1)?,
            (true, _) => self.store.list(pid, Kind::Collection, from, room + 1)?,
            (false, _) => self.store.list(pid, Kind::User, from, room + 1)?,
        };
        let continuation = if ids.len() > room { ids[room] } else { 0 };
        ids.truncate(room);
        Ok(self.done(t, list_data(&ids, continuation, self.cdb.list_id, format)))
    }

    fn apply_sets(&mut self, t: &Target, sets: &[Attribute]) -> Outcome<()> {
        for (i, a) in sets.iter().enumerate() {
            let value = a.value.as_deref().unwrap_or(&[]);
            let refused = || match self.cdb.attrs {
                AttrParams::SetOne { .. } => {
                    SenseCode::invalid_field_in_cdb(field::ATTRIBUTE_PARAMETERS)
                }
                _ => SenseCode::invalid_field_in_parameter_list(i as u16),
            };
            let effect = pages::set_effect(t.kind, a.page, a.number, value).ok_or_else(refused)?;
            let (p, o) = (t.partition, t.object);
            match effect {
                SetEffect::Store => self.store.set_attr(p, o, a.page, a.number, value)?,
                SetEffect::Length(len) => {
                    self.check_space(p, o, self.store.length(p, o)?, len)?;
                    self.store.set_length(p, o, len)?;
                }
                SetEffect::Membership(cid) => {
                    if let Some(c) = cid {
                        if self.store.kind(p, c)? != Some(Kind::Collection) {
                            return Err(refused());
                        }
                    }
                    self.store.set_attr(p, o, a.page, a.number, value)?;
                }
            }
        }
        if !sets.is_empty() {
            self.touch(t, &["attr_modified"])?;
        }
        Ok(())
    }
}

/// LIST / LIST COLLECTION parameter data: additional length, continuation id,
/// list identifier, 3 reserved, object descriptor format << 2, then the ids.
fn list_data(ids: &[u64], continuation: u64, list_id: u32, format: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + ids.len() * 8);
    out.extend_from_slice(&((16 + ids.len() * 8) as u64).to_be_bytes());
    out.extend_from_slice(&continuation.to_be_bytes());
    out.extend_from_slice(&list_id.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, format << 2]);
    for id in ids {
        out.extend_from_slice(&id.to_be_bytes());
    }
    out
}

/// `len` bytes of data-out at `at`, or a parameter list length error.
fn slice(data: &[u8], at: u64, len: u64) -> Outcome<&[u8]> {
    let end = at.checked_add(len).filter(|&e| e <= data.len() as u64);
    match end {
        Some(end) => Ok(&data[at as usize..end as usize]),
        None => Err(SenseCode::parameter_list_length_error()),
    }
}

fn list_error(list_at: u64, at: usize) -> SenseCode {
    let byte = list_at.saturating_add(at as u64).min(u64::from(u16::MAX));
    SenseCode::invalid_field_in_parameter_list(byte as u16)
}

/// Puts the retrieved attributes at `at` in data-in, after any command data.
fn place(
    data_in: &mut Vec<u8>,
    at: u64,
    list: &[u8],
    data_in_len: u32,
    offset_field: u16,
) -> Outcome<()> {
    if at < data_in.len() as u64 {
        // The retrieved attributes would overwrite the command's own data.
        return Err(SenseCode::invalid_field_in_cdb(offset_field));
    }
    if at >= u64::from(data_in_len) {
        return Ok(());
    }
    let at = at as usize;
    let keep = list.len().min(data_in_len as usize - at);
    data_in.resize(at, 0);
    data_in.extend_from_slice(&list[..keep]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_data_layout() {
        let d = list_data(&[0x10001, 0x10002], 0x10003, 7, 0x21);
        assert_eq!(d.len(), 40);
        assert_eq!(&d[0..8], &32u64.to_be_bytes());
        assert_eq!(&d[8..16], &0x10003u64.to_be_bytes());
        assert_eq!(&d[16..20], &7u32.to_be_bytes());
        assert_eq!(d[23], 0x84);
        assert_eq!(&d[24..32], &0x10001u64.to_be_bytes());
    }

    #[test]
    fn retrieved_attributes_never_overwrite_command_data() {
        let mut data = vec![1u8; 10];
        assert!(place(&mut data, 4, &[9; 8], 100, 64).is_err());
        place(&mut data, 16, &[9; 8], 20, 64).unwrap();
        assert_eq!(data.len(), 20, "cut at the expected data-in length");
        assert_eq!(&data[10..16], &[0; 6]);
        assert_eq!(&data[16..], &[9; 4]);
    }

    #[test]
    fn parameter_data_bounds() {
        assert!(slice(&[0; 8], 4, 4).is_ok());
        assert!(slice(&[0; 8], 4, 5).is_err());
        assert!(slice(&[0; 8], u64::MAX, 2).is_err());
    }
}
