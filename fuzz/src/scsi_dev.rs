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
//! Input: an options byte (bit 0 4096-byte blocks, bit 1 thin provisioning, bit 2 read
//! only, bit 3 removable, bit 4 SANITIZE offered), then commands: a flag byte (bit 0 R,
//! bit 1 W, bits 2-4 task attribute, bit 5 LUN 1 (not configured), bit 6 a second I_T
//! nexus), the CDB length (mod 33) and bytes, the expected length (16 bits), and the
//! data-out as a record.

use std::cell::RefCell;

use bytes::Bytes;
use scsi::sense::key;
use scsi::{op, status, Command, Device, LunConfig, NexusId, TaskAttr};

use crate::Input;

/// Most commands one input runs.
const MAX_COMMANDS: usize = 32;
/// The largest LUN a harness builds (16 blocks of 4096 bytes, or 64 of 512).
const MAX_LUN_BYTES: usize = 64 * 1024;

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
    let (bs, blocks) = if o & 1 != 0 {
        (4096u32, 16u64)
    } else {
        (512, 64)
    };
    let size = u64::from(bs) * blocks;
    let mut cfg = LunConfig::memory(size);
    cfg.block_size = bs;
    cfg.thin_provisioning = o & 2 != 0;
    cfg.removable = o & 8 != 0;
    cfg.sanitize = o & 16 != 0;
    let read_only = o & 4 != 0;
    cfg.read_only = read_only;
    let dev = Device::new("iqn.2026-11.org.ironsan:fuzz", vec![(0, cfg)]).expect("device");
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
    let mut shadow: Option<Vec<u8>> = read_lun(&dev).map(|(_, d)| d);
    if !read_only {
        assert_eq!(shadow.as_deref(), Some(&pattern[..]), "pattern read back");
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

        // What the LUN should hold now.
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
        let now = read_lun(&dev);
        if let Some((now_bs, ref now_data)) = now {
            assert_eq!(
                now_data.len() as u64,
                size,
                "the LUN changed size (block size {now_bs})"
            );
        }
        let now = now.map(|(_, d)| d);
        let expect: Option<Vec<u8>> = match (&shadow, rsp.status) {
            (Some(s), _) if unchanged => Some(s.clone()),
            (Some(s), status::GOOD) => write_range(&cdb).and_then(|(lba, n)| {
                let start = lba.checked_mul(u64::from(bs))? as usize;
                let len = n.checked_mul(u64::from(bs))? as usize;
                // Known only when the initiator sent all the data the CDB names.
                if len > out.len() || start.checked_add(len)? > s.len() {
                    return None;
                }
                let mut s = s.clone();
                s[start..start + len].copy_from_slice(&out[..len]);
                Some(s)
            }),
            _ => None,
        };
        if let (Some(e), Some(n)) = (&expect, &now) {
            if e != n {
                let at = e.iter().zip(n).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "CDB {cdb:02x?} (status {:#x}, sense key {sk:?}) changed the LUN at byte {at}",
                    rsp.status
                );
            }
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
        shadow = now;
    }
}
