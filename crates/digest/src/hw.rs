//! The hardware path: the CPU's CRC32C instruction, and on x86-64 CPUs with VPCLMULQDQ,
//! carry-less-multiply folding for longer buffers.
//!
//! On x86-64 (SSE4.2 `crc32` + PCLMULQDQ) a buffer is cut into [`STREAMS`] equal blocks whose
//! CRCs run as independent instruction streams, hiding the instruction's 3-cycle latency; the
//! registers are then joined by multiplying by `x^(8*len)` with one carry-less multiply each.
//! The fused copy moves 16 bytes per stream step with one vector load/store beside the two
//! `crc32`s, so the copy costs almost nothing on top of the CRC. On AArch64 (the `crc`
//! extension) one stream is used.
//!
//! Why four streams: three saturate a core with one `crc32` unit; recent cores have two, where
//! more streams make the CRC alone faster but then the copy can no longer hide under the CRC.
//! Four is the best point for the fused copy and costs nothing on one-unit cores.
//!
//! Longer buffers are folded with carry-less multiplies where the CPU has VPCLMULQDQ, which is
//! faster than the `crc32` streams (figures in docs/performance-notes.md). Which kernels run is
//! the [`Path`], chosen once at run time ([`best_path`]) or forced ([`force_path`], for
//! benchmarks and tests):
//!
//! - [`Path::Avx2Fold`] (AVX2 + VPCLMULQDQ, no AVX-512: AMD Zen 3, for one) folds 32 bytes per
//!   256-bit register from [`AVX2_FOLD_MIN_LEN`] bytes on, with `crc32` streams beside the
//!   fold for longer buffers; the fused copy is one 32-byte store per load.
//! - [`Path::Avx512Fold`] (AVX-512F too) folds 64 bytes per 512-bit register from
//!   [`FOLD_MIN_LEN`] on and uses the 256-bit kernel between the two minimums.
//!
//! On every path the copying entry points ([`copy_append`], [`copy_append_uninit`]) run the
//! fused kernel or a copy followed by the CRC, whichever measured faster for the length.
//! [`append_streams`] and [`append_with`] keep the other kernels callable for comparison.
//!
//! Every function here panics when [`available`] is false; [`crate::crc32c`] picks this path only
//! when it is.

use std::mem::MaybeUninit;

pub use path::{
    append_with, best_path, copy_append_uninit_with, copy_append_with, force_path, path, Path,
};

#[cfg(target_arch = "x86_64")]
mod fold;
#[cfg(target_arch = "x86_64")]
mod fold256;
mod path;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
mod arm;

/// Streams used by [`append`] and [`copy_append`] on x86-64 (below [`FOLD_MIN_LEN`], or
/// without folding).
pub const STREAMS: usize = 4;

/// Shortest buffer folded with 512-bit VPCLMULQDQ on [`Path::Avx512Fold`] (two steps of eight
/// 64-byte registers): at 512 B one step and the final reduction cost more than the `crc32`
/// streams; from 1 KiB on folding wins (docs/performance-notes.md).
pub const FOLD_MIN_LEN: usize = 1024;

/// Shortest buffer folded with 256-bit VPCLMULQDQ (on [`Path::Avx2Fold`], and below
/// [`FOLD_MIN_LEN`] on [`Path::Avx512Fold`]): two 256-byte steps. At 384 bytes one step and the
/// streams for the rest cost more than the streams alone (docs/performance-notes.md).
pub const AVX2_FOLD_MIN_LEN: usize = 512;

/// Whether [`append`] and [`copy_append`] fold longer buffers: [`path()`] is one of the
/// folding paths.
pub fn folding_available() -> bool {
    available() && path() != Path::Streams
}

/// Whether this CPU can run the hardware path (checked at run time; std caches the answer).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.2")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("crc")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

fn require() {
    assert!(
        available(),
        "the hardware CRC32C path is not available on this CPU"
    );
}

/// The CRC32C of `previous || data`, given `crc` = the CRC32C of `previous` (0 for none), on
/// [`path()`]: the best path this CPU has unless one was forced.
pub fn append(crc: u32, data: &[u8]) -> u32 {
    require();
    // SAFETY: `path()` is available: the best one, or a forced one `force_path` checked.
    unsafe { path::append_on(path(), crc, data) }
}

/// Like [`append`] but with a single dependent instruction stream: the plain way to use the
/// instruction, kept for the benchmark.
pub fn append_1stream(crc: u32, data: &[u8]) -> u32 {
    require();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `require` checked that the CPU has SSE4.2.
    return !unsafe { x86::update_1way(!crc, data) };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `require` checked that the CPU has the CRC extension.
    return !unsafe { arm::update_1way(!crc, data) };
    #[allow(unreachable_code)]
    {
        unreachable!("require() panics on this architecture")
    }
}

/// Like [`append`] with `N` streams (1 to 8) on x86-64, for measuring the trade-off; one
/// stream elsewhere. Panics for other `N`.
pub fn append_streams<const N: usize>(crc: u32, data: &[u8]) -> u32 {
    assert!((1..=8).contains(&N), "append_streams: 1 to 8 streams");
    require();
    #[cfg(target_arch = "x86_64")]
    {
        if N == 1 {
            // SAFETY: `require` checked that the CPU has SSE4.2.
            return !unsafe { x86::update_1way(!crc, data) };
        }
        // SAFETY: `require` checked that the CPU has SSE4.2 and PCLMULQDQ; 2 <= N <= 8.
        return !unsafe { x86::update_nway::<N>(!crc, data) };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `require` checked that the CPU has the CRC extension.
    return !unsafe { arm::update_1way(!crc, data) };
    #[allow(unreachable_code)]
    {
        unreachable!("require() panics on this architecture")
    }
}

/// Like [`copy_append`] with `N` streams (1 to 8) on x86-64; one stream elsewhere. Panics for
/// other `N` or if the lengths differ.
pub fn copy_append_streams<const N: usize>(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert!((1..=8).contains(&N), "copy_append_streams: 1 to 8 streams");
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_append: dst and src lengths differ"
    );
    require();
    #[cfg(target_arch = "x86_64")]
    {
        if N == 1 {
            // SAFETY: `require` checked that the CPU has SSE4.2.
            return !unsafe { x86::copy_update_1way(!crc, as_uninit(dst), src) };
        }
        // SAFETY: `require` checked that the CPU has SSE4.2 and PCLMULQDQ; 2 <= N <= 8.
        return !unsafe { x86::copy_update_nway::<N>(!crc, as_uninit(dst), src) };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `require` checked that the CPU has the CRC extension.
    return !unsafe { arm::copy_update_1way(!crc, as_uninit(dst), src) };
    #[allow(unreachable_code)]
    {
        unreachable!("require() panics on this architecture")
    }
}

/// Copies `src` into `dst` and returns `append(crc, src)`, in one pass over the data.
/// Panics if the lengths differ.
pub fn copy_append(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    copy_append_uninit(crc, as_uninit(dst), src)
}

/// Like [`copy_append`] into memory that need not be initialized (spare capacity of a
/// buffer): every byte of `dst` is written, so a receive buffer needs no zeroing first.
/// Panics if the lengths differ.
pub fn copy_append_uninit(crc: u32, dst: &mut [MaybeUninit<u8>], src: &[u8]) -> u32 {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_append: dst and src lengths differ"
    );
    require();
    // SAFETY: `path()` is available (as in `append`); the lengths are equal.
    unsafe { path::copy_append_on(path(), crc, dst, src) }
}

/// `dst` as possibly-uninitialized bytes, for the copy kernels.
fn as_uninit(dst: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`. The copy kernels, the only users of the
    // result, store only initialized bytes (copied from `src`), so `dst` is still fully
    // initialized when this borrow ends.
    unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) }
}
