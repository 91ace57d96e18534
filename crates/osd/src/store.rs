//! The persistent object store of one logical unit, in a directory:
//! user object data in `data/<partition-hex>/<object-hex>` files; objects,
//! attributes and the formatted capacity in the SQLite database `osd.db`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use crate::attr::page;
use crate::cdb::object_type;

/// A failure of the backing store (not of the command).
#[derive(Debug, thiserror::Error)]
pub enum OsdError {
    #[error("object store database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("object store file: {0}")]
    Io(#[from] io::Error),
}

/// What an identifier names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Root,
    Partition,
    Collection,
    User,
}

impl Kind {
    /// The object type code (capability byte 48, current command page).
    pub fn code(self) -> u8 {
        match self {
            Kind::Root => object_type::ROOT,
            Kind::Partition => object_type::PARTITION,
            Kind::Collection => object_type::COLLECTION,
            Kind::User => object_type::USER,
        }
    }

    fn from_code(code: u8) -> Kind {
        match code {
            object_type::PARTITION => Kind::Partition,
            object_type::COLLECTION => Kind::Collection,
            object_type::USER => Kind::User,
            _ => Kind::Root,
        }
    }
}

/// Timestamps of an object, milliseconds since 1970.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Times {
    pub created: u64,
    pub attr_accessed: u64,
    pub attr_modified: u64,
    pub data_accessed: u64,
    pub data_modified: u64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    pid INTEGER NOT NULL, oid INTEGER NOT NULL, kind INTEGER NOT NULL,
    length INTEGER NOT NULL DEFAULT 0,
    created INTEGER NOT NULL, attr_accessed INTEGER NOT NULL, attr_modified INTEGER NOT NULL,
    data_accessed INTEGER NOT NULL, data_modified INTEGER NOT NULL,
    PRIMARY KEY (pid, oid));
CREATE TABLE IF NOT EXISTS attrs (
    pid INTEGER NOT NULL, oid INTEGER NOT NULL, page INTEGER NOT NULL, number INTEGER NOT NULL,
    value BLOB NOT NULL, PRIMARY KEY (pid, oid, page, number));
-- Per partition, the logical lengths summed and the objects (user objects and collections,
-- kinds 0x80 and 0x40) counted, kept by triggers: WRITE and CREATE check capacity and quotas
-- against these instead of scanning the partition (which grew with the store: 0.5 ms per
-- 4 KiB write at 2,000 objects).
CREATE TABLE IF NOT EXISTS usage (
    pid INTEGER PRIMARY KEY, used INTEGER NOT NULL, objects INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS usage_insert AFTER INSERT ON objects BEGIN
    INSERT OR IGNORE INTO usage (pid, used, objects) VALUES (NEW.pid, 0, 0);
    UPDATE usage SET used = used + NEW.length, objects = objects + (NEW.kind IN (64, 128))
        WHERE pid = NEW.pid;
END;
CREATE TRIGGER IF NOT EXISTS usage_length AFTER UPDATE OF length ON objects BEGIN
    UPDATE usage SET used = used - OLD.length + NEW.length WHERE pid = NEW.pid;
END;
CREATE TRIGGER IF NOT EXISTS usage_delete AFTER DELETE ON objects BEGIN
    UPDATE usage SET used = used - OLD.length, objects = objects - (OLD.kind IN (64, 128))
        WHERE pid = OLD.pid;
END;
";

/// Rebuilds the sums from the objects (at open: they cannot drift across a crash).
const RECOUNT_USAGE: &str = "
DELETE FROM usage;
INSERT INTO usage (pid, used, objects)
    SELECT pid, SUM(length), SUM(kind IN (64, 128)) FROM objects GROUP BY pid;
";

/// Milliseconds since 1970, the OSD timestamp unit.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// SQLite integers are signed: flipping the top bit keeps u64 order in i64 order.
fn key(id: u64) -> i64 {
    (id ^ (1 << 63)) as i64
}

fn unkey(k: i64) -> u64 {
    (k as u64) ^ (1 << 63)
}

pub struct Store {
    dir: PathBuf,
    db: Connection,
}

impl Store {
    /// Opens (creating if absent) the store in `dir`; `capacity` applies to a new store.
    pub fn open(dir: &Path, capacity: u64) -> Result<Store, OsdError> {
        fs::create_dir_all(dir.join("data"))?;
        let db = Connection::open(dir.join("osd.db"))?;
        // Write-ahead logging without a sync per commit: attributes reach the disk with
        // the object data they describe, at FLUSH, FUA or a checkpoint, as behind a
        // write cache (a sync per command cost a READ, which notes its access time, ~1 ms).
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        db.execute_batch(SCHEMA)?;
        db.execute_batch(RECOUNT_USAGE)?;
        db.execute(
            "INSERT OR IGNORE INTO settings (name, value) VALUES ('capacity', ?1)",
            params![key(capacity)],
        )?;
        let store = Store {
            dir: dir.to_path_buf(),
            db,
        };
        store.insert_root()?;
        Ok(store)
    }

    /// The root's row holds only its timestamps.
    fn insert_root(&self) -> Result<(), OsdError> {
        let now = now_ms() as i64;
        self.db.execute(
            "INSERT OR IGNORE INTO objects (pid, oid, kind, created, attr_accessed, attr_modified,
             data_accessed, data_modified) VALUES (?1, ?1, ?2, ?3, ?3, ?3, ?3, ?3)",
            params![key(0), Kind::Root.code(), now],
        )?;
        Ok(())
    }

    pub fn capacity(&self) -> Result<u64, OsdError> {
        let k: i64 = self.db.query_row(
            "SELECT value FROM settings WHERE name = 'capacity'",
            [],
            |r| r.get(0),
        )?;
        Ok(unkey(k))
    }

    /// Removes every partition and object, and sets the capacity.
    pub fn format(&mut self, capacity: u64) -> Result<(), OsdError> {
        let tx = self.db.transaction()?;
        tx.execute("DELETE FROM objects", [])?;
        tx.execute("DELETE FROM attrs", [])?;
        tx.execute(
            "UPDATE settings SET value = ?1 WHERE name = 'capacity'",
            params![key(capacity)],
        )?;
        tx.commit()?;
        let data = self.dir.join("data");
        fs::remove_dir_all(&data)?;
        fs::create_dir_all(&data)?;
        self.insert_root()
    }

    /// What (pid, oid) names, if it exists. The root always exists.
    pub fn kind(&self, pid: u64, oid: u64) -> Result<Option<Kind>, OsdError> {
        if pid == 0 && oid == 0 {
            return Ok(Some(Kind::Root));
        }
        let code: Option<i64> = self
            .db
            .query_row(
                "SELECT kind FROM objects WHERE pid = ?1 AND oid = ?2",
                params![key(pid), key(oid)],
                |r| r.get(0),
            )
            .optional()?;
        Ok(code.map(|c| Kind::from_code(c as u8)))
    }

    pub fn insert(&mut self, pid: u64, oid: u64, kind: Kind, now: u64) -> Result<(), OsdError> {
        self.insert_range(pid, oid, oid, kind, now)
    }

    /// Creates objects `first..=last` of one kind in one transaction.
    pub fn insert_range(
        &mut self,
        pid: u64,
        first: u64,
        last: u64,
        kind: Kind,
        now: u64,
    ) -> Result<(), OsdError> {
        let tx = self.db.transaction()?;
        {
            // Prepared once for the range (was: once per object, which made a 65,535-object
            // CREATE take over a second).
            let mut insert = tx.prepare_cached(
                "INSERT INTO objects (pid, oid, kind, created, attr_accessed, attr_modified,
                 data_accessed, data_modified) VALUES (?1, ?2, ?3, ?4, ?4, ?4, ?4, ?4)",
            )?;
            for oid in first..=last {
                insert.execute(params![key(pid), key(oid), kind.code(), now as i64])?;
            }
        }
        // A user object's data file is made with its first write: one CREATE may make up to
        // 65,535 objects, and that must not cost as many files.
        tx.commit()?;
        Ok(())
    }

    /// Removes an object (or a partition with everything in it), its attributes,
    /// its data, and its membership in collections.
    pub fn remove(&mut self, pid: u64, oid: u64) -> Result<(), OsdError> {
        let tx = self.db.transaction()?;
        if oid == 0 {
            tx.execute("DELETE FROM objects WHERE pid = ?1", params![key(pid)])?;
            tx.execute("DELETE FROM attrs WHERE pid = ?1", params![key(pid)])?;
        } else {
            let (p, o) = (key(pid), key(oid));
            tx.execute(
                "DELETE FROM objects WHERE pid = ?1 AND oid = ?2",
                params![p, o],
            )?;
            tx.execute(
                "DELETE FROM attrs WHERE pid = ?1 AND oid = ?2",
                params![p, o],
            )?;
            // Members of a removed collection leave it.
            tx.execute(
                "DELETE FROM attrs WHERE pid = ?1 AND page = ?2 AND value = ?3",
                params![p, page::USER_COLLECTIONS, oid.to_be_bytes().to_vec()],
            )?;
        }
        tx.commit()?;
        let path = if oid == 0 {
            self.partition_dir(pid)
        } else {
            self.data_path(pid, oid)
        };
        let gone = if oid == 0 {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match gone {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The smallest free id ≥ 0x10000 above every used one (partitions when pid is 0).
    pub fn next_id(&self, pid: u64) -> Result<u64, OsdError> {
        let max: Option<i64> = if pid == 0 {
            self.db
                .query_row("SELECT MAX(pid) FROM objects", [], |r| r.get(0))?
        } else {
            self.db.query_row(
                "SELECT MAX(oid) FROM objects WHERE pid = ?1",
                params![key(pid)],
                |r| r.get(0),
            )?
        };
        Ok(max.map_or(0x10000, |m| unkey(m).saturating_add(1).max(0x10000)))
    }

    /// Up to `limit` ids ≥ `from`, ascending: partitions (pid 0) or objects of `kind`.
    pub fn list(
        &self,
        pid: u64,
        kind: Kind,
        from: u64,
        limit: usize,
    ) -> Result<Vec<u64>, OsdError> {
        let (sql, p) = if pid == 0 {
            (
                "SELECT pid FROM objects WHERE oid = ?1 AND kind = ?2 AND pid >= ?3 ORDER BY pid LIMIT ?4",
                key(0),
            )
        } else {
            (
                "SELECT oid FROM objects WHERE pid = ?1 AND kind = ?2 AND oid >= ?3 ORDER BY oid LIMIT ?4",
                key(pid),
            )
        };
        let kind = if pid == 0 { Kind::Partition } else { kind };
        let mut stmt = self.db.prepare_cached(sql)?;
        let rows = stmt.query_map(params![p, kind.code(), key(from), limit as i64], |r| {
            r.get::<_, i64>(0)
        })?;
        Ok(rows.map(|r| r.map(unkey)).collect::<Result<_, _>>()?)
    }

    /// Up to `limit` user objects ≥ `from` that are members of collection `cid`.
    pub fn members(
        &self,
        pid: u64,
        cid: u64,
        from: u64,
        limit: usize,
    ) -> Result<Vec<u64>, OsdError> {
        let mut stmt = self.db.prepare_cached(
            "SELECT DISTINCT oid FROM attrs WHERE pid = ?1 AND page = ?2 AND value = ?3
             AND oid >= ?4 ORDER BY oid LIMIT ?5",
        )?;
        let cid = cid.to_be_bytes().to_vec();
        let rows = stmt.query_map(
            params![
                key(pid),
                page::USER_COLLECTIONS,
                cid,
                key(from),
                limit as i64
            ],
            |r| r.get::<_, i64>(0),
        )?;
        Ok(rows.map(|r| r.map(unkey)).collect::<Result<_, _>>()?)
    }

    /// Objects (user objects and collections) in a partition, or partitions in the root.
    pub fn count(&self, pid: u64) -> Result<u64, OsdError> {
        let n: i64 = if pid == 0 {
            self.db.query_row(
                "SELECT COUNT(*) FROM objects WHERE oid = ?1 AND kind = ?2",
                params![key(0), Kind::Partition.code()],
                |r| r.get(0),
            )?
        } else {
            let mut stmt = self
                .db
                .prepare_cached("SELECT COALESCE(SUM(objects), 0) FROM usage WHERE pid = ?1")?;
            stmt.query_row(params![key(pid)], |r| r.get(0))?
        };
        Ok(n as u64)
    }

    /// Sum of user object logical lengths: of one partition, or of all (pid 0).
    pub fn used(&self, pid: u64) -> Result<u64, OsdError> {
        let n: i64 = if pid == 0 {
            let mut stmt = self
                .db
                .prepare_cached("SELECT COALESCE(SUM(used), 0) FROM usage")?;
            stmt.query_row([], |r| r.get(0))?
        } else {
            let mut stmt = self
                .db
                .prepare_cached("SELECT COALESCE(SUM(used), 0) FROM usage WHERE pid = ?1")?;
            stmt.query_row(params![key(pid)], |r| r.get(0))?
        };
        Ok(n as u64)
    }

    pub fn length(&self, pid: u64, oid: u64) -> Result<u64, OsdError> {
        let n: i64 = self.db.query_row(
            "SELECT length FROM objects WHERE pid = ?1 AND oid = ?2",
            params![key(pid), key(oid)],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Sets the logical length, truncating or zero-extending the data.
    pub fn set_length(&self, pid: u64, oid: u64, len: u64) -> Result<(), OsdError> {
        self.data_file(pid, oid)?.set_len(len)?;
        self.db.execute(
            "UPDATE objects SET length = ?3 WHERE pid = ?1 AND oid = ?2",
            params![key(pid), key(oid), len as i64],
        )?;
        Ok(())
    }

    pub fn times(&self, pid: u64, oid: u64) -> Result<Times, OsdError> {
        Ok(self.db.query_row(
            "SELECT created, attr_accessed, attr_modified, data_accessed, data_modified
             FROM objects WHERE pid = ?1 AND oid = ?2",
            params![key(pid), key(oid)],
            |r| {
                Ok(Times {
                    created: r.get::<_, i64>(0)? as u64,
                    attr_accessed: r.get::<_, i64>(1)? as u64,
                    attr_modified: r.get::<_, i64>(2)? as u64,
                    data_accessed: r.get::<_, i64>(3)? as u64,
                    data_modified: r.get::<_, i64>(4)? as u64,
                })
            },
        )?)
    }

    /// Updates the named timestamp columns (from a fixed set) to `now`.
    pub fn touch(&self, pid: u64, oid: u64, columns: &[&str], now: u64) -> Result<(), OsdError> {
        for c in columns {
            debug_assert!(c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'));
            self.db.execute(
                &format!("UPDATE objects SET {c} = ?3 WHERE pid = ?1 AND oid = ?2"),
                params![key(pid), key(oid), now as i64],
            )?;
        }
        Ok(())
    }

    pub fn attr(
        &self,
        pid: u64,
        oid: u64,
        page: u32,
        number: u32,
    ) -> Result<Option<Vec<u8>>, OsdError> {
        Ok(self
            .db
            .query_row(
                "SELECT value FROM attrs WHERE pid = ?1 AND oid = ?2 AND page = ?3 AND number = ?4",
                params![key(pid), key(oid), page, number],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Stores an attribute; an empty value removes it (makes it undefined).
    pub fn set_attr(
        &self,
        pid: u64,
        oid: u64,
        page: u32,
        number: u32,
        value: &[u8],
    ) -> Result<(), OsdError> {
        if value.is_empty() {
            self.db.execute(
                "DELETE FROM attrs WHERE pid = ?1 AND oid = ?2 AND page = ?3 AND number = ?4",
                params![key(pid), key(oid), page, number],
            )?;
        } else {
            self.db.execute(
                "INSERT OR REPLACE INTO attrs (pid, oid, page, number, value) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![key(pid), key(oid), page, number, value],
            )?;
        }
        Ok(())
    }

    /// Stored attributes of one page, by number.
    pub fn page_attrs(
        &self,
        pid: u64,
        oid: u64,
        page: u32,
    ) -> Result<Vec<(u32, Vec<u8>)>, OsdError> {
        let mut stmt = self.db.prepare_cached(
            "SELECT number, value FROM attrs WHERE pid = ?1 AND oid = ?2 AND page = ?3 ORDER BY number",
        )?;
        let rows = stmt.query_map(params![key(pid), key(oid), page], |r| {
            Ok((r.get::<_, u32>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Pages with stored attributes on an object.
    pub fn stored_pages(&self, pid: u64, oid: u64) -> Result<Vec<u32>, OsdError> {
        let mut stmt = self.db.prepare_cached(
            "SELECT DISTINCT page FROM attrs WHERE pid = ?1 AND oid = ?2 ORDER BY page",
        )?;
        let rows = stmt.query_map(params![key(pid), key(oid)], |r| r.get::<_, u32>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn write(&self, pid: u64, oid: u64, offset: u64, data: &[u8]) -> Result<(), OsdError> {
        self.data_file(pid, oid)?.write_all_at(data, offset)?;
        Ok(())
    }

    /// Reads up to `len` bytes at `offset`, stopping at the end of the data (an object
    /// never written has none).
    pub fn read(&self, pid: u64, oid: u64, offset: u64, len: usize) -> Result<Vec<u8>, OsdError> {
        let file = match File::open(self.data_path(pid, oid)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            f => f?,
        };
        let end = file.metadata()?.len();
        let n = end.saturating_sub(offset).min(len as u64) as usize;
        let mut buf = vec![0u8; n];
        file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Bytes the file system holds for an object's data.
    pub fn allocated(&self, pid: u64, oid: u64) -> Result<u64, OsdError> {
        use std::os::unix::fs::MetadataExt;
        match fs::metadata(self.data_path(pid, oid)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0), // never written
            m => Ok(m?.blocks() * 512),
        }
    }

    /// Makes one object's data and every attribute durable (a WRITE with FUA).
    pub fn sync_object(&self, pid: u64, oid: u64) -> Result<(), OsdError> {
        match File::open(self.data_path(pid, oid)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // no data yet
            f => f?.sync_data()?,
        }
        self.db.execute_batch("PRAGMA wal_checkpoint;")?;
        Ok(())
    }

    /// Makes every written byte durable (FLUSH and friends).
    pub fn sync_all(&self) -> Result<(), OsdError> {
        self.db.execute_batch("PRAGMA wal_checkpoint;")?;
        for part in fs::read_dir(self.dir.join("data"))? {
            for obj in fs::read_dir(part?.path())? {
                File::open(obj?.path())?.sync_all()?;
            }
        }
        Ok(())
    }

    fn partition_dir(&self, pid: u64) -> PathBuf {
        self.dir.join("data").join(format!("{pid:016x}"))
    }

    fn data_path(&self, pid: u64, oid: u64) -> PathBuf {
        let dir = self.partition_dir(pid);
        // The partition directory is made lazily with its first object.
        let _ = fs::create_dir_all(&dir);
        dir.join(format!("{oid:016x}"))
    }

    fn data_file(&self, pid: u64, oid: u64) -> Result<File, OsdError> {
        Ok(OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.data_path(pid, oid))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_order_of_large_ids() {
        assert!(key(1) < key(u64::MAX));
        assert!(key(0x7FFF_FFFF_FFFF_FFFF) < key(0x8000_0000_0000_0000));
        assert_eq!(unkey(key(u64::MAX)), u64::MAX);
    }

    #[test]
    fn objects_take_no_file_until_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path(), 1 << 20).unwrap();
        s.insert(0x10000, 0, Kind::Partition, 5).unwrap();
        s.insert_range(0x10000, 0x10000, 0x10000 + 65_534, Kind::User, 5)
            .unwrap();
        assert_eq!(s.count(0x10000).unwrap(), 65_535);
        assert_eq!(walk_files(&dir.path().join("data")), 0, "no data file yet");
        assert!(s.read(0x10000, 0x10005, 0, 100).unwrap().is_empty());
        assert_eq!(s.allocated(0x10000, 0x10005).unwrap(), 0);
        s.sync_object(0x10000, 0x10005).unwrap();
        s.write(0x10000, 0x10005, 0, b"abc").unwrap();
        assert_eq!(s.read(0x10000, 0x10005, 0, 100).unwrap(), b"abc");
        s.remove(0x10000, 0x10006).unwrap();
    }

    /// Regular files under `d`, recursively.
    fn walk_files(d: &Path) -> usize {
        fs::read_dir(d).map_or(0, |it| {
            it.flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk_files(&e.path()),
                    _ => 1,
                })
                .sum()
        })
    }

    #[test]
    fn objects_and_attrs_persist() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = Store::open(dir.path(), 1 << 20).unwrap();
            s.insert(0x10000, 0, Kind::Partition, 5).unwrap();
            s.insert(0x10000, 0x10000, Kind::User, 5).unwrap();
            s.set_attr(0x10000, 0x10000, 0x10000, 1, b"v").unwrap();
            s.write(0x10000, 0x10000, 3, b"xyz").unwrap();
            s.set_length(0x10000, 0x10000, 6).unwrap();
        }
        let s = Store::open(dir.path(), 7).unwrap();
        assert_eq!(s.capacity().unwrap(), 1 << 20);
        assert_eq!(s.kind(0x10000, 0x10000).unwrap(), Some(Kind::User));
        assert_eq!(s.read(0x10000, 0x10000, 0, 100).unwrap(), b"\0\0\0xyz");
        assert_eq!(s.attr(0x10000, 0x10000, 0x10000, 1).unwrap().unwrap(), b"v");
        assert_eq!(s.next_id(0x10000).unwrap(), 0x10001);
        assert_eq!(s.next_id(0).unwrap(), 0x10001);
    }

    /// The sums the triggers keep equal a scan of the objects, through every change and a
    /// reopen.
    #[test]
    fn usage_sums_follow_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let scan = |s: &Store, pid: u64| -> (u64, u64) {
            let sql = "SELECT COALESCE(SUM(length), 0), COALESCE(SUM(kind IN (64, 128)), 0)
                       FROM objects WHERE pid = ?1";
            let (u, n): (i64, i64) =
                s.db.query_row(sql, params![key(pid)], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap();
            (u as u64, n as u64)
        };
        let (a, b) = (0x10000, 0x20000);
        {
            let mut s = Store::open(dir.path(), 1 << 30).unwrap();
            s.insert(a, 0, Kind::Partition, 1).unwrap();
            s.insert(b, 0, Kind::Partition, 1).unwrap();
            for oid in 0x10000..0x10010 {
                s.insert(a, oid, Kind::User, 1).unwrap();
                s.set_length(a, oid, oid - 0xF000).unwrap();
            }
            s.insert(a, 0x30000, Kind::Collection, 1).unwrap();
            s.insert(b, 0x10000, Kind::User, 1).unwrap();
            s.set_length(b, 0x10000, 5000).unwrap();
            s.set_length(a, 0x10003, 7).unwrap();
            s.remove(a, 0x10005).unwrap();
            for pid in [a, b] {
                assert_eq!((s.used(pid).unwrap(), s.count(pid).unwrap()), scan(&s, pid));
            }
            assert_eq!(s.count(a).unwrap(), 16);
            assert_eq!(s.used(0).unwrap(), scan(&s, a).0 + scan(&s, b).0);
        }
        let s = Store::open(dir.path(), 1 << 30).unwrap();
        for pid in [a, b] {
            assert_eq!((s.used(pid).unwrap(), s.count(pid).unwrap()), scan(&s, pid));
        }
    }
}
