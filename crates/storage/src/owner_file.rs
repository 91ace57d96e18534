//! [`FileOwner`]: a LUN's ownership ([`ExclusiveOwner`]) kept in a lock file every gateway
//! reaches, for shared storage with no lock of its own (a file or block device that several
//! gateway processes on one host serve).
//!
//! The owner holds an exclusive `flock(2)` lock on the file. Such a lock belongs to the open
//! file description, as an OFD lock does: two `FileOwner`s exclude each other even inside
//! one process, and the kernel drops the lock when the holder's descriptor closes, however
//! its process ended (`kill -9` included). Beside the lock the file holds two records of
//! text, each with a CRC32C so that a read racing a write is noticed and read again:
//!
//! * bytes 0..256, written only by the lock's holder: `owner EPOCH held|released ID CRC`;
//!   the epoch counts acquisitions, so a request can name the hold it is about;
//! * bytes 256..512, written by a gateway that wants the LUN: `request EPOCH asks ID CRC`.
//!
//! No process can break another's kernel lock, and none needs to: on one host the kernel is
//! the fence. A dead holder's lock is gone at once; a live one is asked. `acquire(force)`
//! while another gateway holds the lock writes a request naming that holder's epoch and
//! returns false; the holder's [`ExclusiveOwner::is_owner`] answers false from then on, and
//! its caller (the ALUA layer) lets its writes in flight finish, then calls
//! [`ExclusiveOwner::release`]. Only then can the requester's next `acquire` lock the file,
//! so no write of the old owner lands after one of the new owner's.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::owner::ExclusiveOwner;

/// Bytes of each record's slot in the file.
const SLOT: usize = 256;
const OWNER_AT: u64 = 0;
const REQUEST_AT: u64 = SLOT as u64;
/// Reads of a record that fail their CRC (a write in progress) before it counts as absent.
const READ_TRIES: usize = 4;

/// One gateway's handle on a LUN's ownership kept in a lock file (see the module doc).
#[derive(Debug)]
pub struct FileOwner {
    path: PathBuf,
    id: String,
    file: File,
    /// The epoch of this gateway's hold while it holds the lock.
    held: Mutex<Option<u64>>,
}

/// One record of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    kind: String,
    epoch: u64,
    state: String,
    id: String,
}

impl Record {
    fn encode(&self) -> [u8; SLOT] {
        let text = format!("{} {} {} {}", self.kind, self.epoch, self.state, self.id);
        let line = format!("{text} {:08x}\n", digest::crc32c(text.as_bytes()));
        let mut slot = [b' '; SLOT];
        slot[SLOT - 1] = b'\n';
        let n = line.len().min(SLOT - 1);
        slot[..n].copy_from_slice(&line.as_bytes()[..n]);
        slot
    }

    /// The record in `slot`, if it is whole (its CRC matches).
    fn decode(slot: &[u8]) -> Option<Record> {
        let line = std::str::from_utf8(slot).ok()?.lines().next()?;
        let (text, crc) = line.trim_end().rsplit_once(' ')?;
        if u32::from_str_radix(crc, 16).ok()? != digest::crc32c(text.as_bytes()) {
            return None;
        }
        let mut words = text.split(' ');
        let record = Record {
            kind: words.next()?.to_string(),
            epoch: words.next()?.parse().ok()?,
            state: words.next()?.to_string(),
            id: words.next()?.to_string(),
        };
        words.next().is_none().then_some(record)
    }
}

impl FileOwner {
    /// Opens (creating it if missing) the lock file at `path` for the gateway named `id`
    /// (printable, no spaces, at most 128 bytes). Takes nothing yet.
    pub fn open(path: &Path, id: &str) -> io::Result<FileOwner> {
        if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("owner id {id:?} must be 1..128 printable characters without spaces"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(FileOwner {
            path: path.to_path_buf(),
            id: id.to_string(),
            file,
            held: Mutex::new(None),
        })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn held(&self) -> MutexGuard<'_, Option<u64>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self, at: u64) -> io::Result<Option<Record>> {
        let mut slot = [0u8; SLOT];
        for _ in 0..READ_TRIES {
            let n = self.file.read_at(&mut slot, at)?;
            if n == 0 {
                return Ok(None);
            }
            if let Some(r) = Record::decode(&slot[..n]) {
                return Ok(Some(r));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(None)
    }

    fn write(&self, at: u64, record: &Record) -> io::Result<()> {
        self.file.write_all_at(&record.encode(), at)?;
        self.file.sync_data()
    }

    fn record(&self, kind: &str, epoch: u64, state: &str) -> Record {
        Record {
            kind: kind.into(),
            epoch,
            state: state.into(),
            id: self.id.clone(),
        }
    }

    /// Whether the path still names the file this handle locks (not removed or replaced).
    fn same_file(&self) -> io::Result<bool> {
        let at_path = std::fs::metadata(&self.path)?;
        let ours = self.file.metadata()?;
        Ok(at_path.dev() == ours.dev() && at_path.ino() == ours.ino())
    }
}

impl ExclusiveOwner for FileOwner {
    fn id(&self) -> &str {
        &self.id
    }

    /// Locks the file if nobody holds it, and writes this gateway's record with the next
    /// epoch. With `force`, while a live gateway holds it, writes a request for its hold
    /// (which that gateway's `is_owner` then sees) and returns false: a live holder's kernel
    /// lock cannot be broken; it gives the lock up itself.
    fn acquire(&self, force: bool) -> io::Result<bool> {
        let mut held = self.held();
        if held.is_some() {
            return Ok(true);
        }
        match self.file.try_lock() {
            Ok(()) => {
                let epoch = self.read(OWNER_AT)?.map_or(0, |r| r.epoch) + 1;
                if let Err(e) = self.write(OWNER_AT, &self.record("owner", epoch, "held")) {
                    let _ = self.file.unlock();
                    return Err(e);
                }
                *held = Some(epoch);
                Ok(true)
            }
            Err(TryLockError::WouldBlock) => {
                if force {
                    if let Some(holder) = self.read(OWNER_AT)?.filter(|r| r.id != self.id) {
                        self.write(REQUEST_AT, &self.record("request", holder.epoch, "asks"))?;
                    }
                }
                Ok(false)
            }
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Marks the record released and unlocks; nothing to do when not held.
    fn release(&self) -> io::Result<()> {
        let mut held = self.held();
        let Some(epoch) = held.take() else {
            return Ok(());
        };
        let marked = self.write(OWNER_AT, &self.record("owner", epoch, "released"));
        let unlocked = self.file.unlock();
        marked.and(unlocked)
    }

    /// False when not held, when another gateway asked for this hold, or when the lock file
    /// was removed or replaced under it.
    fn is_owner(&self) -> io::Result<bool> {
        let Some(epoch) = *self.held() else {
            return Ok(false);
        };
        if !self.same_file()? {
            return Ok(false);
        }
        let ours = self.read(OWNER_AT)?;
        if ours
            .as_ref()
            .is_none_or(|r| r.epoch != epoch || r.id != self.id)
        {
            return Ok(false);
        }
        let asked = self
            .read(REQUEST_AT)?
            .is_some_and(|r| r.epoch == epoch && r.id != self.id);
        Ok(!asked)
    }

    /// The holder's id as its record says, if a live process holds the lock. (Telling a
    /// dead holder's leftover record from a live one takes a shared lock for an instant;
    /// an `acquire` at that instant finds the file busy and tries again later.)
    fn owner(&self) -> io::Result<Option<String>> {
        if self.held().is_some() {
            return Ok(Some(self.id.clone()));
        }
        let Some(record) = self.read(OWNER_AT)? else {
            return Ok(None);
        };
        if record.state != "held" {
            return Ok(None);
        }
        match self.file.try_lock_shared() {
            Ok(()) => {
                self.file.unlock()?;
                Ok(None)
            }
            Err(TryLockError::WouldBlock) => Ok(Some(record.id)),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

/// A gateway going away hands the LUN over cleanly (the kernel would drop the lock anyway).
impl Drop for FileOwner {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn lock_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ironsan-owner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn records_round_trip_and_a_torn_one_is_refused() {
        let r = Record {
            kind: "owner".into(),
            epoch: 7,
            state: "held".into(),
            id: "gw-a".into(),
        };
        let slot = r.encode();
        assert_eq!(Record::decode(&slot), Some(r));
        let mut torn = slot;
        torn[8] = b'9';
        assert_eq!(Record::decode(&torn), None);
        assert_eq!(Record::decode(&[0u8; SLOT]), None);
    }

    #[test]
    fn two_owners_of_one_file_exclude_each_other() {
        let path = lock_path("two");
        let a = FileOwner::open(&path, "gw-a").unwrap();
        let b = FileOwner::open(&path, "gw-b").unwrap();
        assert!(a.acquire(false).unwrap());
        assert!(a.is_owner().unwrap());
        assert!(!b.acquire(false).unwrap());
        assert!(!b.is_owner().unwrap());
        assert_eq!(b.owner().unwrap().as_deref(), Some("gw-a"));
        assert_eq!(a.owner().unwrap().as_deref(), Some("gw-a"));

        // A forced acquire cannot break a live lock: it asks, and the holder hears it.
        assert!(!b.acquire(true).unwrap());
        assert!(!a.is_owner().unwrap(), "the holder sees the request");
        assert!(!b.acquire(false).unwrap(), "still locked until released");
        a.release().unwrap();
        assert_eq!(b.owner().unwrap(), None, "released");
        assert!(b.acquire(false).unwrap());
        assert!(b.is_owner().unwrap(), "the old request named the old hold");
        assert_eq!(a.owner().unwrap().as_deref(), Some("gw-b"));
        assert!(!a.is_owner().unwrap());

        // Dropping the holder unlocks.
        drop(b);
        assert!(a.acquire(false).unwrap());
        assert!(a.is_owner().unwrap());
    }

    #[test]
    fn a_replaced_lock_file_ends_the_hold() {
        let path = lock_path("replaced");
        let a = FileOwner::open(&path, "gw-a").unwrap();
        assert!(a.acquire(false).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(a.is_owner().is_err() || !a.is_owner().unwrap());
        std::fs::write(&path, b"").unwrap();
        assert!(!a.is_owner().unwrap());
    }

    #[test]
    fn ids_with_spaces_are_refused() {
        let path = lock_path("ids");
        assert!(FileOwner::open(&path, "gw a").is_err());
        assert!(FileOwner::open(&path, "").is_err());
    }

    /// The child side of `a_killed_holder_loses_the_lock`: takes the lock named by the
    /// environment, says so, and waits to be killed (30 s at most).
    #[test]
    #[ignore = "run by a_killed_holder_loses_the_lock as a child process"]
    fn lock_holder_child() {
        let Ok(path) = std::env::var("IRONSAN_OWNER_CHILD_LOCK") else {
            return;
        };
        let owner = FileOwner::open(Path::new(&path), "child").unwrap();
        assert!(owner.acquire(false).unwrap());
        println!("locked");
        std::thread::sleep(Duration::from_secs(30));
    }

    #[test]
    fn a_killed_holder_loses_the_lock() {
        let path = lock_path("killed");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "owner_file::tests::lock_holder_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IRONSAN_OWNER_CHILD_LOCK", &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            match lines.next() {
                Some(Ok(l)) if l.contains("locked") => break,
                Some(Ok(_)) => continue,
                _ => panic!("the child ended before taking the lock"),
            }
        }
        let us = FileOwner::open(&path, "parent").unwrap();
        assert!(!us.acquire(true).unwrap(), "a live holder keeps it");
        assert_eq!(us.owner().unwrap().as_deref(), Some("child"));
        child.kill().unwrap(); // SIGKILL: no chance to release
        child.wait().unwrap();
        assert_eq!(us.owner().unwrap(), None, "a dead holder's record is stale");
        assert!(us.acquire(false).unwrap(), "the kernel dropped the lock");
        assert!(us.is_owner().unwrap());
    }
}
