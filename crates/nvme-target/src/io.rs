//! The NVM command set on an I/O queue: a command checked against its namespace becomes an
//! [`IoOp`], which [`run`] carries out on the LUN's backend; backend faults become the
//! NVMe status a host expects (Unrecovered Read Error, Write Fault, Internal Error).

use bytes::Bytes;
use nvme_tcp::sqe::{nvm, Fuse};
use nvme_tcp::{Sqe, StatusCode};
use scsi::LunExport;
use std::sync::Arc;
use storage::Backend;

/// Bytes of data one Dataset Management command may carry (256 ranges).
pub const MAX_DSM_DATA: usize = 256 * nvm::DSM_RANGE_LEN;

/// What an NVM command does on the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoKind {
    /// Read `len` bytes at `offset`.
    Read { offset: u64, len: usize },
    /// Write `data` at `offset`.
    Write { offset: u64, data: Bytes, fua: bool },
    /// Compare the bytes at `offset` with `data`.
    Compare { offset: u64, data: Bytes },
    /// Make completed writes durable.
    Flush,
    /// Zero `len` bytes at `offset`; `deallocate`: punch them instead.
    WriteZeroes {
        offset: u64,
        len: u64,
        deallocate: bool,
    },
    /// Deallocate (offset, length) byte ranges.
    Deallocate(Vec<(u64, u64)>),
    /// Nothing to do (Dataset Management without Deallocate).
    Nothing,
}

/// An NVM command ready for the backend.
#[derive(Clone)]
pub struct IoOp {
    /// The storage.
    pub backend: Arc<dyn Backend>,
    /// What to do.
    pub kind: IoKind,
}

impl std::fmt::Debug for IoOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoOp").field("kind", &self.kind).finish()
    }
}

/// Whether `opcode` is one of the NVM I/O commands served here.
pub fn is_io_opcode(opcode: u8) -> bool {
    matches!(
        opcode,
        nvm::READ
            | nvm::WRITE
            | nvm::COMPARE
            | nvm::FLUSH
            | nvm::WRITE_ZEROES
            | nvm::DATASET_MANAGEMENT
    )
}

/// The byte range of `blocks` blocks from `slba`, if it lies within the namespace.
fn range(ns: &LunExport, slba: u64, blocks: u64) -> Result<(u64, u64), StatusCode> {
    let end = slba
        .checked_add(blocks)
        .ok_or(StatusCode::LBA_OUT_OF_RANGE)?;
    if end > ns.num_blocks() {
        return Err(StatusCode::LBA_OUT_OF_RANGE);
    }
    let bs = u64::from(ns.block_size());
    Ok((slba * bs, blocks * bs))
}

/// Checks an NVM command against its namespace (`data`: the host's data for it) and says
/// what to do.
pub fn prepare(ns: &LunExport, sqe: &Sqe, data: &Bytes) -> Result<IoKind, StatusCode> {
    if sqe.fuse() != Fuse::Normal {
        // Fused Compare and Write is not offered (FUSES 0).
        return Err(StatusCode::INVALID_FIELD);
    }
    if !ns.backend().ready() {
        return Err(StatusCode::NAMESPACE_NOT_READY);
    }
    let writes = matches!(
        sqe.opcode(),
        nvm::WRITE | nvm::WRITE_ZEROES | nvm::DATASET_MANAGEMENT
    );
    if writes && ns.write_protected() {
        return Err(StatusCode::NAMESPACE_WRITE_PROTECTED);
    }
    let sgl_len = u64::from(sqe.sgl().length);
    match sqe.opcode() {
        nvm::READ | nvm::WRITE | nvm::COMPARE => {
            let (offset, len) = range(ns, sqe.slba(), u64::from(sqe.nlb()))?;
            if sgl_len != len {
                return Err(StatusCode::SGL_LENGTH_INVALID);
            }
            match sqe.opcode() {
                nvm::READ => Ok(IoKind::Read {
                    offset,
                    len: len as usize,
                }),
                _ if data.len() as u64 != len => Err(StatusCode::SGL_LENGTH_INVALID),
                nvm::WRITE => Ok(IoKind::Write {
                    offset,
                    data: data.clone(),
                    fua: sqe.fua(),
                }),
                _ => Ok(IoKind::Compare {
                    offset,
                    data: data.clone(),
                }),
            }
        }
        nvm::FLUSH => Ok(IoKind::Flush),
        nvm::WRITE_ZEROES => {
            let (offset, len) = range(ns, sqe.slba(), u64::from(sqe.nlb()))?;
            let deallocate = sqe.cdw(12) & (1 << 25) != 0 && ns.thin();
            Ok(IoKind::WriteZeroes {
                offset,
                len,
                deallocate,
            })
        }
        nvm::DATASET_MANAGEMENT => {
            let nr = (sqe.cdw(10) & 0xFF) as usize + 1;
            if data.len() < nr * nvm::DSM_RANGE_LEN {
                return Err(StatusCode::SGL_LENGTH_INVALID);
            }
            if sqe.cdw(11) & nvm::DSM_DEALLOCATE == 0 {
                return Ok(IoKind::Nothing);
            }
            let mut ranges = Vec::with_capacity(nr);
            for r in nvm::dsm_ranges(&data[..nr * nvm::DSM_RANGE_LEN]) {
                if r.blocks > 0 {
                    ranges.push(range(ns, r.slba, u64::from(r.blocks))?);
                }
            }
            Ok(IoKind::Deallocate(ranges))
        }
        _ => Err(StatusCode::INVALID_OPCODE),
    }
}

/// Carries out `op`: the data read (reads) or nothing, or the status of the failure.
pub async fn run(op: IoOp) -> Result<Option<Bytes>, StatusCode> {
    let b = op.backend;
    let fault = |e: std::io::Error, code: StatusCode| {
        tracing::warn!("nvme: backend {} failed: {e}", b.kind());
        code
    };
    match op.kind {
        IoKind::Read { offset, len } => b
            .read_at(offset, len)
            .await
            .map(Some)
            .map_err(|e| fault(e, StatusCode::UNRECOVERED_READ_ERROR)),
        IoKind::Write { offset, data, fua } => b
            .write_at(offset, data, fua)
            .await
            .map(|_| None)
            .map_err(|e| fault(e, StatusCode::WRITE_FAULT)),
        IoKind::Compare { offset, data } => {
            let got = b
                .read_at(offset, data.len())
                .await
                .map_err(|e| fault(e, StatusCode::UNRECOVERED_READ_ERROR))?;
            if got == data {
                Ok(None)
            } else {
                Err(StatusCode::COMPARE_FAILURE)
            }
        }
        IoKind::Flush => b
            .flush()
            .await
            .map(|_| None)
            .map_err(|e| fault(e, StatusCode::INTERNAL_ERROR)),
        IoKind::WriteZeroes {
            offset,
            len,
            deallocate,
        } => {
            let r = if deallocate {
                b.punch(offset, len).await
            } else {
                b.write_zeroes(offset, len).await
            };
            r.map(|_| None)
                .map_err(|e| fault(e, StatusCode::WRITE_FAULT))
        }
        IoKind::Deallocate(ranges) => {
            for (offset, len) in ranges {
                b.punch(offset, len)
                    .await
                    .map_err(|e| fault(e, StatusCode::WRITE_FAULT))?;
            }
            Ok(None)
        }
        IoKind::Nothing => Ok(None),
    }
}
