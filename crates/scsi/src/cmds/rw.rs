//! The medium-access commands: READ/WRITE/VERIFY/WRITE AND VERIFY (6/10/12/16),
//! ORWRITE, COMPARE AND WRITE, WRITE SAME, UNMAP, GET LBA STATUS, PRE-FETCH,
//! SYNCHRONIZE CACHE.

use bytes::{Bytes, BytesMut};

use crate::cdb::{be16, be32, be64, block_range, byte, op};
use crate::command::Command;
use crate::lun::Lun;
use crate::outcome::{CmdResult, Done, Fail};
use crate::sense::{asc, key, Sense};
use crate::tasks::{RangeGuard, TaskGuard};

/// Largest transfer (bytes) of one READ/WRITE; reported in the Block Limits VPD. 32 MiB
/// is 65536 blocks of 512 bytes: initiators (libiscsi's WRITE SAME tests among them)
/// move 65536 blocks in one command to exercise 4-byte transfer lengths.
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// Largest COMPARE AND WRITE (blocks).
pub(crate) const MAX_CAW_BLOCKS: u8 = 128;
/// Largest WRITE SAME (blocks), UNMAP LBA count and UNMAP descriptor count.
pub(crate) const MAX_WRITE_SAME_BLOCKS: u64 = 1 << 22;
pub(crate) const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
pub(crate) const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// LBA, length and flags of a block command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwParams {
    pub lba: u64,
    pub blocks: u32,
    /// CDB byte 1 (xPROTECT, DPO, FUA, BYTCHK, ...); 0 for the 6-byte forms.
    pub flags: u8,
}

impl RwParams {
    /// Decodes the LBA/length fields of the 6/10/12/16-byte block command layouts.
    pub fn parse(cdb: &[u8]) -> RwParams {
        let (lba, blocks) = block_range(cdb);
        // The 6-byte forms have no flags byte: byte 1 holds the LBA's top bits.
        let flags = if byte(cdb, 0) >> 5 == 0 {
            0
        } else {
            byte(cdb, 1)
        };
        RwParams { lba, blocks, flags }
    }

    pub fn fua(&self) -> bool {
        self.flags & 0x08 != 0
    }
}

impl Lun {
    /// Rejects a non-zero RDPROTECT/WRPROTECT/VRPROTECT (no protection information).
    fn check_protect(&self, cdb: &[u8]) -> Result<(), Fail> {
        if cdb[0] >> 5 != 0 && cdb[1] & 0xE0 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(7)).into());
        }
        Ok(())
    }

    /// LBA range check: LOGICAL BLOCK ADDRESS OUT OF RANGE unless lba+blocks fits.
    pub(crate) fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Fail> {
        let n = self.num_blocks();
        match lba.checked_add(blocks) {
            Some(end) if end <= n && lba <= n => Ok(()),
            _ => Err(Sense::illegal(asc::LBA_OUT_OF_RANGE).into()),
        }
    }

    fn check_transfer_len(&self, blocks: u32, len_field: u16) -> Result<(), Fail> {
        if (blocks as u64) << self.bs_shift > MAX_TRANSFER_BYTES {
            return Err(Sense::invalid_cdb_field(len_field, None).into());
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), Fail> {
        if self.write_protected() {
            let code = if self.read_only() {
                asc::WRITE_PROTECTED
            } else {
                asc::SOFTWARE_WRITE_PROTECTED
            };
            return Err(Sense::new(key::DATA_PROTECT, code).into());
        }
        Ok(())
    }

    fn offset(&self, lba: u64) -> u64 {
        lba << self.bs_shift
    }

    pub(crate) async fn read_blocks(&self, lba: u64, blocks: u64) -> Result<Bytes, Fail> {
        let data = self
            .backend
            .read_at(self.offset(lba), (blocks << self.bs_shift) as usize)
            .await
            .map_err(|e| self.read_failed(lba, blocks, e))?;
        self.faults.succeeded(self.id);
        Ok(data)
    }

    /// `read_blocks` into a buffer the transport lent: the data and what the buffer noted.
    /// `range` (the read's lock) goes to the buffer, which keeps it until the data is sent
    /// if it refers to the medium's bytes where they lie; from then on task management
    /// may revoke it.
    async fn read_blocks_into(
        &self,
        lba: u64,
        blocks: u64,
        lender: &dyn storage::ReadBufSource,
        range: RangeGuard,
    ) -> Result<(Bytes, Option<storage::BufNote>), Fail> {
        let len = (blocks << self.bs_shift) as usize;
        let mut filled = self
            .backend
            .read_into(self.offset(lba), len, lender.lend(len))
            .await
            .map_err(|e| self.read_failed(lba, blocks, e))?;
        self.faults.succeeded(self.id);
        range.sending();
        filled.keep_until_sent(storage::Held::new(range));
        Ok(filled.finish())
    }

    fn read_failed(&self, lba: u64, blocks: u64, e: std::io::Error) -> Fail {
        let _ = blocks;
        self.backend_failed("read", self.offset(lba), &e, asc::READ_ERROR)
    }

    /// A failed backend operation: its sense, and a line in the LUN's fault log.
    pub(crate) fn backend_failed(
        &self,
        what: &str,
        offset: u64,
        e: &std::io::Error,
        medium: (u8, u8),
    ) -> Fail {
        self.faults.failed(self.id, what, offset, e);
        Fail::Check(io_sense(e, medium))
    }

    pub(crate) async fn write_bytes(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), Fail> {
        self.backend
            .write_at(offset, data, fua)
            .await
            .map_err(|e| self.backend_failed("write", offset, &e, asc::WRITE_ERROR))?;
        self.faults.succeeded(self.id);
        Ok(())
    }

    fn len_field(opcode: u8) -> u16 {
        if opcode == op::WRITE_ATOMIC_16 {
            return 12;
        }
        match opcode >> 5 {
            0 => 4,
            1 | 2 => 7,
            5 => 6,
            _ => 10,
        }
    }

    pub(crate) async fn read(
        &self,
        cdb: &[u8],
        lender: Option<&dyn storage::ReadBufSource>,
        task: &TaskGuard<'_>,
    ) -> CmdResult {
        let p = RwParams::parse(cdb);
        self.check_protect(cdb)?;
        self.check_range(p.lba, p.blocks as u64)?;
        if p.blocks == 0 {
            return Done::none();
        }
        self.check_transfer_len(p.blocks, Self::len_field(cdb[0]))?;
        // A shared range lock: reads run in parallel with each other, never with a write
        // of the same blocks (they see all of it or none of it), and a read whose data
        // leaves from where it lies keeps writers off until it has left.
        let range = self
            .ranges
            .lock(p.lba, p.blocks as u64, false, task)
            .await?;
        match lender {
            None => Done::data(self.read_blocks(p.lba, p.blocks as u64).await?),
            Some(lender) => {
                let (data, note) = self
                    .read_blocks_into(p.lba, p.blocks as u64, lender, range)
                    .await?;
                Ok(Done {
                    data,
                    note,
                    status: crate::status::GOOD,
                })
            }
        }
    }

    /// WRITE(6/10/12/16) and WRITE ATOMIC(16). Writes min(SPDTL, data received) bytes;
    /// a trailing partial block is merged with the medium. Every write holds an exclusive
    /// range lock for the whole transfer, so readers and other writers of overlapping
    /// blocks see all of it or none of it (which makes any write atomic).
    pub(crate) async fn write(
        &self,
        cmd: &Command,
        atomic: bool,
        task: &TaskGuard<'_>,
    ) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let p = RwParams::parse(cdb);
        self.check_protect(cdb)?;
        if atomic && be16(cdb, 10) != 0 {
            // MAXIMUM ATOMIC BOUNDARY SIZE is 0 in the Block Limits VPD: no boundaries.
            return Err(Sense::invalid_cdb_field(10, None).into());
        }
        self.check_writable()?;
        self.check_range(p.lba, p.blocks as u64)?;
        if p.blocks == 0 {
            return Done::none();
        }
        self.check_transfer_len(p.blocks, Self::len_field(cdb[0]))?;
        if atomic && p.blocks > self.max_atomic_blocks() {
            return Err(Sense::invalid_cdb_field(12, None).into());
        }
        let want = (p.blocks as usize) << self.bs_shift;
        let data = cmd.data_out.slice(..want.min(cmd.data_out.len()));
        self.write_data(p.lba, p.blocks as u64, data, p.fua(), task)
            .await?;
        Done::none()
    }

    /// Largest WRITE ATOMIC(16) in blocks: any transfer up to the maximum transfer
    /// length (the range lock makes every such write atomic).
    pub(crate) fn max_atomic_blocks(&self) -> u32 {
        (MAX_TRANSFER_BYTES >> self.bs_shift) as u32
    }

    /// Writes `data` (at most `blocks` blocks) at `lba` under an exclusive range lock, which
    /// also makes it atomic and merges a partial last block with the medium.
    async fn write_data(
        &self,
        lba: u64,
        blocks: u64,
        data: Bytes,
        fua: bool,
        task: &TaskGuard<'_>,
    ) -> Result<(), Fail> {
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.block_size as usize;
        let _range = self.ranges.lock(lba, blocks, true, task).await?;
        if data.len().is_multiple_of(bs) {
            return self.write_bytes(self.offset(lba), data, fua).await;
        }
        // Partial last block: read-modify-write that block.
        let full = data.len() / bs * bs;
        let tail_lba = lba + (full / bs) as u64;
        let mut tail = BytesMut::from(&self.read_blocks(tail_lba, 1).await?[..]);
        tail[..data.len() - full].copy_from_slice(&data[full..]);
        if full > 0 {
            self.write_bytes(self.offset(lba), data.slice(..full), fua)
                .await?;
        }
        self.write_bytes(self.offset(tail_lba), tail.freeze(), fua)
            .await
    }

    pub(crate) async fn write_verify(&self, cmd: &Command, task: &TaskGuard<'_>) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let p = RwParams::parse(cdb);
        self.check_protect(cdb)?;
        // BYTCHK 0 and 1 both write (and trivially verify) the data; 2 and 3 are reserved here.
        if p.flags & 0x04 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(2)).into());
        }
        self.check_writable()?;
        self.check_range(p.lba, p.blocks as u64)?;
        if p.blocks == 0 {
            return Done::none();
        }
        self.check_transfer_len(p.blocks, Self::len_field(cdb[0]))?;
        let want = (p.blocks as usize) << self.bs_shift;
        let data = cmd.data_out.slice(..want.min(cmd.data_out.len()));
        // Verification reads back from the medium: make the write durable first.
        self.write_data(p.lba, p.blocks as u64, data, true, task)
            .await?;
        Done::none()
    }

    pub(crate) async fn verify(&self, cmd: &Command) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let p = RwParams::parse(cdb);
        self.check_protect(cdb)?;
        let bytchk = (p.flags >> 1) & 0x03;
        if bytchk == 2 {
            return Err(Sense::invalid_cdb_field(1, Some(2)).into());
        }
        self.check_range(p.lba, p.blocks as u64)?;
        if p.blocks == 0 || bytchk == 0 {
            return Done::none();
        }
        self.check_transfer_len(p.blocks, Self::len_field(cdb[0]))?;
        let bs = self.block_size as usize;
        let need = if bytchk == 3 {
            bs
        } else {
            (p.blocks as usize) << self.bs_shift
        };
        if cmd.data_out.len() < need {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let medium = self.read_blocks(p.lba, p.blocks as u64).await?;
        for (i, (&m, at)) in medium.iter().zip(0..).enumerate() {
            let expected = if bytchk == 3 {
                cmd.data_out[i % bs]
            } else {
                cmd.data_out[i]
            };
            if m != expected {
                return Err(Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
                    .with_information(at)
                    .into());
            }
        }
        Done::none()
    }

    pub(crate) async fn orwrite(&self, cmd: &Command, task: &TaskGuard<'_>) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let p = RwParams::parse(cdb);
        self.check_protect(cdb)?;
        self.check_writable()?;
        self.check_range(p.lba, p.blocks as u64)?;
        if p.blocks == 0 {
            return Done::none();
        }
        self.check_transfer_len(p.blocks, 10)?;
        let want = (p.blocks as usize) << self.bs_shift;
        if cmd.data_out.len() < want {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let _range = self.ranges.lock(p.lba, p.blocks as u64, true, task).await?;
        let old = self.read_blocks(p.lba, p.blocks as u64).await?;
        let mut new = BytesMut::from(&old[..]);
        for (n, d) in new.iter_mut().zip(cmd.data_out.iter()) {
            *n |= d;
        }
        self.write_bytes(self.offset(p.lba), new.freeze(), p.fua())
            .await?;
        Done::none()
    }

    /// COMPARE AND WRITE: atomic against every other writer of the range (exclusive
    /// range lock held from the read through the write).
    pub(crate) async fn compare_and_write(&self, cmd: &Command, task: &TaskGuard<'_>) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let lba = be64(cdb, 2);
        let n = byte(cdb, 13);
        self.check_protect(cdb)?;
        self.check_writable()?;
        if n > MAX_CAW_BLOCKS {
            return Err(Sense::invalid_cdb_field(13, None).into());
        }
        self.check_range(lba, n as u64)?;
        // The data-out must be exactly the compare and write halves. An 8-bit NUMBER OF
        // LOGICAL BLOCKS of 0 with data-out is an initiator asking for 256 blocks (a
        // length that wrapped): reject it rather than ignore the data.
        let len = (n as usize) << self.bs_shift;
        if cmd.data_out.len() != 2 * len || cmd.expected_len as usize != 2 * len {
            return Err(Sense::invalid_cdb_field(13, None).into());
        }
        if n == 0 {
            return Done::none();
        }
        let _range = self.ranges.lock(lba, n as u64, true, task).await?;
        let fua = cdb[1] & 0x08 != 0;
        let offered = self
            .backend
            .compare_and_write(
                self.offset(lba),
                cmd.data_out.slice(..len),
                cmd.data_out.slice(len..2 * len),
                fua,
            )
            .await;
        match offered {
            Some(Ok(None)) => return Done::none(),
            Some(Ok(Some(at))) => {
                return Err(Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
                    .with_information(at)
                    .into())
            }
            Some(Err(e)) => {
                let at = self.offset(lba);
                return Err(self.backend_failed("compare and write", at, &e, asc::WRITE_ERROR));
            }
            None => {}
        }
        let current = self.read_blocks(lba, n as u64).await?;
        if let Some(at) = current
            .iter()
            .zip(cmd.data_out[..len].iter())
            .position(|(a, b)| a != b)
        {
            return Err(Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY)
                .with_information(at as u64)
                .into());
        }
        self.write_bytes(self.offset(lba), cmd.data_out.slice(len..2 * len), fua)
            .await?;
        Done::none()
    }

    pub(crate) async fn write_same(&self, cmd: &Command, task: &TaskGuard<'_>) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let sixteen = cdb[0] == op::WRITE_SAME_16;
        let (lba, blocks) = if sixteen {
            (be64(cdb, 2), be32(cdb, 10) as u64)
        } else {
            (be32(cdb, 2) as u64, be16(cdb, 7) as u64)
        };
        let flags = cdb[1];
        let unmap = flags & 0x08 != 0;
        let anchor = flags & 0x10 != 0;
        let ndob = sixteen && flags & 0x01 != 0;
        self.check_protect(cdb)?;
        if !sixteen && flags & 0x01 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(0)).into());
        }
        if anchor {
            // ANC_SUP is 0: anchored unmap is not supported.
            return Err(Sense::invalid_cdb_field(1, Some(4)).into());
        }
        if unmap && !self.thin {
            return Err(Sense::invalid_cdb_field(1, Some(3)).into());
        }
        self.check_writable()?;
        if blocks == 0 {
            // WSNZ = 1 in the Block Limits VPD.
            return Err(Sense::invalid_cdb_field(if sixteen { 10 } else { 7 }, None).into());
        }
        if blocks > MAX_WRITE_SAME_BLOCKS {
            return Err(Sense::invalid_cdb_field(if sixteen { 10 } else { 7 }, None).into());
        }
        self.check_range(lba, blocks)?;
        let bs = self.block_size as usize;
        let pattern = if ndob {
            Bytes::from(vec![0u8; bs])
        } else {
            if cmd.data_out.len() != bs {
                return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
            }
            cmd.data_out.clone()
        };
        let zero = pattern.iter().all(|&b| b == 0);
        let _range = self.ranges.lock(lba, blocks, true, task).await?;
        let (off, len) = (self.offset(lba), blocks << self.bs_shift);
        let io = if zero && unmap {
            self.backend.punch(off, len).await
        } else if zero {
            self.backend.write_zeroes(off, len).await
        } else {
            // Write the pattern in bounded chunks.
            let per_chunk = ((1usize << 20) / bs).max(1) as u64;
            let mut chunk = BytesMut::with_capacity(per_chunk as usize * bs);
            for _ in 0..per_chunk.min(blocks) {
                chunk.extend_from_slice(&pattern);
            }
            let chunk = chunk.freeze();
            let mut done = 0u64;
            let mut result = Ok(());
            while done < blocks && result.is_ok() {
                let n = per_chunk.min(blocks - done);
                result = self
                    .backend
                    .write_at(
                        self.offset(lba + done),
                        chunk.slice(..(n as usize) * bs),
                        false,
                    )
                    .await;
                done += n;
            }
            result
        };
        io.map_err(|e| self.backend_failed("write same", off, &e, asc::WRITE_ERROR))?;
        Done::none()
    }

    pub(crate) async fn unmap(&self, cmd: &Command, task: &TaskGuard<'_>) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        if !self.thin {
            return Err(Sense::illegal(asc::INVALID_OPCODE).into());
        }
        if cdb[1] & 0x01 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(0)).into());
        }
        self.check_writable()?;
        let param_len = be16(cdb, 7) as usize;
        if param_len == 0 {
            return Done::none();
        }
        let data = &cmd.data_out[..param_len.min(cmd.data_out.len())];
        if param_len < 8 || data.len() < 8 {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let desc_len = (be16(data, 2) as usize).min(data.len() - 8);
        let count = desc_len / 16;
        if count as u32 > MAX_UNMAP_DESCRIPTORS {
            return Err(Sense::invalid_param_field(2, None).into());
        }
        let mut ranges = Vec::with_capacity(count);
        for i in 0..count {
            let d = &data[8 + i * 16..8 + i * 16 + 16];
            let (lba, n) = (be64(d, 0), be32(d, 8));
            if n > MAX_UNMAP_BLOCKS {
                return Err(Sense::invalid_param_field((8 + i * 16 + 8) as u16, None).into());
            }
            self.check_range(lba, n as u64)?;
            ranges.push((lba, n as u64));
        }
        for (lba, n) in ranges {
            if n == 0 {
                continue;
            }
            let _range = self.ranges.lock(lba, n, true, task).await?;
            let at = self.offset(lba);
            self.backend
                .punch(at, n << self.bs_shift)
                .await
                .map_err(|e| self.backend_failed("unmap", at, &e, asc::WRITE_ERROR))?;
        }
        Done::none()
    }

    pub(crate) async fn get_lba_status(&self, cdb: &[u8]) -> CmdResult {
        let lba = be64(cdb, 2);
        let alloc = be32(cdb, 10) as usize;
        let total = self.num_blocks();
        if lba >= total {
            return Err(Sense::illegal(asc::LBA_OUT_OF_RANGE).into());
        }
        if alloc == 0 {
            return Done::none();
        }
        let max_desc = ((alloc.saturating_sub(8)) / 16).clamp(1, 64);
        let mut descs = Vec::new();
        let mut at = lba;
        while at < total && descs.len() < max_desc {
            let run = if self.thin {
                self.backend
                    .map_status(self.offset(at), (total - at) << self.bs_shift)
                    .await
                    .map_err(|e| {
                        self.backend_failed("mapping status", self.offset(at), &e, asc::READ_ERROR)
                    })?
            } else {
                storage::MapRun {
                    mapped: true,
                    len: (total - at) << self.bs_shift,
                }
            };
            let blocks = (run.len >> self.bs_shift)
                .max(1)
                .min(total - at)
                .min(u32::MAX as u64);
            descs.push((at, blocks as u32, if run.mapped { 0u8 } else { 1u8 }));
            at += blocks;
        }
        let mut d = Vec::with_capacity(8 + 16 * descs.len());
        d.extend_from_slice(&((4 + 16 * descs.len()) as u32).to_be_bytes());
        d.extend_from_slice(&[0; 4]);
        for (l, n, s) in descs {
            d.extend_from_slice(&l.to_be_bytes());
            d.extend_from_slice(&n.to_be_bytes());
            d.extend_from_slice(&[s, 0, 0, 0]);
        }
        Done::alloc(d, alloc)
    }

    pub(crate) fn pre_fetch(&self, cdb: &[u8]) -> CmdResult {
        let (lba, blocks) = if cdb[0] == op::PRE_FETCH_16 {
            (be64(cdb, 2), be32(cdb, 10) as u64)
        } else {
            (be32(cdb, 2) as u64, be16(cdb, 7) as u64)
        };
        self.check_range(lba, blocks)?;
        Done::none()
    }

    pub(crate) async fn sync_cache(&self, cdb: &[u8]) -> CmdResult {
        let (lba, blocks) = if cdb[0] == op::SYNC_CACHE_16 {
            (be64(cdb, 2), be32(cdb, 10) as u64)
        } else {
            (be32(cdb, 2) as u64, be16(cdb, 7) as u64)
        };
        self.check_range(lba, blocks)?;
        self.backend
            .flush()
            .await
            .map_err(|e| self.backend_failed("flush", 0, &e, asc::WRITE_ERROR))?;
        Done::none()
    }
}

/// LOGICAL UNIT NOT READY, MANUAL INTERVENTION REQUIRED: initiators fail it rather than retry.
const NOT_READY_MANUAL_INTERVENTION: (u8, u8) = (0x04, 0x03);
/// SPACE ALLOCATION FAILED WRITE PROTECT (SBC-3 4.7.3.6: no room left to provision).
const SPACE_ALLOCATION_FAILED: (u8, u8) = (0x27, 0x07);

/// The sense for a failed backend operation (and one log line by its caller):
/// - storage lost for now (a network backend's timeout or lost connection): NOT READY,
///   BECOMING READY, which initiators retry;
/// - the backing device gone (ENODEV, ENXIO): NOT READY, MANUAL INTERVENTION REQUIRED;
/// - no space left to allocate (ENOSPC, a thin file on a full file system): DATA PROTECT,
///   SPACE ALLOCATION FAILED WRITE PROTECT;
/// - anything else (EIO; a read past the end of a backing file truncated under the LUN,
///   whose blocks are inside the reported capacity): MEDIUM ERROR with `medium` (UNRECOVERED
///   READ ERROR or WRITE ERROR).
pub(crate) fn io_sense(e: &std::io::Error, medium: (u8, u8)) -> Sense {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::TimedOut | ErrorKind::NotConnected => {
            Sense::new(key::NOT_READY, asc::NOT_READY_BECOMING_READY)
        }
        ErrorKind::StorageFull => Sense::new(key::DATA_PROTECT, SPACE_ALLOCATION_FAILED),
        _ if storage::device_gone(e) => Sense::new(key::NOT_READY, NOT_READY_MANUAL_INTERVENTION),
        _ => Sense::new(key::MEDIUM_ERROR, medium),
    }
}

#[cfg(test)]
mod io_sense_tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_lost_backend_is_not_ready_and_a_failed_one_a_medium_error() {
        for kind in [ErrorKind::TimedOut, ErrorKind::NotConnected] {
            let s = io_sense(&Error::from(kind), asc::WRITE_ERROR);
            assert_eq!(s, Sense::new(key::NOT_READY, asc::NOT_READY_BECOMING_READY));
        }
        let s = io_sense(&Error::other("EIO"), asc::READ_ERROR);
        assert_eq!(s, Sense::new(key::MEDIUM_ERROR, asc::READ_ERROR));
    }

    /// errno by errno (as the file and block backends report them), and a read past the
    /// end of a truncated backing file.
    #[test]
    fn backend_errors_map_to_the_sense_sbc_prescribes() {
        let os = Error::from_raw_os_error;
        let medium = Sense::new(key::MEDIUM_ERROR, asc::READ_ERROR);
        let gone = Sense::new(key::NOT_READY, NOT_READY_MANUAL_INTERVENTION);
        let full = Sense::new(key::DATA_PROTECT, SPACE_ALLOCATION_FAILED);
        for (e, want) in [
            (os(5), medium),  // EIO
            (os(61), medium), // ENODATA
            (os(19), gone),   // ENODEV
            (os(6), gone),    // ENXIO
            (os(28), full),   // ENOSPC
            (Error::from(ErrorKind::UnexpectedEof), medium),
        ] {
            assert_eq!(io_sense(&e, asc::READ_ERROR), want, "{e}");
        }
        let w = io_sense(&os(5), asc::WRITE_ERROR);
        assert_eq!(w, Sense::new(key::MEDIUM_ERROR, asc::WRITE_ERROR));
    }
}
