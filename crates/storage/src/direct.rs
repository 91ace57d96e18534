//! O_DIRECT transfers, for block devices and for file LUNs configured with `direct`:
//! requests whose offset and length are multiples of [`DIRECT_ALIGN`] go through an
//! O_DIRECT descriptor from memory aligned as well (a write's data is copied to aligned
//! memory when it is not); the others go through the buffered descriptor (the kernel keeps
//! the two coherent: a direct write drops the cached pages of its range, a direct read
//! writes back dirty ones first).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use bytes::Bytes;
use rustix::fs::OFlags;

/// Alignment (memory address, offset and length) used for O_DIRECT transfers.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// True when a transfer of `len` bytes at `offset` can go through O_DIRECT.
pub(crate) fn aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(DIRECT_ALIGN as u64) && len.is_multiple_of(DIRECT_ALIGN) && len > 0
}

/// `path` opened with O_DIRECT, or why not (some file systems refuse it).
pub(crate) fn open(path: &Path, read_only: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(OFlags::DIRECT.bits() as i32)
        .open(path)
}

/// A zeroed buffer of `len` bytes whose start is DIRECT_ALIGN-aligned in memory, returned
/// as (backing vector, start index). Over-allocating and slicing avoids unsafe code.
pub(crate) fn aligned_buffer(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; len + DIRECT_ALIGN];
    let misalign = buf.as_ptr() as usize % DIRECT_ALIGN;
    let start = if misalign == 0 {
        0
    } else {
        DIRECT_ALIGN - misalign
    };
    (buf, start)
}

pub(crate) fn read_direct(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let (mut buf, start) = aligned_buffer(len);
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[start + done..start + len], offset + done as u64) {
            Ok(0) => return Err(crate::ends_early(offset + done as u64)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // Zero-copy: the response shares the aligned vector.
    Ok(Bytes::from(buf).slice(start..start + len))
}

/// `data`, or a copy of it whose start is DIRECT_ALIGN-aligned in memory.
pub(crate) fn aligned_bytes(data: Bytes) -> Bytes {
    if (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
        return data;
    }
    let (mut buf, start) = aligned_buffer(data.len());
    buf[start..start + data.len()].copy_from_slice(&data);
    Bytes::from(buf).slice(start..start + data.len())
}

pub(crate) fn write_direct(file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
    if (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
        return file.write_all_at(data, offset);
    }
    let (mut buf, start) = aligned_buffer(data.len());
    buf[start..start + data.len()].copy_from_slice(data);
    file.write_all_at(&buf[start..start + data.len()], offset)
}
