//! AArch64: the `crc` extension's CRC32C instructions, one stream.
//!
//! These are `unsafe fn`s only because of `#[target_feature]`: callers must have checked the
//! feature. All memory access goes through safe slices.

use core::arch::aarch64::{__crc32cb, __crc32cd};
use core::mem::MaybeUninit;

#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8-byte chunk"))
}

/// One stream over the raw register.
#[target_feature(enable = "crc")]
pub(super) unsafe fn update_1way(mut reg: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        reg = __crc32cd(reg, word(w));
    }
    for &b in words.remainder() {
        reg = __crc32cb(reg, b);
    }
    reg
}

/// One stream, copying each word to `dst` as it is read; every byte of `dst` is written, so
/// it may start uninitialized. `dst.len() == src.len()`.
#[target_feature(enable = "crc")]
pub(super) unsafe fn copy_update_1way(
    mut reg: u32,
    dst: &mut [MaybeUninit<u8>],
    src: &[u8],
) -> u32 {
    let mut src_words = src.chunks_exact(8);
    let mut dst_words = dst.chunks_exact_mut(8);
    for (d, s) in (&mut dst_words).zip(&mut src_words) {
        let w = word(s);
        for (x, y) in d.iter_mut().zip(w.to_le_bytes()) {
            x.write(y);
        }
        reg = __crc32cd(reg, w);
    }
    let tail = src_words.remainder();
    for (d, &b) in dst_words.into_remainder().iter_mut().zip(tail) {
        d.write(b);
        reg = __crc32cb(reg, b);
    }
    reg
}
