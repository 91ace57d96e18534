//! Byte-addressed I/O on a remote LUN.
//!
//! [`Lun`] is one logical unit of an [`iscsi_initiator::Session`] as a device read and
//! written at any byte offset and length, shared by `ironsan nbd` (crates/nbd) and `ironsan
//! mount` (the FUSE file system of crates/ironsan). Requests are cut into SCSI commands of
//! at most the LUN's transfer limit, all submitted before the first is awaited (the session
//! keeps as many in flight as its CmdSN window allows); ranges that do not start and end on
//! a logical block boundary read the partial blocks, patch them and write whole blocks back,
//! under a range lock so that two such writers into one block never lose each other's
//! bytes. [`Lun::flush`] is SYNCHRONIZE CACHE, [`Lun::trim`] UNMAP (when the LUN is thin),
//! [`Lun::write_zeroes`] WRITE SAME(16) (written zeros when the target refuses it), and a
//! write's `fua` the FUA bit. Writes return only after the target's GOOD status for every
//! command; a failure is an [`IoError`] carrying the errno to report.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use iscsi_initiator::scsi::{self, status, Sense};
use iscsi_initiator::{CommandRequest, CommandResult, PendingCommand, Session};
use tokio::sync::Notify;

/// Largest READ/WRITE sent as one SCSI command (smaller when the LUN's Block Limits page
/// says so).
pub const MAX_COMMAND_BYTES: u32 = 4 << 20;
/// WRITE SAME blocks per command when the LUN reports no limit.
const DEFAULT_WRITE_SAME_BLOCKS: u64 = 1 << 16;

/// The errors an I/O ends with. The numbers are Linux's, which NBD's error field uses too.
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
}

/// Why an I/O failed, as the errno to answer with and a line for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoError {
    pub errno: u32,
    pub message: String,
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IoError {
    fn eio(message: String) -> IoError {
        IoError {
            errno: errno::EIO,
            message,
        }
    }
}

/// What the device needs to know about the logical unit, read once at start.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub block_size: u32,
    pub blocks: u64,
    /// Logical block provisioning (UNMAP) enabled.
    pub thin: bool,
    /// The medium is write-protected (MODE SENSE WP).
    pub write_protected: bool,
    /// Bytes per READ/WRITE command.
    pub max_command_bytes: u32,
    pub max_unmap_blocks: u32,
    pub max_unmap_descriptors: u32,
    pub max_write_same_blocks: u64,
}

/// One logical unit of a logged-in session, as a byte-addressed device.
pub struct Lun {
    session: Arc<Session>,
    lun: u16,
    geo: Geometry,
    unmap_ok: AtomicBool,
    write_same_ok: AtomicBool,
    locks: RangeLocks,
}

impl Lun {
    /// Reads the LUN's capacity, write protection and limits (TEST UNIT READY, READ
    /// CAPACITY, MODE SENSE, the Block Limits VPD page where there is one).
    pub async fn open(session: Arc<Session>, lun: u16) -> Result<Lun, iscsi_initiator::Error> {
        session.test_unit_ready(lun).await?;
        let cap = session.capacity(lun).await?;
        if cap.block_size == 0 || cap.block_size > (1 << 20) {
            return Err(iscsi_initiator::Error::Protocol(format!(
                "the LUN reports a block size of {} bytes",
                cap.block_size
            )));
        }
        let bs = cap.block_size;
        let mut geo = Geometry {
            block_size: bs,
            blocks: cap.blocks,
            thin: cap.thin,
            write_protected: false,
            max_command_bytes: MAX_COMMAND_BYTES.max(bs) / bs * bs,
            max_unmap_blocks: 1 << 16,
            max_unmap_descriptors: 1,
            max_write_same_blocks: DEFAULT_WRITE_SAME_BLOCKS,
        };
        // MODE SENSE(6), no block descriptors, all pages: the WP bit of the header.
        let ms = [0x1a, 0x08, 0x3f, 0, 252, 0];
        if let Ok(r) = session.raw(lun, &ms, 252, Bytes::new()).await {
            if r.status == status::GOOD && r.data.len() >= 4 {
                geo.write_protected = r.data[2] & 0x80 != 0;
            }
        }
        let has_b0 = session
            .inquiry_vpd(lun, 0)
            .await
            .map(|p| scsi::parse_vpd_page_list(&p).contains(&0xb0))
            .unwrap_or(false);
        if has_b0 {
            if let Ok(p) = session.inquiry_vpd(lun, 0xb0).await {
                apply_block_limits(&mut geo, &p);
            }
        }
        Ok(Lun {
            session,
            lun,
            geo,
            unmap_ok: AtomicBool::new(cap.thin),
            write_same_ok: AtomicBool::new(true),
            locks: RangeLocks::default(),
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Bytes.
    pub fn size(&self) -> u64 {
        self.geo.blocks * self.geo.block_size as u64
    }

    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    fn bs(&self) -> u64 {
        self.geo.block_size as u64
    }

    /// `length` bytes at `offset` (the caller checked the range).
    pub async fn read(&self, offset: u64, length: u32) -> Result<Bytes, IoError> {
        if length == 0 {
            return Ok(Bytes::new());
        }
        let bs = self.bs();
        let end = offset + length as u64;
        let first = offset / bs;
        let last = end.div_ceil(bs);
        let data = self.read_blocks(first, last - first).await?;
        let skip = (offset - first * bs) as usize;
        Ok(data.slice(skip..skip + length as usize))
    }

    /// Writes `data` at `offset`; answered after the target's GOOD status for every
    /// command. `fua`: each command with Force Unit Access.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), IoError> {
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.bs();
        let end = offset + data.len() as u64;
        let first = offset / bs;
        let last = end.div_ceil(bs);
        let head = offset % bs;
        let tail = end % bs;
        if head == 0 && tail == 0 {
            let _shared = self.locks.lock(first, last, false).await;
            return self.write_blocks(first, data, fua).await;
        }
        // Read-modify-write of the partial blocks, the whole range held exclusively so a
        // concurrent writer of the same blocks cannot slip between the read and the write.
        let _exclusive = self.locks.lock(first, last, true).await;
        let head_block = (head != 0).then_some(first);
        let tail_block = (tail != 0)
            .then_some(last - 1)
            .filter(|&b| Some(b) != head_block);
        let pending: Vec<(u64, PendingCommand)> = head_block
            .into_iter()
            .chain(tail_block)
            .map(|b| (b, self.submit_read(b, 1)))
            .collect();
        let mut old = Vec::with_capacity(2);
        for (b, p) in pending {
            let data = self.finish_read(p, b, 1).await?;
            old.push((b, data));
        }
        let block_of =
            |b: u64| -> &[u8] { &old.iter().find(|(n, _)| *n == b).expect("read above").1 };
        let mut buf = BytesMut::with_capacity(((last - first) * bs) as usize);
        if head != 0 {
            buf.extend_from_slice(&block_of(first)[..head as usize]);
        }
        buf.extend_from_slice(&data);
        if tail != 0 {
            buf.extend_from_slice(&block_of(last - 1)[tail as usize..]);
        }
        debug_assert_eq!(buf.len() as u64, (last - first) * bs);
        self.write_blocks(first, buf.freeze(), fua).await
    }

    /// SYNCHRONIZE CACHE of the whole LUN.
    pub async fn flush(&self) -> Result<(), IoError> {
        let req = CommandRequest::none(self.lun, scsi::synchronize_cache(0, 0));
        self.execute("SYNCHRONIZE CACHE", req, false)
            .await
            .map(|_| ())
    }

    /// UNMAP of the whole blocks inside the range, when the LUN is thin; otherwise (and
    /// for partial blocks) nothing: a trim is a hint.
    pub async fn trim(&self, offset: u64, length: u32, fua: bool) -> Result<(), IoError> {
        let bs = self.bs();
        let first = offset.div_ceil(bs);
        let last = (offset + length as u64) / bs;
        if first >= last || !self.unmap_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        let _shared = self.locks.lock(first, last, false).await;
        let per = self.geo.max_unmap_blocks.max(1) as u64;
        let mut extents = Vec::new();
        let mut at = first;
        while at < last {
            let n = per.min(last - at);
            extents.push((at, n as u32));
            at += n;
        }
        let per_cmd = self.geo.max_unmap_descriptors.clamp(1, 256) as usize;
        let pending: Vec<PendingCommand> = extents
            .chunks(per_cmd)
            .map(|ex| {
                let (cdb, list) = scsi::unmap(ex);
                self.session
                    .submit(CommandRequest::write(self.lun, cdb, Bytes::from(list)))
            })
            .collect();
        let mut result = Ok(());
        for p in pending {
            match p.wait().await {
                Ok(r) if r.status == status::GOOD => {}
                Ok(r) if sense_key(&r) == Some(5) => {
                    // ILLEGAL REQUEST: the LUN does not take UNMAP after all; trims become
                    // no-ops.
                    if self.unmap_ok.swap(false, Ordering::Relaxed) {
                        tracing::info!("{}: trims are ignored from now on", describe("UNMAP", &r));
                    }
                }
                Ok(r) => result = result.and(Err(scsi_error("UNMAP", &r, true))),
                Err(e) => result = result.and(Err(IoError::eio(format!("UNMAP: {e}")))),
            }
        }
        result?;
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Zeros over the range: WRITE SAME(16) of a zero block for whole blocks (written
    /// zeros when the target refuses it), read-modify-write for partial ones.
    pub async fn write_zeroes(&self, offset: u64, length: u32, fua: bool) -> Result<(), IoError> {
        if length == 0 {
            return Ok(());
        }
        let bs = self.bs();
        let end = offset + length as u64;
        let first = offset.div_ceil(bs);
        let last = end / bs;
        if first >= last {
            // Within one or two partial blocks.
            return self.write(offset, zeros(length as usize), fua).await;
        }
        if offset < first * bs {
            self.write(offset, zeros((first * bs - offset) as usize), fua)
                .await?;
        }
        if end > last * bs {
            self.write(last * bs, zeros((end - last * bs) as usize), fua)
                .await?;
        }
        let _shared = self.locks.lock(first, last, false).await;
        if self.write_same_ok.load(Ordering::Relaxed) {
            match self.write_same_zero(first, last).await {
                Ok(true) => {
                    if fua {
                        self.flush().await?;
                    }
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
        let chunk = zeros(self.geo.max_command_bytes as usize);
        let mut reqs = Vec::new();
        let mut at = first;
        let per = self.geo.max_command_bytes as u64 / bs;
        while at < last {
            let n = per.min(last - at);
            let cdb = scsi::read_write(true, at, n as u32, fua);
            reqs.push(CommandRequest::write(
                self.lun,
                cdb,
                chunk.slice(..(n * bs) as usize),
            ));
            at += n;
        }
        self.run_all(reqs, "WRITE (zeros)", true).await
    }

    /// WRITE SAME(16) of zeros over [first, last); `Ok(false)` when the target does not
    /// take WRITE SAME (then never tried again).
    async fn write_same_zero(&self, first: u64, last: u64) -> Result<bool, IoError> {
        let per = self.geo.max_write_same_blocks.clamp(1, u32::MAX as u64);
        let block = zeros(self.geo.block_size as usize);
        let mut pending = Vec::new();
        let mut at = first;
        while at < last {
            let n = per.min(last - at);
            let mut cdb = vec![0u8; 16];
            cdb[0] = 0x93;
            cdb[2..10].copy_from_slice(&at.to_be_bytes());
            cdb[10..14].copy_from_slice(&(n as u32).to_be_bytes());
            pending.push(
                self.session
                    .submit(CommandRequest::write(self.lun, cdb, block.clone())),
            );
            at += n;
        }
        let mut result = Ok(true);
        for p in pending {
            match p.wait().await {
                Ok(r) if r.status == status::GOOD => {}
                Ok(r) if sense_key(&r) == Some(5) => {
                    if self.write_same_ok.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            "{}: zeros are written instead",
                            describe("WRITE SAME(16)", &r)
                        );
                    }
                    if result.is_ok() {
                        result = Ok(false);
                    }
                }
                Ok(r) => result = Err(scsi_error("WRITE SAME(16)", &r, true)),
                Err(e) => result = Err(IoError::eio(format!("WRITE SAME(16): {e}"))),
            }
        }
        result
    }

    fn submit_read(&self, lba: u64, blocks: u64) -> PendingCommand {
        let cdb = scsi::read_write(false, lba, blocks as u32, false);
        let len = (blocks * self.bs()) as u32;
        self.session
            .submit(CommandRequest::read(self.lun, cdb, len))
    }

    async fn finish_read(
        &self,
        p: PendingCommand,
        lba: u64,
        blocks: u64,
    ) -> Result<Bytes, IoError> {
        let len = (blocks * self.bs()) as usize;
        let mut r = p
            .wait()
            .await
            .map_err(|e| IoError::eio(format!("READ at LBA {lba}: {e}")))?;
        if r.is_unit_attention() {
            let cdb = scsi::read_write(false, lba, blocks as u32, false);
            r = self
                .execute(
                    "READ",
                    CommandRequest::read(self.lun, cdb, len as u32),
                    false,
                )
                .await?;
        }
        if r.status != status::GOOD {
            return Err(scsi_error("READ", &r, false));
        }
        if r.data.len() != len {
            return Err(IoError::eio(format!(
                "READ at LBA {lba} returned {} of {len} bytes",
                r.data.len()
            )));
        }
        Ok(r.data)
    }

    /// `blocks` blocks from `lba`, as several commands in flight when they are many.
    async fn read_blocks(&self, lba: u64, blocks: u64) -> Result<Bytes, IoError> {
        let per = (self.geo.max_command_bytes as u64 / self.bs()).max(1);
        if blocks <= per {
            let p = self.submit_read(lba, blocks);
            return self.finish_read(p, lba, blocks).await;
        }
        let mut pending = Vec::new();
        let mut at = lba;
        while at < lba + blocks {
            let n = per.min(lba + blocks - at);
            pending.push((at, n, self.submit_read(at, n)));
            at += n;
        }
        let mut out = BytesMut::with_capacity((blocks * self.bs()) as usize);
        let mut result = Ok(());
        for (at, n, p) in pending {
            match self.finish_read(p, at, n).await {
                Ok(d) => out.extend_from_slice(&d),
                Err(e) => result = result.and(Err(e)),
            }
        }
        result.map(|_| out.freeze())
    }

    /// Whole blocks from `lba`, cut into commands that are all in flight at once.
    async fn write_blocks(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), IoError> {
        let bs = self.bs() as usize;
        let per = (self.geo.max_command_bytes as usize / bs).max(1) * bs;
        let mut reqs = Vec::new();
        let mut at = 0usize;
        while at < data.len() {
            let n = per.min(data.len() - at);
            let cdb = scsi::read_write(true, lba + (at / bs) as u64, (n / bs) as u32, fua);
            reqs.push(CommandRequest::write(self.lun, cdb, data.slice(at..at + n)));
            at += n;
        }
        self.run_all(reqs, "WRITE", true).await
    }

    /// Submits every request (all in flight at once) and waits for all of them (none is
    /// left running when this returns), executing again one that got UNIT ATTENTION; the
    /// first failure is the result.
    async fn run_all(
        &self,
        reqs: Vec<CommandRequest>,
        what: &str,
        write: bool,
    ) -> Result<(), IoError> {
        let pending: Vec<(CommandRequest, PendingCommand)> = reqs
            .into_iter()
            .map(|r| (r.clone(), self.session.submit(r)))
            .collect();
        let mut result = Ok(());
        for (req, p) in pending {
            let r = match p.wait().await {
                Ok(r) if r.is_unit_attention() => self.execute(what, req, write).await.map(|_| ()),
                Ok(r) if r.status == status::GOOD => Ok(()),
                Ok(r) => Err(scsi_error(what, &r, write)),
                Err(e) => Err(IoError::eio(format!("{what}: {e}"))),
            };
            result = result.and(r);
        }
        result
    }

    /// One command, sent again while it gets UNIT ATTENTION.
    async fn execute(
        &self,
        what: &str,
        req: CommandRequest,
        write: bool,
    ) -> Result<CommandResult, IoError> {
        let r = self
            .session
            .execute_past_unit_attentions(req)
            .await
            .map_err(|e| IoError::eio(format!("{what}: {e}")))?;
        if r.status != status::GOOD {
            return Err(scsi_error(what, &r, write));
        }
        Ok(r)
    }
}

/// Reads the limits of the Block Limits VPD page (SBC-3 6.6.4) into `geo`; zero fields
/// mean "not reported" and leave the defaults.
fn apply_block_limits(geo: &mut Geometry, p: &[u8]) {
    let be32 = |at: usize| -> u32 {
        p.get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4")))
            .unwrap_or(0)
    };
    let bs = geo.block_size as u64;
    let max_transfer = be32(8) as u64 * bs;
    if max_transfer != 0 {
        geo.max_command_bytes =
            (max_transfer.min(MAX_COMMAND_BYTES as u64) / bs * bs).max(bs) as u32;
    }
    if be32(20) != 0 {
        geo.max_unmap_blocks = be32(20).min(1 << 22);
    }
    if be32(24) != 0 {
        geo.max_unmap_descriptors = be32(24);
    }
    if let Some(b) = p.get(36..44) {
        let v = u64::from_be_bytes(b.try_into().expect("8"));
        if v != 0 {
            geo.max_write_same_blocks = v;
        }
    }
}

fn zeros(n: usize) -> Bytes {
    Bytes::from(vec![0u8; n])
}

fn sense_key(r: &CommandResult) -> Option<u8> {
    (r.status == status::CHECK_CONDITION)
        .then(|| Sense::parse(&r.sense).map(|s| s.key))
        .flatten()
}

/// A result other than GOOD in the initiator's own words ("WHAT failed: status, sense").
fn describe(what: &str, r: &CommandResult) -> String {
    iscsi_initiator::Error::Scsi {
        what: what.to_string(),
        status: r.status,
        sense: Sense::parse(&r.sense),
    }
    .to_string()
}

/// The errno for a SCSI status other than GOOD: DATA PROTECT is EPERM, an LBA out of
/// range ENOSPC for writes and EINVAL for reads, anything else EIO.
fn scsi_error(what: &str, r: &CommandResult, write: bool) -> IoError {
    let errno = match Sense::parse(&r.sense) {
        Some(s) if r.status == status::CHECK_CONDITION && s.key == 7 => errno::EPERM,
        Some(s) if r.status == status::CHECK_CONDITION && s.key == 5 && s.asc == 0x21 => {
            if write {
                errno::ENOSPC
            } else {
                errno::EINVAL
            }
        }
        _ => errno::EIO,
    };
    IoError {
        errno,
        message: describe(what, r),
    }
}

/// Locks on ranges of blocks: shared holders (whole-block writes) overlap each other;
/// an exclusive holder (a read-modify-write) overlaps no one.
#[derive(Default)]
struct RangeLocks {
    held: Mutex<Vec<Held>>,
    released: Notify,
    next: AtomicU64,
}

struct Held {
    id: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    id: u64,
}

impl RangeLocks {
    async fn lock(&self, start: u64, end: u64, exclusive: bool) -> RangeGuard<'_> {
        loop {
            // Registered before looking, so a release in between still wakes us.
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                let conflict = held
                    .iter()
                    .any(|h| h.start < end && start < h.end && (exclusive || h.exclusive));
                if !conflict {
                    let id = self.next.fetch_add(1, Ordering::Relaxed);
                    held.push(Held {
                        id,
                        start,
                        end,
                        exclusive,
                    });
                    return RangeGuard { locks: self, id };
                }
            }
            notified.await;
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|h| h.id != self.id);
        drop(held);
        self.locks.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn range_locks() {
        let locks = Arc::new(RangeLocks::default());
        let a = locks.lock(0, 10, false).await;
        // Shared holders overlap.
        let b = locks.lock(5, 15, false).await;
        // An exclusive one waits for both; a disjoint one does not.
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock(9, 10, true).await;
        });
        let _c = locks.lock(20, 30, true).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the exclusive lock is granted once the range is free")
            .unwrap();
    }

    #[test]
    fn block_limits_page() {
        let mut geo = Geometry {
            block_size: 512,
            blocks: 1000,
            thin: true,
            write_protected: false,
            max_command_bytes: MAX_COMMAND_BYTES,
            max_unmap_blocks: 1,
            max_unmap_descriptors: 1,
            max_write_same_blocks: 1,
        };
        let mut p = vec![0u8; 64];
        p[8..12].copy_from_slice(&128u32.to_be_bytes());
        p[20..24].copy_from_slice(&4096u32.to_be_bytes());
        p[24..28].copy_from_slice(&16u32.to_be_bytes());
        p[36..44].copy_from_slice(&65536u64.to_be_bytes());
        apply_block_limits(&mut geo, &p);
        assert_eq!(geo.max_command_bytes, 128 * 512);
        assert_eq!(geo.max_unmap_blocks, 4096);
        assert_eq!(geo.max_unmap_descriptors, 16);
        assert_eq!(geo.max_write_same_blocks, 65536);
        // A short page changes nothing it does not carry.
        apply_block_limits(&mut geo, &p[..12]);
        assert_eq!(geo.max_unmap_blocks, 4096);
    }
}
