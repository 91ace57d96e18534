//! x86-64 with AVX2 and VPCLMULQDQ but no AVX-512 (AMD Zen 3, for one): CRC32C by folding
//! 256-bit registers, with `crc32` streams running beside the fold.
//!
//! The folding is that of [`super::fold`] (see there for the algebra and the bit order) on
//! 256-bit registers holding two 128-bit pieces each: every 32 bytes cost two carry-less
//! multiplies and two XORs (no three-way XOR without AVX-512). The multiplier then bounds the
//! loop at two cycles per 32 bytes while the `crc32` unit, a separate port, idles; so each step
//! also feeds [`LANES`] `crc32` streams over their own parts of the chunk. A chunk of `n` steps
//! is laid out as
//!
//! ```text
//! | fold: n * 256 bytes | lane 0: n * 32 | lane 1: n * 32 | lane 2: n * 32 | lane 3: n * 32 |
//! ```
//!
//! and its register is the folded part's register moved past the lanes, XORed with each lane's
//! register moved past the lanes after it (one carry-less multiply each, as the streams of
//! [`super::x86`] are joined). Two fold bytes per lane byte keep both units busy: the multiplier
//! takes two cycles per 32 folded bytes, the lanes' `crc32`s two cycles per 16.
//!
//! Below [`HYBRID_MIN_LEN`] bytes, and in the fused copy at every length, every step is folded
//! only (256 bytes): short buffers gain nothing from lanes that still need joining, and with
//! the copy's stores the lanes made the loop slower, not faster (docs/performance-notes.md).
//! What no whole step covers goes through the `crc32` streams of [`super::x86`].
//!
//! These are `unsafe fn`s because of `#[target_feature]` (callers must have checked the CPU) and
//! because the loops load and store through raw pointers whose bounds are argued at each use.

use core::arch::x86_64::{
    __m128i, __m256i, _mm256_castsi256_si128, _mm256_clmulepi64_epi128, _mm256_extracti128_si256,
    _mm256_set_epi64x, _mm256_storeu_si256, _mm256_xor_si256, _mm_crc32_u64, _mm_prefetch,
    _mm_xor_si128, _MM_HINT_T0,
};
use core::mem::MaybeUninit;

use super::fold::{fold128, fold_constants, reduce128};
use super::x86::shift_words;

/// 256-bit accumulators in flight: each is folded once per step, which leaves the multiply's
/// and the XORs' latency room under the other seven.
const ACC: usize = 8;
/// `crc32` streams beside the fold.
const LANES: usize = 4;
/// Bytes each lane takes per step (four `crc32`s).
const LANE_STEP: usize = 32;
/// Folded bytes per step: one 32-byte block per accumulator.
const FOLD_STEP: usize = 32 * ACC;
/// Bytes per step, folded and in lanes.
const STEP: usize = FOLD_STEP + LANES * LANE_STEP;
/// Most steps in one chunk: the lanes' join multiplies by constants from
/// [`super::x86::shift_words`]'s table, which reaches 7 * 4 KiB.
const MAX_STEPS: usize = 128;
const _: () = assert!(LANES * MAX_STEPS * LANE_STEP <= 7 * 4096);
/// How far ahead of the loads cache lines are prefetched, in bytes (as in [`super::fold`]).
const PF: usize = 4096;

/// Shortest input of [`update`] and [`copy_update`] (at least one step without lanes).
const MIN_LEN: usize = super::AVX2_FOLD_MIN_LEN;
const _: () = assert!(MIN_LEN >= FOLD_STEP);
/// Shortest input [`update`] runs the lanes for; below it every step is folded only.
const HYBRID_MIN_LEN: usize = 1024;
const _: () = assert!(HYBRID_MIN_LEN >= STEP);

const K_STEP: (u64, u64) = fold_constants(8 * FOLD_STEP as u64);
const K_1024: (u64, u64) = fold_constants(1024);
const K_512: (u64, u64) = fold_constants(512);
const K_256: (u64, u64) = fold_constants(256);
const K_128: (u64, u64) = fold_constants(128);

/// Whether this CPU can run the 256-bit folding path.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
        && std::arch::is_x86_feature_detected!("pclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.2")
        && std::arch::is_x86_feature_detected!("sse4.1")
}

/// `k` for both 128-bit lanes of a 256-bit register.
#[inline]
#[target_feature(enable = "avx2")]
fn broadcast(k: (u64, u64)) -> __m256i {
    let (hi, lo) = (k.0 as i64, k.1 as i64);
    _mm256_set_epi64x(lo, hi, lo, hi)
}

/// `acc` moved forward by the distance `k` was made for, XORed onto `next`.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(acc: __m256i, k: __m256i, next: __m256i) -> __m256i {
    let high = _mm256_clmulepi64_epi128(acc, k, 0x00);
    let low = _mm256_clmulepi64_epi128(acc, k, 0x11);
    _mm256_xor_si256(_mm256_xor_si256(high, low), next)
}

/// 32 bytes at `p` in one load the compiler cannot repeat or split (see
/// [`super::fold`]'s `load_once`): a copy and its CRC see the same bytes.
///
/// # Safety
/// `p..p + 32` must be readable; AVX.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_once(p: *const u8) -> __m256i {
    let v: __m256i;
    // SAFETY: the caller guarantees 32 readable bytes at `p`; vmovdqu takes any alignment and
    // touches no other memory, stack or flags.
    unsafe {
        core::arch::asm!(
            "vmovdqu {v}, [{p}]",
            v = out(ymm_reg) v,
            p = in(reg) p,
            options(nostack, preserves_flags, readonly, pure)
        )
    };
    v
}

/// The 8 accumulators (consecutive 32-byte blocks, the first the earliest) folded into one
/// 128-bit piece, as a tree so that the three levels' latencies do not add up eight times.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
fn combine(acc: [__m256i; ACC]) -> __m128i {
    let k256 = broadcast(K_256);
    let k512 = broadcast(K_512);
    let k1024 = broadcast(K_1024);
    let pairs = [
        fold256(acc[0], k256, acc[1]),
        fold256(acc[2], k256, acc[3]),
        fold256(acc[4], k256, acc[5]),
        fold256(acc[6], k256, acc[7]),
    ];
    let quads = [
        fold256(pairs[0], k512, pairs[1]),
        fold256(pairs[2], k512, pairs[3]),
    ];
    let one = fold256(quads[0], k1024, quads[1]);
    _mm_xor_si128(
        fold128(_mm256_castsi256_si128(one), K_128),
        _mm256_extracti128_si256::<1>(one),
    )
}

/// One chunk of `steps` steps with `L` lanes (`steps * (FOLD_STEP + L * LANE_STEP)` bytes at
/// `src`, the chunk) from raw register `reg`; returns the raw register after it. With `COPY`,
/// every byte read is also stored at the same offset at `out` (a separate instance, so the loop
/// has no branch on it).
///
/// # Safety
/// `1 <= steps <= MAX_STEPS`; `src` readable and, with `COPY`, `out` writable for the chunk's
/// length, not overlapping; AVX2, VPCLMULQDQ, PCLMULQDQ, SSE4.2, SSE4.1.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
unsafe fn chunk<const COPY: bool, const L: usize>(
    reg: u32,
    src: *const u8,
    out: *mut u8,
    steps: usize,
) -> u32 {
    const { assert!(!COPY || L == 0, "a copy is folded only") };
    debug_assert!((1..=MAX_STEPS).contains(&steps));
    let fold_len = steps * FOLD_STEP;
    let lane_len = steps * LANE_STEP;
    // Every offset named below leaves room for its 32 bytes inside the chunk: the folded part
    // is fold_len bytes, then L lanes of lane_len.
    macro_rules! block {
        ($off:expr) => {{
            let off: usize = $off;
            // SAFETY: off + 32 <= fold_len, inside the chunk: readable (the caller's contract).
            let v = unsafe { load_once(src.add(off)) };
            if COPY {
                // SAFETY: the same 32 bytes of the output, writable and apart from `src`.
                unsafe { _mm256_storeu_si256(out.add(off).cast(), v) };
            }
            v
        }};
    }
    let mut acc: [__m256i; ACC] = core::array::from_fn(|i| block!(32 * i));
    // The incoming register is XORed into the first 32 bits, as `crc32` would.
    acc[0] = _mm256_xor_si256(acc[0], _mm256_set_epi64x(0, 0, 0, i64::from(reg)));
    let mut lanes = [0u64; L];
    let k_step = broadcast(K_STEP);
    for step in 0..steps {
        for line in 0..FOLD_STEP / 64 {
            // A prefetch never faults; `wrapping_add` keeps the address defined past the end.
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(step * FOLD_STEP + 64 * line + PF).cast());
        }
        if step > 0 {
            for (i, a) in acc.iter_mut().enumerate() {
                let next = block!(step * FOLD_STEP + 32 * i);
                *a = fold256(*a, k_step, next);
            }
        }
        for (l, c) in lanes.iter_mut().enumerate() {
            let at = fold_len + l * lane_len + step * LANE_STEP;
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(at + PF).cast());
            for w in 0..LANE_STEP / 8 {
                // SAFETY: at + LANE_STEP <= fold_len + (l + 1) * lane_len, inside the chunk.
                *c = _mm_crc32_u64(*c, unsafe { super::x86::load_word(src.add(at + 8 * w)) });
            }
        }
    }
    let folded = reduce128(combine(acc));
    // SAFETY: the features include SSE4.2 and PCLMULQDQ; every shift is at most
    // LANES * MAX_STEPS * LANE_STEP / 8 words, inside the table, and at least one (a shift by
    // zero words is not in it: the last lane is not shifted).
    unsafe {
        let words = lane_len / 8;
        let Some((&last, rest)) = lanes.split_last() else {
            return folded;
        };
        let mut reg = shift_words(folded, L * words) ^ last as u32;
        for (l, &c) in rest.iter().enumerate() {
            reg ^= shift_words(c as u32, (L - 1 - l) * words);
        }
        reg
    }
}

/// Runs whole chunks over `len` bytes at `src` (storing to `out` with `COPY`) from raw register
/// `reg`; returns the register and how many bytes that was (all but less than one step).
///
/// # Safety
/// As for [`chunk`], for `len` bytes.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
unsafe fn chunks<const COPY: bool, const L: usize>(
    mut reg: u32,
    src: *const u8,
    out: *mut u8,
    len: usize,
) -> (u32, usize) {
    let mut done = 0;
    let step = FOLD_STEP + L * LANE_STEP;
    while len - done >= step {
        let steps = ((len - done) / step).min(MAX_STEPS);
        // SAFETY: done + steps * step <= len: inside both buffers (the caller's contract).
        reg = unsafe { chunk::<COPY, L>(reg, src.add(done), out.wrapping_add(done), steps) };
        done += steps * step;
    }
    (reg, done)
}

/// The raw register after `data`, from raw register `reg`. `data.len() >= MIN_LEN`.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
pub(super) unsafe fn update(reg: u32, data: &[u8]) -> u32 {
    assert!(data.len() >= MIN_LEN);
    let (mut reg, mut done) = (reg, 0);
    if data.len() >= HYBRID_MIN_LEN {
        // SAFETY: the caller checked the features; `data` is readable for its length.
        (reg, done) = unsafe {
            chunks::<false, LANES>(reg, data.as_ptr(), core::ptr::null_mut(), data.len())
        };
    }
    let rest = &data[done..];
    // SAFETY: as above, for the rest of `data`.
    let (reg, more) =
        unsafe { chunks::<false, 0>(reg, rest.as_ptr(), core::ptr::null_mut(), rest.len()) };
    // SAFETY: the same features include SSE4.2 and PCLMULQDQ.
    unsafe { super::x86::update_nway::<{ super::STREAMS }>(reg, &rest[more..]) }
}

/// Copies `src` into `dst` (every byte written) and returns the raw register after `src`.
/// `dst.len() == src.len() >= MIN_LEN`. Folds every byte it can, without lanes: with the copy's
/// stores, the lanes made it slower, not faster.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
pub(super) unsafe fn copy_update(reg: u32, dst: &mut [MaybeUninit<u8>], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len());
    assert!(src.len() >= MIN_LEN);
    let out = dst.as_mut_ptr().cast::<u8>();
    // SAFETY: the caller checked the features; `out` is writable for src.len() bytes (dst has
    // that length) and does not overlap `src` (dst is borrowed exclusively). `chunks` stores
    // exactly the bytes it reads: dst[..done].
    let (reg, done) = unsafe { chunks::<true, 0>(reg, src.as_ptr(), out, src.len()) };
    // SAFETY: the same features include SSE4.2 and PCLMULQDQ.
    unsafe {
        super::x86::copy_update_nway::<{ super::STREAMS }>(reg, &mut dst[done..], &src[done..])
    }
}
