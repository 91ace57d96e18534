//! A [`SharedBlob`] in a file that every gateway reaches (a shared file system): the
//! record is a 28-byte header (magic, format, version, payload length, CRC32C of the
//! payload) and the payload. A change takes an exclusive `flock` on a lock file beside the
//! record (`PATH.lock`, never replaced, so every writer locks the same inode), checks the
//! version, writes a temporary file, fsyncs it, renames it over the record and fsyncs the
//! directory: a reader sees the old record or the new one, never a torn one, and a
//! writer that dies before the rename leaves the record as it was. Reads take the lock
//! shared. A record that fails its checks is an error that says so, never an empty one.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

use crate::SharedBlob;

const MAGIC: &[u8; 8] = b"IRSNBLOB";
/// The header's layout number: a record of another layout is refused, not guessed at.
const FORMAT: u32 = 1;
const HEADER: usize = 28;
/// Records are small (persistent reservations); anything larger is not one of ours.
const MAX_PAYLOAD: usize = 16 << 20;

/// A versioned record in the file `path` (see the module documentation).
#[derive(Debug)]
pub struct FileBlob {
    path: PathBuf,
    lock_path: PathBuf,
}

impl FileBlob {
    /// The record at `path`; nothing is created until the first write. Its directory must
    /// exist and be writable (the lock file and temporary files go there).
    pub fn new(path: impl Into<PathBuf>) -> FileBlob {
        let path = path.into();
        let mut lock = path.clone().into_os_string();
        lock.push(".lock");
        FileBlob {
            path,
            lock_path: PathBuf::from(lock),
        }
    }

    /// Where the record lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock file, opened (created when missing) and locked as `op` asks.
    fn lock(&self, op: FlockOperation) -> io::Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.lock_path)
            .map_err(|e| with_path(e, &self.lock_path))?;
        flock(&f, op)?;
        Ok(f)
    }

    /// The record as it is on disk (the caller holds the lock).
    fn load(&self) -> io::Result<(u64, Vec<u8>)> {
        let f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, Vec::new())),
            Err(e) => return Err(with_path(e, &self.path)),
        };
        let mut raw = Vec::new();
        f.take((HEADER + MAX_PAYLOAD + 1) as u64)
            .read_to_end(&mut raw)?;
        decode(&raw).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: corrupt shared record: {why}", self.path.display()),
            )
        })
    }

    /// Writes `raw` to a temporary file beside the record, fsyncs it, renames it over the
    /// record and fsyncs the directory.
    fn replace(&self, raw: &[u8]) -> io::Result<()> {
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(raw)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(with_path(e, &self.path));
        }
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    }
}

impl SharedBlob for FileBlob {
    fn read(&self) -> io::Result<(u64, Vec<u8>)> {
        let _lock = self.lock(FlockOperation::LockShared)?;
        self.load()
    }

    fn compare_and_write(&self, expected: u64, data: &[u8]) -> io::Result<Option<u64>> {
        if data.len() > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a shared record holds at most {MAX_PAYLOAD} bytes"),
            ));
        }
        let _lock = self.lock(FlockOperation::LockExclusive)?;
        let (version, _) = self.load()?;
        if version != expected {
            return Ok(None);
        }
        let next = version + 1;
        self.replace(&encode(next, data))?;
        Ok(Some(next))
    }
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Header and payload: magic, format (u32), version (u64), length (u32), CRC32C of the
/// payload (u32), all big-endian.
fn encode(version: u64, payload: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(HEADER + payload.len());
    raw.extend_from_slice(MAGIC);
    raw.extend_from_slice(&FORMAT.to_be_bytes());
    raw.extend_from_slice(&version.to_be_bytes());
    raw.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    raw.extend_from_slice(&digest::crc32c(payload).to_be_bytes());
    raw.extend_from_slice(payload);
    raw
}

/// The version and payload of a whole record, or what is wrong with it.
fn decode(raw: &[u8]) -> Result<(u64, Vec<u8>), String> {
    if raw.len() < HEADER {
        return Err(format!("{} bytes, shorter than its header", raw.len()));
    }
    if &raw[..8] != MAGIC {
        return Err("not an ironsan shared record (bad magic)".into());
    }
    let word = |at: usize| u32::from_be_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    let format = word(8);
    if format != FORMAT {
        return Err(format!("layout {format}, this build reads {FORMAT}"));
    }
    let version = (u64::from(word(12)) << 32) | u64::from(word(16));
    let len = word(20) as usize;
    let payload = &raw[HEADER..];
    if payload.len() != len {
        return Err(format!(
            "header says {len} payload bytes, the file has {}",
            payload.len()
        ));
    }
    if digest::crc32c(payload) != word(24) {
        return Err("payload CRC32C mismatch".into());
    }
    if version == 0 {
        return Err("version 0 is never written".into());
    }
    Ok((version, payload.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn empty_then_versions_advance() {
        let d = dir();
        let b = FileBlob::new(d.path().join("pr"));
        assert_eq!(b.read().unwrap(), (0, Vec::new()));
        assert_eq!(b.compare_and_write(0, b"one").unwrap(), Some(1));
        assert_eq!(b.compare_and_write(0, b"stale").unwrap(), None);
        assert_eq!(b.compare_and_write(1, b"two").unwrap(), Some(2));
        assert_eq!(b.read().unwrap(), (2, b"two".to_vec()));
        // Another handle on the same file (another gateway) sees the same record.
        let other = FileBlob::new(d.path().join("pr"));
        assert_eq!(other.read().unwrap(), (2, b"two".to_vec()));
        assert_eq!(other.compare_and_write(2, b"").unwrap(), Some(3));
        assert_eq!(b.read().unwrap(), (3, Vec::new()));
    }

    #[test]
    fn racing_writers_one_wins_per_version() {
        let d = dir();
        let path = d.path().join("pr");
        let threads = 4;
        let rounds = 25;
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let path = path.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let blob = FileBlob::new(path);
                    let mut won = Vec::new();
                    for _ in 0..rounds {
                        barrier.wait();
                        let (v, _) = blob.read().unwrap();
                        barrier.wait();
                        let tag = format!("{t}");
                        if let Some(next) = blob.compare_and_write(v, tag.as_bytes()).unwrap() {
                            assert_eq!(next, v + 1);
                            won.push(next);
                        }
                    }
                    won
                })
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        // Every thread read the same version each round: exactly one won it.
        assert_eq!(all, (1..=rounds as u64).collect::<Vec<_>>());
        assert_eq!(FileBlob::new(&path).read().unwrap().0, rounds as u64);
    }

    #[test]
    fn torn_temp_file_never_replaces_the_record() {
        let d = dir();
        let path = d.path().join("pr");
        let b = FileBlob::new(&path);
        b.compare_and_write(0, b"kept").unwrap();
        // A writer that died mid-write leaves its temporary file, never renamed.
        let full = encode(2, b"half-written record");
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp.99999");
        std::fs::write(&tmp, &full[..full.len() / 2]).unwrap();
        assert_eq!(b.read().unwrap(), (1, b"kept".to_vec()));
        assert_eq!(b.compare_and_write(1, b"next").unwrap(), Some(2));
        assert_eq!(b.read().unwrap(), (2, b"next".to_vec()));
    }

    #[test]
    fn corrupt_record_is_an_error_not_empty() {
        let d = dir();
        let path = d.path().join("pr");
        let b = FileBlob::new(&path);
        b.compare_and_write(0, b"payload").unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        for (bad, why) in [
            (good[..good.len() - 1].to_vec(), "payload bytes"),
            (flipped, "CRC32C"),
            (b"IRSNBLOB".to_vec(), "shorter"),
            (vec![0u8; 40], "magic"),
        ] {
            std::fs::write(&path, &bad).unwrap();
            let e = b.read().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(why), "{e}");
            // A writer does not overwrite what it cannot read either.
            assert!(b.compare_and_write(1, b"x").is_err());
        }
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes() {
        use proptest::prelude::*;
        proptest!(|(raw in proptest::collection::vec(any::<u8>(), 0..64), v in 1u64.., p in proptest::collection::vec(any::<u8>(), 0..32))| {
            let _ = decode(&raw);
            prop_assert_eq!(decode(&encode(v, &p)), Ok((v, p.clone())));
        });
    }

    /// The cost of one read (open the lock file, flock shared, read the record), which a
    /// shared LUN pays at most once per refresh interval.
    #[test]
    fn read_cost() {
        let d = dir();
        let b = FileBlob::new(d.path().join("pr"));
        b.compare_and_write(0, &[7u8; 512]).unwrap();
        let n = 2000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            b.read().unwrap();
        }
        let each = t.elapsed() / n;
        eprintln!("FileBlob::read: {each:?} each");
        assert!(each < std::time::Duration::from_millis(5), "{each:?}");
    }
}
