//! The SCSI device (`scsi::Device`) fed random CDBs with random data-out against a small
//! RAM LUN.
//!
//! Checked after every command:
//! - it returns a status; CHECK CONDITION always carries sense data with a valid response
//!   code, and never MEDIUM ERROR or HARDWARE ERROR (a RAM backend fails only for an access
//!   outside the LUN, so those would mean the engine tried to reach past the end);
//! - data-in never exceeds the expected length, and is empty unless the command may read;
//! - the LUN keeps its size, and its contents equal a shadow copy the harness keeps: a
//!   command that cannot write, or that was refused (ILLEGAL REQUEST, MISCOMPARE, DATA
//!   PROTECT, UNIT ATTENTION, NOT READY, RESERVATION CONFLICT), left every byte as it was;
//!   a successful WRITE(6/10/12/16) or WRITE AND VERIFY wrote exactly its data at its LBA
//!   and nothing else; a READ(10/16) returned the shadow's bytes. Other successful
//!   commands that may write (WRITE SAME, UNMAP, COMPARE AND WRITE, EXTENDED COPY, ...)
//!   re-take the shadow from the LUN.
//!
//! How the harness sees the medium: by default the LUN's image is memory the harness lends
//! the device ([`Image`], as an RDMA transport lends its registered memory), which records
//! every range the backend writes; the harness reads the medium there directly and checks,
//! after each command, only the ranges written (a byte never written cannot have changed),
//! so a command costs what it does, not a read of the whole LUN. With option bit 7 the LUN
//! lives on the backend's own heap chunks (as on an iSCSI/TCP target), and the harness
//! reads it back whole with READ CAPACITY(16) and READ(16) after every command (slower,
//! hence a smaller LUN).
//!
//! Input: an options byte (bit 0 4096-byte blocks, bit 1 thin provisioning, bit 2 read
//! only, bit 3 removable, bit 4 SANITIZE offered, bit 7 heap-backed LUN), then commands: a
//! flag byte (bit 0 R, bit 1 W, bits 2-4 task attribute, bit 5 LUN 1 (not configured), bit
//! 6 a second I_T nexus), the CDB length (mod 33) and bytes, the expected length (16 bits),
//! and the data-out as a record.

use std::cell::{RefCell, UnsafeCell};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use scsi::sense::key;
use scsi::{op, status, Command, Device, LunConfig, NexusId, TaskAttr};

use crate::Input;

/// Most commands one input runs.
const MAX_COMMANDS: usize = 32;
/// The largest LUN a harness builds (16 blocks of 4096 bytes, or 64 of 512).
const MAX_LUN_BYTES: usize = 64 * 1024;
/// The heap-backed LUN, read back whole after every command: 4 blocks of 4096 bytes, or 16
/// of 512.
const HEAP_LUN_BYTES: usize = 8 * 1024;

/// A RAM LUN's image lent to the device (`Device::with_image_memory`): the harness reads
/// the medium here directly, and learns every range the backend wrote.
struct Image {
    cells: Box<[UnsafeCell<u8>]>,
    /// Ranges written since [`Image::take_written`] last ran, in order.
    written: Mutex<Vec<Range<usize>>>,
}

// SAFETY: the backend writes the image only under a chunk's write lock and borrows bytes
// only under its read lock, so no borrow it makes sees a write; the harness borrows the
// whole image (`contents`) only between commands, when no task of the device runs (the
// runtime is current-thread: its tasks run only inside `block_on`).
unsafe impl Sync for Image {}

impl Image {
    fn new(len: usize) -> Arc<Image> {
        let zeros: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        // SAFETY: UnsafeCell<u8> is repr(transparent) over u8, so the slices have the same
        // layout (and allocation); zeroing through calloc costs nothing per byte here.
        let cells = unsafe { Box::from_raw(Box::into_raw(zeros) as *mut [UnsafeCell<u8>]) };
        Arc::new(Image {
            cells,
            written: Mutex::new(Vec::new()),
        })
    }

    /// The whole medium. Only between commands (see the `Sync` impl).
    fn contents(&self) -> &[u8] {
        // SAFETY: as in `bytes_at`; no command runs while the harness holds this borrow.
        unsafe { std::slice::from_raw_parts(self.cells.as_ptr() as *const u8, self.cells.len()) }
    }

    /// The ranges written since the last call.
    fn take_written(&self) -> Vec<Range<usize>> {
        std::mem::take(&mut *self.written.lock().unwrap())
    }
}

impl storage::ImageMemory for Image {
    fn len(&self) -> usize {
        self.cells.len()
    }
    fn write_at(&self, offset: usize, data: &[u8]) {
        let to = self.cells[offset..offset + data.len()].as_ptr() as *mut u8;
        // SAFETY: in range (sliced above); UnsafeCell<u8> has u8's layout, so the cells are
        // `data.len()` contiguous bytes; the backend's chunk lock excludes readers.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
        self.written
            .lock()
            .unwrap()
            .push(offset..offset + data.len());
    }
    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        let cells = &self.cells[offset..offset + len];
        // SAFETY: as in write_at; no write happens while the backend lends this borrow.
        unsafe { std::slice::from_raw_parts(cells.as_ptr() as *const u8, len) }
    }
    /// Plain memory: no transport sends from it.
    fn registration(&self) -> Option<storage::Registration> {
        None
    }
}

/// The LUN's contents, and the ranges that may have changed since they were last read.
type Observed<'a> = (std::borrow::Cow<'a, [u8]>, Vec<Range<usize>>);

/// Where the LUN's contents are read after each command.
enum Medium {
    /// Lent memory: read directly, only the ranges written.
    Image(Arc<Image>),
    /// The backend's heap: read whole with READ CAPACITY(16) and READ(16).
    Heap,
}

impl Medium {
    /// The LUN's contents now, and the ranges that may have changed since the last call
    /// (`None`: the harness could not read the LUN).
    fn now(&self, dev: &Device, size: u64) -> Option<Observed<'_>> {
        match self {
            Medium::Image(img) => {
                let written = img.take_written();
                Some((std::borrow::Cow::Borrowed(img.contents()), written))
            }
            Medium::Heap => {
                let (now_bs, data) = read_lun(dev)?;
                assert_eq!(
                    data.len() as u64,
                    size,
                    "the LUN changed size (block size {now_bs})"
                );
                // All of it may have changed.
                let whole = std::iter::once(0..data.len()).collect();
                Some((std::borrow::Cow::Owned(data), whole))
            }
        }
    }
}

/// The first byte of `ranges` where `now` and `expect` differ.
fn first_difference(ranges: &[Range<usize>], now: &[u8], expect: &[u8]) -> Option<usize> {
    ranges.iter().find_map(|r| {
        let (a, b) = (&now[r.clone()], &expect[r.clone()]);
        if a == b {
            return None;
        }
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .map(|i| r.start + i)
    })
}

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a tokio runtime")
        });
        rt.block_on(f)
    })
}

fn command(nexus: u64, lun: u64, cdb: &[u8], len: u32, read: bool, data: Bytes) -> Command {
    Command {
        nexus: NexusId(nexus),
        lun,
        cdb: Bytes::copy_from_slice(cdb),
        attr: TaskAttr::Simple,
        tag: 0,
        expected_len: len,
        read,
        write: !data.is_empty(),
        data_out: data,
        read_buffers: None,
        bidi_read_len: None,
    }
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::READ_16;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = read16(lba, blocks);
    c[0] = op::WRITE_16;
    c
}

/// Runs a command of our own on nexus 1, retrying past unit attentions.
fn run_own(dev: &Device, cdb: &[u8], len: u32, read: bool, data: Bytes) -> Option<Bytes> {
    for _ in 0..4 {
        let r = block_on(dev.execute(command(1, 0, cdb, len, read, data.clone())));
        if r.status == status::GOOD {
            return Some(r.data_in);
        }
        if sense_key(r.sense.as_deref()) != Some(key::UNIT_ATTENTION) {
            return None;
        }
    }
    None
}

/// The whole LUN as READ CAPACITY(16) and READ(16) see it: (block size, contents).
fn read_lun(dev: &Device) -> Option<(u32, Vec<u8>)> {
    let mut cap = [0u8; 16];
    cap[0] = op::SERVICE_ACTION_IN_16;
    cap[1] = op::SA_READ_CAPACITY_16;
    cap[13] = 32;
    let c = run_own(dev, &cap, 32, true, Bytes::new())?;
    if c.len() < 12 {
        return None;
    }
    let last = u64::from_be_bytes(c[0..8].try_into().unwrap());
    let bs = u32::from_be_bytes(c[8..12].try_into().unwrap());
    let blocks = last + 1;
    let len = blocks.checked_mul(u64::from(bs))?;
    if len > 1 << 20 {
        panic!("READ CAPACITY reports {len} bytes");
    }
    let data = run_own(
        dev,
        &read16(0, blocks as u32),
        len as u32,
        true,
        Bytes::new(),
    )?;
    Some((bs, data.to_vec()))
}

/// The sense key of fixed or descriptor sense data.
fn sense_key(sense: Option<&[u8]>) -> Option<u8> {
    let s = sense?;
    match s.first()? & 0x7f {
        0x70 | 0x71 => Some(s.get(2)? & 0x0f),
        0x72 | 0x73 => Some(s.get(1)? & 0x0f),
        _ => None,
    }
}

/// Commands that never change the medium, whatever their outcome.
fn never_writes(opcode: u8) -> bool {
    matches!(
        opcode,
        op::TEST_UNIT_READY
            | op::REQUEST_SENSE
            | op::READ_6
            | op::READ_10
            | op::READ_12
            | op::READ_16
            | op::INQUIRY
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::READ_CAPACITY_10
            | op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::PRE_FETCH_10
            | op::PRE_FETCH_16
            | op::SYNC_CACHE_10
            | op::SYNC_CACHE_16
            | op::READ_DEFECT_10
            | op::READ_DEFECT_12
            | op::REPORT_LUNS
            | op::SERVICE_ACTION_IN_16
            | op::MAINTENANCE_IN
            | op::PR_IN
            | op::PR_OUT
            | op::RECEIVE_COPY_RESULTS
            | op::RESERVE_6
            | op::RELEASE_6
            | op::PREVENT_ALLOW
            | op::START_STOP_UNIT
    )
}

/// The big-endian field at `r` of `cdb`, if the CDB is that long. Decoded here, apart from
/// the SCSI engine's own parser, so the harness checks the engine against a second reading.
fn be_field(cdb: &[u8], r: std::ops::Range<usize>) -> Option<u64> {
    Some(
        cdb.get(r)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)),
    )
}

/// (LBA, blocks) of a plain write or write-and-verify CDB.
fn write_range(cdb: &[u8]) -> Option<(u64, u64)> {
    let be = |r| be_field(cdb, r);
    match *cdb.first()? {
        op::WRITE_6 => {
            let lba = be(1..4)? & 0x1f_ffff;
            let n = be(4..5)?;
            Some((lba, if n == 0 { 256 } else { n }))
        }
        op::WRITE_10 | op::WRITE_VERIFY_10 => Some((be(2..6)?, be(7..9)?)),
        op::WRITE_12 | op::WRITE_VERIFY_12 => Some((be(2..6)?, be(6..10)?)),
        op::WRITE_16 | op::WRITE_VERIFY_16 => Some((be(2..10)?, be(10..14)?)),
        _ => None,
    }
}

/// (LBA, blocks) of a READ(10) or READ(16) CDB.
fn read_range(cdb: &[u8]) -> Option<(u64, u64)> {
    let be = |r| be_field(cdb, r);
    match *cdb.first()? {
        op::READ_10 => Some((be(2..6)?, be(7..9)?)),
        op::READ_16 => Some((be(2..10)?, be(10..14)?)),
        _ => None,
    }
}

pub fn scsi(data: &[u8]) {
    let mut inp = Input::new(data);
    let o = inp.u8();
    let heap = o & 0x80 != 0;
    let lun_bytes = if heap { HEAP_LUN_BYTES } else { MAX_LUN_BYTES };
    let bs: u32 = if o & 1 != 0 { 4096 } else { 512 };
    let blocks = (lun_bytes / bs as usize) as u64;
    let size = u64::from(bs) * blocks;
    let mut cfg = LunConfig::memory(size);
    cfg.block_size = bs;
    cfg.thin_provisioning = o & 2 != 0;
    cfg.removable = o & 8 != 0;
    cfg.sanitize = o & 16 != 0;
    let read_only = o & 4 != 0;
    cfg.read_only = read_only;
    let medium = if heap {
        Medium::Heap
    } else {
        Medium::Image(Image::new(size as usize))
    };
    let lent = match &medium {
        Medium::Image(img) => Some(img.clone()),
        Medium::Heap => None,
    };
    let lend = move |_lun: u64, len: u64| {
        lent.clone()
            .filter(|_| len == size)
            .map(|img| img as Arc<dyn storage::ImageMemory>)
    };
    let dev = Device::with_image_memory(
        "iqn.2026-11.org.ironsan:fuzz",
        vec![(0, cfg)],
        Arc::new(lend),
    )
    .expect("device");
    dev.nexus_added(
        NexusId(1),
        "iqn.2026-11.org.ironsan:fuzzer,i,0x800000000001",
        Bytes::new(),
    );
    dev.nexus_added(
        NexusId(2),
        "iqn.2026-11.org.ironsan:other,i,0x800000000002",
        Bytes::new(),
    );
    // A pattern, so that a stray write of zeros shows too (made once: an instrumented loop
    // over every byte would cost more than the commands).
    static PATTERN: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    let pattern = PATTERN
        .get_or_init(|| {
            (0..MAX_LUN_BYTES)
                .map(|i| (i * 7 + (i >> 9)) as u8)
                .collect()
        })
        .slice(..size as usize);
    if !read_only {
        run_own(
            &dev,
            &write16(0, blocks as u32),
            size as u32,
            false,
            pattern.clone(),
        )
        .expect("the pattern is written");
    }
    // The shadow: what the LUN holds (None: the heap-backed LUN could not be read back).
    let mut shadow: Option<Vec<u8>> = medium.now(&dev, size).map(|(d, _)| d.into_owned());
    if let Some(s) = &shadow {
        if read_only {
            assert!(s.iter().all(|&b| b == 0), "a fresh LUN reads as zeros");
        } else {
            assert_eq!(&s[..], &pattern[..], "pattern read back");
        }
    }

    for _ in 0..MAX_COMMANDS {
        if inp.is_empty() {
            break;
        }
        let flags = inp.u8();
        let n = inp.u8() as usize % 33;
        let cdb = inp.bytes(n).to_vec();
        let expected = u32::from(inp.u16());
        let mut out = inp.record();
        if flags & 2 == 0 {
            out = &[];
        }
        let out = &out[..out.len().min(expected as usize)];
        let read = flags & 1 != 0;
        let attr = match (flags >> 2) & 7 {
            0 => TaskAttr::Simple,
            1 => TaskAttr::Ordered,
            2 => TaskAttr::HeadOfQueue,
            3 => TaskAttr::Aca,
            _ => TaskAttr::Untagged,
        };
        let lun = u64::from(flags & 0x20 != 0);
        let nexus = 1 + u64::from(flags & 0x40 != 0);
        let mut cmd = command(
            nexus,
            lun,
            &cdb,
            expected,
            read,
            Bytes::copy_from_slice(out),
        );
        cmd.attr = attr;
        let rsp = block_on(dev.execute(cmd));

        assert!(!rsp.aborted, "a command aborted with no task management");
        assert!(
            rsp.data_in.len() <= expected as usize,
            "data-in of {} bytes over the expected {expected}",
            rsp.data_in.len()
        );
        if !read {
            assert!(rsp.data_in.is_empty(), "data-in without the R bit");
        }
        let sk = sense_key(rsp.sense.as_deref());
        match rsp.status {
            status::CHECK_CONDITION => {
                let sk = sk.unwrap_or_else(|| {
                    panic!("CHECK CONDITION without valid sense: {:02x?}", rsp.sense)
                });
                assert!(
                    sk != key::MEDIUM_ERROR && sk != key::HARDWARE_ERROR,
                    "sense key {sk:#x} from a RAM LUN for CDB {cdb:02x?}: {:02x?}",
                    rsp.sense
                );
            }
            status::GOOD
            | status::CONDITION_MET
            | status::RESERVATION_CONFLICT
            | status::BUSY
            | status::TASK_SET_FULL => {}
            s => panic!("status {s:#x} for CDB {cdb:02x?}"),
        }
        if let Some((now_blocks, now_bs)) = dev.capacity(0) {
            assert_eq!(
                now_blocks.checked_mul(u64::from(now_bs)),
                Some(size),
                "the LUN changed size ({now_blocks} blocks of {now_bs} bytes)"
            );
        }

        // A plain read returned the medium's bytes.
        if let (Some(s), status::GOOD, Some((lba, n))) = (&shadow, rsp.status, read_range(&cdb)) {
            let start = lba.saturating_mul(u64::from(bs)) as usize;
            let len = (n * u64::from(bs)) as usize;
            if read && lun == 0 && rsp.data_in.len() == len && start.saturating_add(len) <= s.len()
            {
                assert_eq!(&rsp.data_in[..], &s[start..start + len], "READ data");
            }
        }

        // What the LUN should hold now: the shadow, but for what a successful plain write
        // names; unknown after any other command that may write.
        let opcode = cdb.first().copied().unwrap_or(0);
        let refused = rsp.status == status::RESERVATION_CONFLICT
            || matches!(
                sk,
                Some(
                    key::ILLEGAL_REQUEST
                        | key::MISCOMPARE
                        | key::DATA_PROTECT
                        | key::UNIT_ATTENTION
                        | key::NOT_READY
                )
            );
        let unchanged = never_writes(opcode) || refused || lun != 0;
        let written: Option<Range<usize>> = match rsp.status {
            status::GOOD if !unchanged => write_range(&cdb).and_then(|(lba, n)| {
                let start = lba.checked_mul(u64::from(bs))? as usize;
                let len = n.checked_mul(u64::from(bs))? as usize;
                // Known only when the initiator sent all the data the CDB names.
                if len > out.len() || start.checked_add(len)? > size as usize {
                    return None;
                }
                Some(start..start + len)
            }),
            _ => None,
        };
        let Some((now, changed)) = medium.now(&dev, size) else {
            shadow = None;
            continue;
        };
        let Some(s) = &mut shadow else {
            shadow = Some(now.into_owned());
            continue;
        };
        let stray = |r: &[Range<usize>], expect: &[u8]| {
            if let Some(at) = first_difference(r, &now, expect) {
                panic!(
                    "CDB {cdb:02x?} (status {:#x}, sense key {sk:?}) changed the LUN at byte {at}",
                    rsp.status
                );
            }
        };
        if unchanged {
            stray(&changed, s);
        } else if let Some(w) = &written {
            // Its data at its LBA, and nothing else.
            if now[w.clone()] != out[..w.len()] {
                let at = now[w.clone()]
                    .iter()
                    .zip(out)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                panic!(
                    "CDB {cdb:02x?} (status GOOD) wrote other data than its own at byte {}",
                    w.start + at
                );
            }
            let outside: Vec<Range<usize>> = changed
                .iter()
                .flat_map(|r| {
                    [
                        r.start..r.end.min(w.start).max(r.start),
                        r.start.max(w.end).min(r.end)..r.end,
                    ]
                })
                .filter(|r| !r.is_empty())
                .collect();
            stray(&outside, s);
        }
        for r in changed {
            s[r.clone()].copy_from_slice(&now[r]);
        }
    }
}
