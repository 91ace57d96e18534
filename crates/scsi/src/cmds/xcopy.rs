//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS within this target (SPC-4 6.4, 6.18).
//!
//! The copy manager understands identification CSCD descriptors (0xE4) naming a LUN of
//! this target by the NAA designator of its Device Identification VPD page, and
//! block-to-block segment descriptors (0x02). Copies run to completion inside the
//! EXTENDED COPY command; their outcome is kept per (I_T nexus, list identifier) for
//! RECEIVE COPY RESULTS / COPY STATUS unless the LIST ID USAGE says not to.
//!
//! Before any data moves, every segment's source is checked as a READ and its
//! destination as a WRITE from the EXTENDED COPY's own I_T nexus would be (see
//! [`copy_target_check`]): the copy manager reaches no LUN the initiator could not.

use std::sync::Arc;

use crate::cdb::{be16, be32, be64, byte};
use crate::command::{Command, NexusId, NexusInfo};
use crate::lun::{CopyResult, DeviceView, Lun};
use crate::outcome::{CmdResult, Done, Fail};
use crate::sense::{asc, key, Sense};
use crate::tasks::TaskGuard;

/// Copy manager limits, reported by RECEIVE COPY RESULTS / OPERATING PARAMETERS.
pub(crate) const MAX_CSCD_DESCRIPTORS: u16 = 8;
pub(crate) const MAX_SEGMENT_DESCRIPTORS: u16 = 64;
/// Bytes of CSCD plus segment descriptors one command may carry. Larger than the
/// descriptor counts allow, so a list that is too long by count is reported as such.
pub(crate) const MAX_DESCRIPTOR_LIST_LENGTH: u32 = 4096;
/// Bytes moved per backend read/write while copying a segment.
const COPY_CHUNK_BYTES: u64 = 1 << 20;

const HEADER_LEN: usize = 16;
const CSCD_LEN: usize = 32;
const CSCD_IDENTIFICATION: u8 = 0xE4;
const SEG_BLOCK_TO_BLOCK: u8 = 0x02;
const SEG_BLOCK_TO_BLOCK_LEN: usize = 28;
/// Descriptor type codes the copy manager implements (OPERATING PARAMETERS).
const IMPLEMENTED_DESCRIPTORS: [u8; 2] = [SEG_BLOCK_TO_BLOCK, CSCD_IDENTIFICATION];

/// RECEIVE COPY RESULTS service actions.
const SA_COPY_STATUS: u8 = 0x00;
const SA_OPERATING_PARAMETERS: u8 = 0x03;

/// COPY STATUS copy manager status codes.
const STATUS_COMPLETED: u8 = 0x01;
const STATUS_FAILED: u8 = 0x02;

fn copy_aborted(code: (u8, u8)) -> Fail {
    Fail::Check(Sense::new(key::COPY_ABORTED, code))
}

/// One block-to-block segment, validated against the descriptor list.
struct Segment {
    src: usize,
    dst: usize,
    blocks: u64,
    src_lba: u64,
    dst_lba: u64,
}

/// A parsed EXTENDED COPY parameter list.
struct CopyList {
    list_id: u8,
    /// LIST ID USAGE 00b: keep the results for RECEIVE COPY RESULTS.
    hold: bool,
    cscds: Vec<Arc<Lun>>,
    segments: Vec<Segment>,
}

/// Parses and checks the parameter list (everything that can fail before data moves).
fn parse(dev: &dyn DeviceView, data: &[u8]) -> Result<CopyList, Fail> {
    if data.len() < HEADER_LEN {
        return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
    }
    let list_id = data[0];
    let usage = (data[1] >> 3) & 0x03;
    let cscd_len = be16(data, 2) as usize;
    let seg_len = be32(data, 8) as usize;
    let inline_len = be32(data, 12) as usize;
    let described = HEADER_LEN
        .saturating_add(cscd_len)
        .saturating_add(seg_len)
        .saturating_add(inline_len);
    if cscd_len.saturating_add(seg_len) > MAX_DESCRIPTOR_LIST_LENGTH as usize
        || described > data.len()
    {
        return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
    }
    if usage == 0x01 || (usage == 0x03 && list_id != 0) {
        // 01b is reserved; 11b (no list identifier) requires LIST IDENTIFIER 0.
        return Err(Sense::invalid_param_field(1, Some(4)).into());
    }
    if inline_len != 0 {
        // No inline data is supported (MAXIMUM INLINE DATA LENGTH is 0).
        return Err(Sense::invalid_param_field(12, None).into());
    }
    if !cscd_len.is_multiple_of(CSCD_LEN) {
        return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
    }
    if cscd_len / CSCD_LEN > MAX_CSCD_DESCRIPTORS as usize {
        return Err(Sense::illegal(asc::TOO_MANY_TARGET_DESCRIPTORS).into());
    }
    // Count the segment descriptors (variable length: 4 + DESCRIPTOR LENGTH each).
    let segs = &data[HEADER_LEN + cscd_len..HEADER_LEN + cscd_len + seg_len];
    let mut at = 0usize;
    let mut seg_starts = Vec::new();
    while at < segs.len() {
        if seg_starts.len() >= MAX_SEGMENT_DESCRIPTORS as usize {
            return Err(Sense::illegal(asc::TOO_MANY_SEGMENT_DESCRIPTORS).into());
        }
        if at + 4 > segs.len() {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        seg_starts.push(at);
        at += 4 + be16(segs, at + 2) as usize;
    }
    if at != segs.len() {
        return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
    }

    let mut cscds = Vec::with_capacity(cscd_len / CSCD_LEN);
    for (i, d) in data[HEADER_LEN..HEADER_LEN + cscd_len]
        .chunks_exact(CSCD_LEN)
        .enumerate()
    {
        let at = (HEADER_LEN + i * CSCD_LEN) as u16;
        if d[0] != CSCD_IDENTIFICATION {
            return Err(Sense::illegal(asc::UNSUPPORTED_TARGET_DESCRIPTOR).into());
        }
        // Byte 1: LU ID TYPE and NUL are ignored (SPC-4); the device type must be
        // direct access.
        if d[1] & 0x1F != 0 {
            return Err(Sense::invalid_param_field(at + 1, Some(4)).into());
        }
        // Bytes 4..28: a designation descriptor; only NAA names a LUN here.
        let (designator_type, len) = (d[5] & 0x0F, d[7] as usize);
        if designator_type != 3 || len == 0 || 8 + len > 28 {
            return Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE));
        }
        let Some(lun) = dev.lun_by_naa(&d[8..8 + len]) else {
            return Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE));
        };
        let block_len = u32::from_be_bytes([0, d[29], d[30], d[31]]);
        if block_len != 0 && block_len != lun.block_size {
            return Err(Sense::invalid_param_field(at + 29, None).into());
        }
        cscds.push(lun);
    }

    let mut segments = Vec::with_capacity(seg_starts.len());
    for start in seg_starts {
        let d = &segs[start..];
        let at = (HEADER_LEN + cscd_len + start) as u16;
        if d[0] != SEG_BLOCK_TO_BLOCK {
            return Err(Sense::illegal(asc::UNSUPPORTED_SEGMENT_DESCRIPTOR).into());
        }
        if 4 + be16(d, 2) as usize != SEG_BLOCK_TO_BLOCK_LEN {
            return Err(Sense::invalid_param_field(at + 2, None).into());
        }
        let (src, dst) = (be16(d, 4) as usize, be16(d, 6) as usize);
        let (Some(s), Some(t)) = (cscds.get(src), cscds.get(dst)) else {
            return Err(copy_aborted(asc::UNREACHABLE_COPY_TARGET));
        };
        let blocks = be16(d, 10) as u64;
        // DC (byte 1 bit 1) picks whose blocks BLOCK DEVICE NUMBER OF BLOCKS counts.
        let counted_in = if byte(d, 1) & 0x02 != 0 { t } else { s };
        let bytes = blocks << counted_in.bs_shift;
        if !bytes.is_multiple_of(s.block_size as u64) || !bytes.is_multiple_of(t.block_size as u64)
        {
            return Err(Sense::invalid_param_field(at + 10, None).into());
        }
        let (src_lba, dst_lba) = (be64(d, 12), be64(d, 20));
        let in_range = |lun: &Lun, lba: u64| {
            let n = bytes >> lun.bs_shift;
            lba.checked_add(n)
                .is_some_and(|end| end <= lun.num_blocks())
        };
        if !in_range(s, src_lba) || !in_range(t, dst_lba) {
            return Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE));
        }
        segments.push(Segment {
            src,
            dst,
            blocks: bytes >> s.bs_shift,
            src_lba,
            dst_lba,
        });
    }
    Ok(CopyList {
        list_id,
        hold: usage == 0x00,
        cscds,
        segments,
    })
}

/// Checks every segment's source as a read and destination as a write by `nexus`.
fn check_copy_targets(
    list: &CopyList,
    nexus: NexusId,
    info: Option<&NexusInfo>,
) -> Result<(), Fail> {
    for seg in &list.segments {
        let (src, dst) = (&list.cscds[seg.src], &list.cscds[seg.dst]);
        copy_target_check(src, nexus, info, false)?;
        copy_target_check(dst, nexus, info, true)?;
        dst.check_copy_destination()?;
    }
    Ok(())
}

/// What EXTENDED COPY answers when `lun` refuses the copy's nexus a read (or a write):
/// a reservation conflict is RESERVATION CONFLICT, as the initiator addressing the LUN
/// would get (the reservation is about that initiator's access, whoever moves the data);
/// a LUN not ready (sanitize, medium removed) is CHECK CONDITION, COPY ABORTED, COPY
/// TARGET DEVICE NOT REACHABLE, SPC-4's answer for a copy target the copy manager
/// cannot use (NOT READY sense would say the copy manager's own LUN is not ready).
fn copy_target_check(
    lun: &Lun,
    nexus: NexusId,
    info: Option<&NexusInfo>,
    write: bool,
) -> Result<(), Fail> {
    match lun.copy_access_check(nexus, info, write) {
        None => Ok(()),
        Some(Fail::Status(status)) => Err(Fail::Status(status)),
        Some(Fail::Check(_)) => Err(copy_aborted(asc::COPY_TARGET_NOT_REACHABLE)),
    }
}

impl Lun {
    pub(crate) async fn extended_copy(
        &self,
        dev: &dyn DeviceView,
        cmd: &Command,
        info: Option<&NexusInfo>,
        guard: &TaskGuard<'_>,
    ) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        if cdb[1] & 0x1F != 0 {
            // Only LID1 (service action 0) is implemented.
            return Err(Sense::invalid_cdb_field(1, Some(4)).into());
        }
        let param_len = be32(cdb, 10) as usize;
        if param_len == 0 {
            return Done::none();
        }
        let data = &cmd.data_out[..param_len.min(cmd.data_out.len())];
        if data.len() < param_len {
            return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
        }
        let list = parse(dev, data)?;
        let mut result = CopyResult::default();
        let outcome = match check_copy_targets(&list, cmd.nexus, info) {
            Ok(()) => self.run_copy(&list, guard, &mut result).await,
            Err(fail) => Err(fail),
        };
        result.failed = outcome.is_err();
        if list.hold {
            let mut st = self.state();
            st.copies.insert((cmd.nexus, list.list_id), result);
        }
        outcome?;
        Done::none()
    }

    /// Moves the data of every segment, counting progress into `result`.
    async fn run_copy(
        &self,
        list: &CopyList,
        guard: &TaskGuard<'_>,
        result: &mut CopyResult,
    ) -> Result<(), Fail> {
        for seg in &list.segments {
            let (src, dst) = (&list.cscds[seg.src], &list.cscds[seg.dst]);
            let per_chunk = (COPY_CHUNK_BYTES >> src.bs_shift).max(1);
            let mut done = 0u64;
            while done < seg.blocks {
                // An abort ends the copy at the next chunk: its range lock refuses an
                // aborted task.
                let n = per_chunk.min(seg.blocks - done);
                let data = {
                    let _r = src.ranges.lock(seg.src_lba + done, n, false, guard).await?;
                    src.read_blocks(seg.src_lba + done, n)
                        .await
                        .map_err(|_| copy_aborted(asc::READ_ERROR))?
                };
                let bytes = data.len() as u64;
                let dst_lba = seg.dst_lba + ((done << src.bs_shift) >> dst.bs_shift);
                {
                    let _w = dst
                        .ranges
                        .lock(dst_lba, bytes >> dst.bs_shift, true, guard)
                        .await?;
                    dst.write_bytes(dst_lba << dst.bs_shift, data, false)
                        .await
                        .map_err(|_| copy_aborted(asc::WRITE_ERROR))?;
                }
                result.transfer_count += bytes;
                done += n;
            }
            result.segments_processed += 1;
        }
        Ok(())
    }

    fn check_copy_destination(&self) -> Result<(), Fail> {
        if self.write_protected() {
            return Err(Sense::new(key::DATA_PROTECT, asc::WRITE_PROTECTED).into());
        }
        Ok(())
    }

    pub(crate) fn receive_copy_results(&self, cmd: &Command) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let alloc = be32(cdb, 10) as usize;
        match cdb[1] & 0x1F {
            SA_COPY_STATUS => {
                let list_id = cdb[2];
                let Some(r) = self.state().copies.get(&(cmd.nexus, list_id)).copied() else {
                    return Err(Sense::invalid_cdb_field(2, None).into());
                };
                // Transfer count in KiB keeps it inside 32 bits for any copy we accept.
                let mut d = vec![0u8; 12];
                d[0..4].copy_from_slice(&8u32.to_be_bytes());
                d[4] = if r.failed {
                    STATUS_FAILED
                } else {
                    STATUS_COMPLETED
                };
                d[5..7].copy_from_slice(&r.segments_processed.to_be_bytes());
                d[7] = 0x01; // transfer count units: kibibytes
                let kib = (r.transfer_count >> 10).min(u32::MAX as u64) as u32;
                d[8..12].copy_from_slice(&kib.to_be_bytes());
                Done::alloc(d, alloc)
            }
            SA_OPERATING_PARAMETERS => {
                let mut d = vec![0u8; 44];
                d[4] = 0x01; // SNLID: LIST ID USAGE 11b (no list identifier) supported
                d[8..10].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
                d[10..12].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
                d[12..16].copy_from_slice(&MAX_DESCRIPTOR_LIST_LENGTH.to_be_bytes());
                // Maximum segment length: 65535 blocks (the 2-byte block count).
                let max_seg = (u16::MAX as u64) << self.bs_shift;
                d[16..20].copy_from_slice(&(max_seg.min(u32::MAX as u64) as u32).to_be_bytes());
                // Bytes 20..32: no inline data, no held data, no stream devices.
                d[34..36].copy_from_slice(&1u16.to_be_bytes()); // total concurrent copies
                d[36] = 1; // maximum concurrent copies
                d[37] = self.bs_shift as u8; // data segment granularity (log2 bytes)
                d[43] = IMPLEMENTED_DESCRIPTORS.len() as u8;
                d.extend_from_slice(&IMPLEMENTED_DESCRIPTORS);
                let available = (d.len() - 4) as u32;
                d[0..4].copy_from_slice(&available.to_be_bytes());
                Done::alloc(d, alloc)
            }
            _ => Err(Sense::invalid_cdb_field(1, Some(4)).into()),
        }
    }
}
