//! Which hardware kernel [`super::append`] and [`super::copy_append`] run: the best the CPU has,
//! chosen at run time, or one forced by a benchmark or a test ([`force_path`]).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
use super::arm;
#[cfg(target_arch = "x86_64")]
use super::{fold, fold256, x86, STREAMS};

/// A hardware CRC32C kernel family. The folding paths fold only buffers of their minimum
/// length or more and use the streams below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The CRC32C instruction in [`super::STREAMS`] interleaved streams (x86-64: SSE4.2 and
    /// PCLMULQDQ), or one stream (AArch64: the `crc` extension).
    Streams,
    /// 256-bit VPCLMULQDQ folding with `crc32` streams beside it, from
    /// [`super::AVX2_FOLD_MIN_LEN`] bytes (x86-64 with AVX2 and VPCLMULQDQ).
    Avx2Fold,
    /// 512-bit VPCLMULQDQ folding from [`super::FOLD_MIN_LEN`] bytes, 256-bit folding from
    /// [`super::AVX2_FOLD_MIN_LEN`] (x86-64 with AVX-512F, AVX2 and VPCLMULQDQ).
    Avx512Fold,
}

impl Path {
    /// Every path, slowest first.
    pub const ALL: [Path; 3] = [Path::Streams, Path::Avx2Fold, Path::Avx512Fold];

    pub fn name(self) -> &'static str {
        match self {
            Path::Streams => "streams",
            Path::Avx2Fold => "avx2-vpclmul",
            Path::Avx512Fold => "avx512-vpclmul",
        }
    }

    pub fn from_name(name: &str) -> Option<Path> {
        Path::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether this CPU can run it.
    pub fn available(self) -> bool {
        if !super::available() {
            return false;
        }
        match self {
            Path::Streams => true,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2Fold => fold256::available(),
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Fold => fold::available() && fold256::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Path::Avx2Fold | Path::Avx512Fold => false,
        }
    }

    /// Shortest buffer this path folds (`usize::MAX` for the streams, which never fold).
    pub fn fold_min_len(self) -> usize {
        match self {
            Path::Streams => usize::MAX,
            Path::Avx2Fold | Path::Avx512Fold => super::AVX2_FOLD_MIN_LEN,
        }
    }
}

/// The fastest path this CPU can run (detected once). [`Path::Streams`] also when the CPU has
/// no hardware CRC at all; [`super::available`] tells.
pub fn best_path() -> Path {
    static BEST: OnceLock<Path> = OnceLock::new();
    *BEST.get_or_init(|| {
        Path::ALL
            .into_iter()
            .rev()
            .find(|p| p.available())
            .unwrap_or(Path::Streams)
    })
}

/// 0: none forced; otherwise the index in [`Path::ALL`] plus one.
static FORCED: AtomicU8 = AtomicU8::new(0);

/// The path [`super::append`] and [`super::copy_append`] use: the forced one, else
/// [`best_path`].
pub fn path() -> Path {
    match FORCED.load(Ordering::Relaxed) {
        0 => best_path(),
        i => Path::ALL[usize::from(i) - 1],
    }
}

/// Makes [`super::append`], [`super::copy_append`] and so [`crate::crc32c`] and every copy with
/// a CRC in the process use `path` (`None`: the best again). For benchmarks and tests that
/// measure or check a slower path on a CPU that has a faster one; every path computes the same
/// CRC, so other threads only see a different speed.
///
/// # Panics
/// If the CPU cannot run `path`.
pub fn force_path(path: Option<Path>) {
    let value = match path {
        None => 0,
        Some(p) => {
            assert!(p.available(), "CRC32C path {} not available", p.name());
            let index = Path::ALL.iter().position(|&q| q == p).expect("listed");
            index as u8 + 1
        }
    };
    FORCED.store(value, Ordering::Relaxed);
}

fn require(path: Path) {
    assert!(
        path.available(),
        "the CRC32C path {} is not available on this CPU",
        path.name()
    );
}

/// [`super::append`] on `path`. Panics if the CPU cannot run it.
pub fn append_with(path: Path, crc: u32, data: &[u8]) -> u32 {
    require(path);
    // SAFETY: `require` checked that the CPU runs `path`.
    unsafe { append_on(path, crc, data) }
}

/// [`super::copy_append_uninit`] on `path`. Panics if the CPU cannot run it or if the lengths
/// differ.
pub fn copy_append_uninit_with(
    path: Path,
    crc: u32,
    dst: &mut [MaybeUninit<u8>],
    src: &[u8],
) -> u32 {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_append: dst and src lengths differ"
    );
    require(path);
    // SAFETY: `require` checked that the CPU runs `path`; the lengths are equal.
    unsafe { copy_append_on(path, crc, dst, src) }
}

/// [`super::copy_append`] on `path`. Panics if the CPU cannot run it or if the lengths differ.
pub fn copy_append_with(path: Path, crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    copy_append_uninit_with(path, crc, super::as_uninit(dst), src)
}

/// The kernels a path runs, by buffer length.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// The `crc32` streams (fused with the copy for a copy).
    Streams,
    /// 256-bit folding (for a copy: fused, folding only).
    Fold256,
    /// 512-bit folding (for a copy: fused).
    Fold512,
    /// For a copy: the copy, then 512-bit folding over the copy. Below
    /// [`AVX512_FUSED_MIN_LEN`] the fused 512-bit kernel loses to this pair.
    CopyThenFold512,
}

/// Shortest copy the 512-bit fused kernel does; shorter ones from [`super::FOLD_MIN_LEN`] on
/// are a copy followed by a fold (docs/performance-notes.md).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX512_FUSED_MIN_LEN: usize = 2048;

/// What [`append_on`] runs for `len` bytes on `path`. An AVX-512 CPU has the 256-bit kernel
/// too, which is faster than the streams between its minimum and the 512-bit one's.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn crc_kernel(path: Path, len: usize) -> Kernel {
    match path {
        Path::Avx512Fold if len >= super::FOLD_MIN_LEN => Kernel::Fold512,
        Path::Avx512Fold | Path::Avx2Fold if len >= super::AVX2_FOLD_MIN_LEN => Kernel::Fold256,
        _ => Kernel::Streams,
    }
}

/// What [`copy_append_on`] runs for `len` bytes on `path`: on every path the fused kernel or
/// the pair of copy and CRC, whichever measured faster (docs/performance-notes.md).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn copy_kernel(path: Path, len: usize) -> Kernel {
    match path {
        Path::Avx512Fold if len >= AVX512_FUSED_MIN_LEN => Kernel::Fold512,
        Path::Avx512Fold if len >= super::FOLD_MIN_LEN => Kernel::CopyThenFold512,
        _ => crc_kernel(path, len),
    }
}

/// # Safety
/// The CPU runs `path` ([`Path::available`]).
pub(super) unsafe fn append_on(path: Path, crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (every arm): `path` is available, which checked the features each of its
        // kernels enables (SSE4.2 and PCLMULQDQ for all, AVX2 and VPCLMULQDQ for the 256-bit
        // folding, AVX-512F too for the 512-bit one), and `crc_kernel` gives each folding
        // kernel at least its minimum length.
        return !unsafe {
            match crc_kernel(path, data.len()) {
                Kernel::Fold512 | Kernel::CopyThenFold512 => fold::update(!crc, data),
                Kernel::Fold256 => fold256::update(!crc, data),
                Kernel::Streams => x86::update_nway::<STREAMS>(!crc, data),
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = path;
        // SAFETY: every available path has the CRC extension.
        return !unsafe { arm::update_1way(!crc, data) };
    }
    #[allow(unreachable_code)]
    {
        let _ = (path, crc, data);
        unreachable!("no path is available on this architecture")
    }
}

/// # Safety
/// The CPU runs `path` ([`Path::available`]); `dst.len() == src.len()`.
pub(super) unsafe fn copy_append_on(
    path: Path,
    crc: u32,
    dst: &mut [MaybeUninit<u8>],
    src: &[u8],
) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (every arm): as in `append_on`; the lengths are equal.
        return !unsafe {
            match copy_kernel(path, src.len()) {
                Kernel::Fold512 => fold::copy_update(!crc, dst, src),
                Kernel::CopyThenFold512 => fold::update(!crc, copy(dst, src)),
                Kernel::Fold256 => fold256::copy_update(!crc, dst, src),
                Kernel::Streams => x86::copy_update_nway::<STREAMS>(!crc, dst, src),
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = path;
        // SAFETY: every available path has the CRC extension.
        return !unsafe { arm::copy_update_1way(!crc, dst, src) };
    }
    #[allow(unreachable_code)]
    {
        let _ = (path, crc, dst, src);
        unreachable!("no path is available on this architecture")
    }
}

/// Copies `src` into `dst` (same length) and returns the copy, now initialized: the bytes a
/// CRC over it covers are exactly the bytes copied, even if `src` changes meanwhile.
#[cfg(target_arch = "x86_64")]
fn copy<'a>(dst: &'a mut [MaybeUninit<u8>], src: &[u8]) -> &'a [u8] {
    assert_eq!(dst.len(), src.len());
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; both slices are `src.len()` long and
    // do not overlap (`dst` is borrowed exclusively). After the copy every byte of `dst` is
    // initialized, so it may be read as `[u8]` for the lifetime of the borrow.
    unsafe {
        core::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), src.len());
        core::slice::from_raw_parts(dst.as_ptr().cast::<u8>(), dst.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel table's boundaries, as the paths promise them.
    #[test]
    fn kernels_by_length() {
        use Kernel::*;
        let (fold256, fold512) = (super::super::AVX2_FOLD_MIN_LEN, super::super::FOLD_MIN_LEN);
        for len in [0, 1, fold256 - 1, fold256, fold512, 1 << 20] {
            assert_eq!(crc_kernel(Path::Streams, len), Streams);
            assert_eq!(copy_kernel(Path::Streams, len), Streams);
        }
        assert_eq!(crc_kernel(Path::Avx2Fold, fold256 - 1), Streams);
        assert_eq!(crc_kernel(Path::Avx2Fold, fold256), Fold256);
        assert_eq!(crc_kernel(Path::Avx2Fold, 1 << 20), Fold256);
        assert_eq!(copy_kernel(Path::Avx2Fold, fold256), Fold256);
        assert_eq!(copy_kernel(Path::Avx2Fold, 1 << 20), Fold256);
        assert_eq!(crc_kernel(Path::Avx512Fold, fold256 - 1), Streams);
        assert_eq!(crc_kernel(Path::Avx512Fold, fold256), Fold256);
        assert_eq!(crc_kernel(Path::Avx512Fold, fold512), Fold512);
        assert_eq!(copy_kernel(Path::Avx512Fold, fold512 - 1), Fold256);
        assert_eq!(copy_kernel(Path::Avx512Fold, fold512), CopyThenFold512);
        assert_eq!(
            copy_kernel(Path::Avx512Fold, AVX512_FUSED_MIN_LEN - 1),
            CopyThenFold512
        );
        assert_eq!(copy_kernel(Path::Avx512Fold, AVX512_FUSED_MIN_LEN), Fold512);
    }

    #[test]
    fn forcing_a_path_is_checked_and_undone() {
        for p in Path::ALL {
            assert_eq!(Path::from_name(p.name()), Some(p));
        }
        assert!(best_path().available() || !super::super::available());
        let unavailable = Path::ALL.into_iter().find(|p| !p.available());
        if let Some(p) = unavailable {
            assert!(std::panic::catch_unwind(|| force_path(Some(p))).is_err());
        }
        // Only this test forces; others may run meanwhile, and every path computes the same.
        for p in Path::ALL.into_iter().filter(|p| p.available()) {
            force_path(Some(p));
            assert_eq!(path(), p);
            assert_eq!(crate::crc32c(b"123456789"), 0xE306_9283, "{}", p.name());
        }
        force_path(None);
        assert_eq!(path(), best_path());
    }
}
