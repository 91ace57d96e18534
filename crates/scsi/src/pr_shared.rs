//! Persistent reservations kept in a [`SharedBlob`] beside the LUN, so that the gateways
//! exporting one LUN (each its own relative target port) share them and a gateway's restart
//! keeps them (docs/reservations.md).
//!
//! Every PERSISTENT RESERVE OUT reads the record, applies the pure transitions of
//! [`crate::pr`] and writes it back with `compare_and_write`, again on a lost race (at most
//! [`MAX_TRIES`] times); PERSISTENT RESERVE IN answers from a fresh read. The reservation
//! checks of other commands use the LUN's cached copy, read again by the first command
//! that finds it older than [`REFRESH`] or, for a record in a file, finds the file changed
//! (a `stat` per command): a change made through another gateway is enforced here for
//! every command that starts after it completed (a file record) or at least [`REFRESH`]
//! after (a backend's record, or a file whose `stat` cannot tell, as when two writes in
//! one timestamp tick reuse an inode and a size). The record also logs the
//! unit attentions each change owes (the last [`LOG_MAX`]), and each gateway raises those
//! owed to its own nexuses when it first sees them. Blob calls run on a blocking thread.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use storage::SharedBlob;

use crate::pr::{Notice, PrState, Registration, Reservation};

/// How old the cached copy may get before a command reads the record again.
pub(crate) const REFRESH: Duration = Duration::from_millis(100);
/// Attempts of one PERSISTENT RESERVE OUT against writers of other gateways.
pub(crate) const MAX_TRIES: usize = 16;
/// Unit attentions kept in the record for gateways that have not seen them yet.
pub(crate) const LOG_MAX: usize = 256;

/// `SharedPr::refreshed` and `Seen::version` of a link whose record was never read.
pub(crate) const NEVER: u64 = u64::MAX;

/// The record's layout number (the first payload byte).
const FORMAT: u8 = 1;

/// What the shared record holds: the reservation state, and the unit attentions its
/// changes owed, numbered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub pr: PrState,
    /// The number of the last notice ever logged.
    pub seq: u64,
    pub log: VecDeque<(u64, Notice)>,
}

impl Record {
    /// Logs `notices` (dropping the oldest past [`LOG_MAX`]).
    pub fn log_notices(&mut self, notices: Vec<Notice>) {
        for n in notices {
            self.seq += 1;
            self.log.push_back((self.seq, n));
        }
        while self.log.len() > LOG_MAX {
            self.log.pop_front();
        }
    }

    /// Version 1 layout, big-endian: format u8, flags u8 (bit 0 APTPL), generation u32,
    /// seq u64; registrations: count u16, each key u64, rtp u16, flags u8 (bit 0
    /// ALL_TG_PT), port (u16 length + UTF-8), TransportID (u16 length + bytes);
    /// reservation: present u8, then rtype u8, holder rtp u16, holder port; notices:
    /// count u16, each seq u64, ASC u8, ASCQ u8, rtp u16, ALL_TG_PT u8, port.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64 + self.pr.regs.len() * 64);
        w.push(FORMAT);
        w.push(u8::from(self.pr.aptpl));
        w.extend_from_slice(&self.pr.generation.to_be_bytes());
        w.extend_from_slice(&self.seq.to_be_bytes());
        w.extend_from_slice(&(self.pr.regs.len() as u16).to_be_bytes());
        for g in &self.pr.regs {
            w.extend_from_slice(&g.key.to_be_bytes());
            w.extend_from_slice(&g.rtp.to_be_bytes());
            w.push(u8::from(g.all_tg_pt));
            put_bytes(&mut w, g.port.as_bytes());
            put_bytes(&mut w, &g.transport_id);
        }
        match &self.pr.reservation {
            Some(r) => {
                w.push(1);
                w.push(r.rtype);
                w.extend_from_slice(&r.holder_rtp.to_be_bytes());
                put_bytes(&mut w, r.holder.as_bytes());
            }
            None => w.push(0),
        }
        w.extend_from_slice(&(self.log.len() as u16).to_be_bytes());
        for (seq, n) in &self.log {
            w.extend_from_slice(&seq.to_be_bytes());
            w.extend_from_slice(&[n.code.0, n.code.1]);
            w.extend_from_slice(&n.rtp.to_be_bytes());
            w.push(u8::from(n.all_tg_pt));
            put_bytes(&mut w, n.port.as_bytes());
        }
        w
    }

    /// The record in `raw` (empty: never written, the empty state), or what is wrong with it.
    pub fn decode(raw: &[u8]) -> Result<Record, String> {
        if raw.is_empty() {
            return Ok(Record::default());
        }
        let mut r = Reader { raw, at: 0 };
        let format = r.u8()?;
        if format != FORMAT {
            return Err(format!(
                "reservation record layout {format}, this build reads {FORMAT}"
            ));
        }
        let mut rec = Record::default();
        rec.pr.aptpl = r.u8()? & 1 != 0;
        rec.pr.generation = r.u32()?;
        rec.seq = r.u64()?;
        for _ in 0..r.u16()? {
            let key = r.u64()?;
            let rtp = r.u16()?;
            let all_tg_pt = r.u8()? & 1 != 0;
            let port = r.text()?;
            let transport_id = Bytes::copy_from_slice(r.bytes()?);
            rec.pr.regs.push(Registration {
                port,
                rtp,
                all_tg_pt,
                key,
                transport_id,
            });
        }
        rec.pr.reservation = match r.u8()? {
            0 => None,
            1 => {
                let rtype = r.u8()?;
                let holder_rtp = r.u16()?;
                let holder = r.text()?;
                Some(Reservation {
                    holder,
                    holder_rtp,
                    rtype,
                })
            }
            other => return Err(format!("reservation flag {other}")),
        };
        for _ in 0..r.u16()? {
            let seq = r.u64()?;
            let code = (r.u8()?, r.u8()?);
            let rtp = r.u16()?;
            let all_tg_pt = r.u8()? & 1 != 0;
            let port = r.text()?;
            rec.log.push_back((
                seq,
                Notice {
                    port,
                    rtp,
                    all_tg_pt,
                    code,
                },
            ));
        }
        if r.at != raw.len() {
            return Err(format!("{} bytes after the record", raw.len() - r.at));
        }
        Ok(rec)
    }
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(u16::MAX as usize)];
    w.extend_from_slice(&(b.len() as u16).to_be_bytes());
    w.extend_from_slice(b);
}

/// Bounds-checked reading of a record.
struct Reader<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.raw.len());
        let Some(end) = end else {
            return Err(format!("record cut short at byte {}", self.at));
        };
        let s = &self.raw[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok((u64::from(self.u32()?) << 32) | u64::from(self.u32()?))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<Arc<str>, String> {
        let at = self.at;
        std::str::from_utf8(self.bytes()?)
            .map(Arc::from)
            .map_err(|_| format!("initiator port name at byte {at} is not UTF-8"))
    }
}

/// What a gateway last took from the record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub version: u64,
    /// The last notice raised (or skipped as older than this gateway's LUN).
    pub seq: u64,
}

/// A LUN's link to its shared record.
pub(crate) struct SharedPr {
    pub blob: Arc<dyn SharedBlob>,
    epoch: Instant,
    /// When the cached copy was last read (nanoseconds since `epoch`).
    refreshed: AtomicU64,
    /// The record's file, when it is one: a command whose `stat` of it differs from
    /// `stamp` reads the record again at once.
    file: Option<PathBuf>,
    /// What `stat` said of `file` just before the cached copy was read.
    stamp: AtomicU64,
    /// The last re-read failed (logged once until one succeeds).
    pub failing: AtomicBool,
    /// One reader or writer of the record at a time in this gateway, and what it last saw.
    pub seen: tokio::sync::Mutex<Seen>,
}

impl std::fmt::Debug for SharedPr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPr")
            .field("blob", &self.blob)
            .finish()
    }
}

impl SharedPr {
    /// Reads the record once (blocking: the LUN is being built) and returns the link with
    /// the state to start from.
    pub fn open(
        blob: Arc<dyn SharedBlob>,
        file: Option<PathBuf>,
    ) -> Result<(SharedPr, PrState), String> {
        let stamp = stamp_of(file.as_deref()).unwrap_or(0);
        let (version, rec) = decoded(blob.read())?;
        let shared = SharedPr {
            blob,
            epoch: Instant::now(),
            refreshed: AtomicU64::new(0),
            file,
            stamp: AtomicU64::new(stamp),
            failing: AtomicBool::new(false),
            seen: tokio::sync::Mutex::new(Seen {
                version,
                seq: rec.seq,
            }),
        };
        Ok((shared, rec.pr))
    }

    /// The link without a first read: the first command that checks reservations reads the
    /// record ([`SharedPr::due`] from the start), and adopts it without raising the unit
    /// attentions logged before.
    pub fn unread(blob: Arc<dyn SharedBlob>, file: Option<PathBuf>) -> SharedPr {
        SharedPr {
            blob,
            epoch: Instant::now(),
            refreshed: AtomicU64::new(NEVER),
            file,
            stamp: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            seen: tokio::sync::Mutex::new(Seen {
                version: NEVER,
                seq: 0,
            }),
        }
    }

    /// Whether the cached copy is older than [`REFRESH`], or was never read.
    pub fn stale(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let refreshed = self.refreshed.load(Ordering::Acquire);
        refreshed == NEVER || now.saturating_sub(refreshed) >= REFRESH.as_nanos() as u64
    }

    /// Whether a command must read the record before it is checked: the cached copy is
    /// older than [`REFRESH`], or the record's file changed since it was read (a `stat`).
    pub fn due(&self) -> bool {
        self.stale()
            || stamp_of(self.file.as_deref())
                .is_some_and(|now| now != self.stamp.load(Ordering::Acquire))
    }

    pub fn mark_refreshed(&self) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.refreshed.store(now, Ordering::Release);
    }

    /// The record as it is now: its version and contents (on a blocking thread).
    pub async fn read(&self) -> Result<(u64, Record), String> {
        let stamp = stamp_of(self.file.as_deref());
        let blob = self.blob.clone();
        let read = tokio::task::spawn_blocking(move || blob.read())
            .await
            .map_err(|e| e.to_string())?;
        let (version, rec) = decoded(read)?;
        if let Some(stamp) = stamp {
            self.stamp.store(stamp, Ordering::Release);
        }
        Ok((version, rec))
    }

    /// Writes `rec` if the record is still at `version` (on a blocking thread): the new
    /// version, or `None` when another gateway wrote first.
    pub async fn write(&self, version: u64, rec: &Record) -> Result<Option<u64>, String> {
        let blob = self.blob.clone();
        let raw = rec.encode();
        tokio::task::spawn_blocking(move || blob.compare_and_write(version, &raw))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("persistent reservations: {e}"))
    }
}

/// A read of the record, decoded: its version and contents, or what went wrong.
fn decoded(read: std::io::Result<(u64, Vec<u8>)>) -> Result<(u64, Record), String> {
    let (version, raw) = read.map_err(|e| format!("persistent reservations: {e}"))?;
    let rec = Record::decode(&raw)
        .map_err(|e| format!("persistent reservations: corrupt record (version {version}): {e}"))?;
    Ok((version, rec))
}

/// Where a LUN's reservations live, when they are shared.
pub(crate) struct SharedSource {
    pub blob: Arc<dyn SharedBlob>,
    /// The record's file, when it is one.
    pub file: Option<PathBuf>,
    /// Read the record when the LUN is built; otherwise at its first command (a backend that
    /// has not reached its storage yet, whose read would hold the target's start).
    pub read_at_start: bool,
}

/// The shared record a LUN's reservations live in: the configured file, else the record its
/// backend offers; `None` keeps them in memory.
pub(crate) fn source_of(
    cfg: &crate::config::LunConfig,
    backend: &dyn storage::Backend,
) -> Option<SharedSource> {
    if let Some(path) = &cfg.reservations {
        return Some(SharedSource {
            blob: Arc::new(storage::shared_blob_file::FileBlob::new(path.clone())),
            file: Some(path.clone()),
            read_at_start: true,
        });
    }
    let blob = backend.shared_state()?;
    let ready = backend.ready();
    if !ready {
        tracing::warn!(
            "{} LUN {}: its storage is unreachable at start; its persistent reservations are \
             read from the shared record when it is reached (until then every PERSISTENT \
             RESERVE command fails)",
            backend.kind(),
            cfg.serial.as_deref().unwrap_or("-")
        );
    }
    Some(SharedSource {
        blob,
        file: None,
        read_at_start: ready,
    })
}

/// What `stat` says of the record's file, hashed: a rename over it (every write) changes
/// its inode, times or size. `None` without a file or when `stat` fails (the interval
/// then bounds how stale the copy gets); 0 while there is no record yet.
fn stamp_of(file: Option<&Path>) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let m = match std::fs::metadata(file?) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(0),
        Err(_) => return None,
    };
    let fields = [
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime() as u64,
        m.mtime_nsec() as u64,
        m.ctime() as u64,
        m.ctime_nsec() as u64,
    ];
    let bytes: Vec<u8> = fields.iter().flat_map(|f| f.to_be_bytes()).collect();
    Some(crate::config::stable_hash(&[&bytes]).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn port() -> impl Strategy<Value = Arc<str>> {
        "[a-z0-9.:,]{0,40}".prop_map(Arc::from)
    }

    fn record() -> impl Strategy<Value = Record> {
        let reg = (
            port(),
            any::<u16>(),
            any::<bool>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(port, rtp, all_tg_pt, key, tid)| Registration {
                port,
                rtp,
                all_tg_pt,
                key,
                transport_id: Bytes::from(tid),
            });
        let res = proptest::option::of((port(), any::<u16>(), 1u8..9).prop_map(
            |(holder, holder_rtp, rtype)| Reservation {
                holder,
                holder_rtp,
                rtype,
            },
        ));
        let notice = (
            any::<u64>(),
            port(),
            any::<u16>(),
            any::<bool>(),
            any::<u8>(),
        )
            .prop_map(|(seq, port, rtp, all_tg_pt, q)| {
                (
                    seq,
                    Notice {
                        port,
                        rtp,
                        all_tg_pt,
                        code: (0x2A, q),
                    },
                )
            });
        (
            any::<u32>(),
            any::<bool>(),
            any::<u64>(),
            proptest::collection::vec(reg, 0..6),
            res,
            proptest::collection::vec(notice, 0..6),
        )
            .prop_map(|(generation, aptpl, seq, regs, reservation, log)| Record {
                pr: PrState {
                    generation,
                    regs,
                    reservation,
                    aptpl,
                    ptpl_capable: false,
                },
                seq,
                log: log.into(),
            })
    }

    proptest! {
        #[test]
        fn round_trip(rec in record()) {
            prop_assert_eq!(Record::decode(&rec.encode()), Ok(rec));
        }

        #[test]
        fn any_cut_or_flip_is_an_error_or_a_record(rec in record(), cut in any::<usize>(), flip in any::<(usize, u8)>()) {
            let raw = rec.encode();
            let cut = cut % raw.len();
            prop_assert!(Record::decode(&raw[..cut]).is_err() || cut == 0);
            let mut bad = raw.clone();
            let at = flip.0 % bad.len();
            bad[at] ^= flip.1 | 1;
            let _ = Record::decode(&bad);
            let mut longer = raw;
            longer.push(0);
            prop_assert!(Record::decode(&longer).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(&raw);
        }
    }

    fn temp_record(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ironsan-pr-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("lun.pr")
    }

    fn other_gateway_registers(path: &Path, version: u64) {
        let mut rec = Record::default();
        rec.pr.generation = version as u32 + 1;
        let blob = storage::shared_blob_file::FileBlob::new(path);
        assert_eq!(
            blob.compare_and_write(version, &rec.encode()).unwrap(),
            Some(version + 1)
        );
    }

    #[test]
    fn a_changed_file_is_due_at_once_a_record_without_one_after_the_interval() {
        let path = temp_record("due");
        other_gateway_registers(&path, 0);
        let blob = || Arc::new(storage::shared_blob_file::FileBlob::new(&path));
        let (with_file, _) = SharedPr::open(blob(), Some(path.clone())).unwrap();
        let (without, _) = SharedPr::open(blob(), None).unwrap();
        with_file.mark_refreshed();
        without.mark_refreshed();
        assert!(!with_file.due() && !without.due());
        other_gateway_registers(&path, 1);
        assert!(with_file.due(), "the file's stat changed");
        assert!(!without.due(), "nothing tells a record without a file");
        std::thread::sleep(REFRESH + Duration::from_millis(10));
        assert!(without.due());
        // The cost of the per-command check (one stat, the interval not yet passed).
        with_file.mark_refreshed();
        let n = 10_000;
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(with_file.due());
        }
        let each = t.elapsed() / n;
        eprintln!("SharedPr::due with a file: {each:?} each");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(Record::decode(&[9]).unwrap_err().contains("layout 9"));
        assert!(Record::decode(&[1, 0, 0])
            .unwrap_err()
            .contains("cut short"));
        assert_eq!(Record::decode(&[]).unwrap(), Record::default());
    }

    #[test]
    fn the_log_keeps_the_newest() {
        let mut rec = Record::default();
        let n = Notice {
            port: Arc::from("x"),
            rtp: 1,
            all_tg_pt: false,
            code: (0x2A, 3),
        };
        rec.log_notices(vec![n; LOG_MAX + 5]);
        assert_eq!(rec.seq, LOG_MAX as u64 + 5);
        assert_eq!(rec.log.len(), LOG_MAX);
        assert_eq!(rec.log.front().unwrap().0, 6);
    }
}
