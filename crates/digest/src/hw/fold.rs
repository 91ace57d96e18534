//! x86-64 with AVX-512 and VPCLMULQDQ: CRC32C by carry-less multiplication ("folding").
//!
//! The message is a polynomial over GF(2), and only its remainder modulo the Castagnoli
//! polynomial P matters. A 128-bit piece `A = H*x^64 + L` that lies `D` bits before the end of
//! what has been read so far can be replaced by `H*(x^(64+D) mod P) + L*(x^D mod P)`, a value of
//! at most 96 bits, XORed onto the 128 bits `D` bits later: the remainder does not change. One
//! 512-bit register holds four such pieces, so every 64 bytes cost two carry-less multiplies and
//! one three-way XOR, and eight registers in flight hide the multiply's latency. What is left at
//! the end is one 128-bit piece, which two `crc32` instructions reduce to the 32-bit register.
//!
//! Bit order: the CRC is reflected, so in each 64-bit lane bit `i` is the coefficient of
//! `x^(63-i)`, and the lane at the lower address holds the higher powers. A carry-less product
//! of two such lanes comes out one bit short of the 128-bit reflected convention (bit `j` holds
//! `x^(126-j)`), i.e. it is the product times `x`; the constants are therefore
//! `x^(64+D-1) mod P` and `x^(D-1) mod P`, placed in the high 32 bits of their lane.
//!
//! These are `unsafe fn`s because of `#[target_feature]` (callers must have checked the CPU)
//! and because the loops load and store through raw pointers whose bounds are argued at each
//! use.

use core::arch::x86_64::{
    __m128i, __m512i, _mm512_castsi512_si128, _mm512_clmulepi64_epi128, _mm512_extracti32x4_epi32,
    _mm512_set_epi64, _mm512_storeu_si512, _mm512_ternarylogic_epi64, _mm512_xor_si512,
    _mm_clmulepi64_si128, _mm_crc32_u64, _mm_cvtsi128_si64, _mm_extract_epi64, _mm_prefetch,
    _mm_set_epi64x, _mm_xor_si128, _MM_HINT_T0,
};
use core::mem::MaybeUninit;

use crate::gf2::xpow;

/// 512-bit accumulators in flight: a fold is a multiply then an XOR, and with fewer the loop
/// waits on that latency; more gained nothing (docs/performance-notes.md).
const ACC: usize = 8;
/// How far ahead of the loads cache lines are prefetched, in bytes: for data coming from L3 or
/// DRAM (a RAM LUN's pages, a receive buffer already pushed out of L2), where the hardware
/// prefetcher alone starts too late. 4 KiB ahead beat 1 KiB on cold copies; 8 KiB was too
/// noisy to tell (docs/performance-notes.md).
const PF: usize = 4096;
/// Bytes per main-loop step: one 64-byte block per accumulator.
const STEP: usize = 64 * ACC;

/// Shortest input of [`update`] and [`copy_update`] (at least one main-loop step).
const MIN_LEN: usize = super::FOLD_MIN_LEN;
const _: () = assert!(MIN_LEN >= STEP);

/// The pair of constants that moves a 128-bit piece forward by `bits`: (for the high-order
/// lane, for the low-order lane), each in the lane's top 32 bits.
pub(super) const fn fold_constants(bits: u64) -> (u64, u64) {
    (
        (xpow(64 + bits - 1) as u64) << 32,
        (xpow(bits - 1) as u64) << 32,
    )
}

const K_STEP: (u64, u64) = fold_constants(8 * STEP as u64);
const K_512: (u64, u64) = fold_constants(512);
const K_384: (u64, u64) = fold_constants(384);
const K_256: (u64, u64) = fold_constants(256);
const K_128: (u64, u64) = fold_constants(128);

/// Whether this CPU can run the folding path.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
        && std::arch::is_x86_feature_detected!("pclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.2")
}

/// `k` for every 128-bit lane of a 512-bit register.
#[inline]
#[target_feature(enable = "avx512f")]
fn broadcast(k: (u64, u64)) -> __m512i {
    let (hi, lo) = (k.0 as i64, k.1 as i64);
    _mm512_set_epi64(lo, hi, lo, hi, lo, hi, lo, hi)
}

/// `acc` moved forward by the distance `k` was made for, XORed onto `next`.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold512(acc: __m512i, k: __m512i, next: __m512i) -> __m512i {
    let high = _mm512_clmulepi64_epi128(acc, k, 0x00);
    let low = _mm512_clmulepi64_epi128(acc, k, 0x11);
    // 0x96: a ^ b ^ c.
    _mm512_ternarylogic_epi64(high, low, next, 0x96)
}

/// `acc` moved forward by the distance `k` was made for.
#[inline]
#[target_feature(enable = "sse2,pclmulqdq")]
pub(super) fn fold128(acc: __m128i, k: (u64, u64)) -> __m128i {
    let k = _mm_set_epi64x(k.1 as i64, k.0 as i64);
    _mm_xor_si128(
        _mm_clmulepi64_si128(acc, k, 0x00),
        _mm_clmulepi64_si128(acc, k, 0x11),
    )
}

/// The raw register after the 128 bits of `x` (which already carry the incoming register).
#[inline]
#[target_feature(enable = "sse4.2,sse4.1")]
pub(super) fn reduce128(x: __m128i) -> u32 {
    let first = _mm_cvtsi128_si64(x) as u64;
    let second = _mm_extract_epi64(x, 1) as u64;
    _mm_crc32_u64(_mm_crc32_u64(0, first), second) as u32
}

/// 64 bytes at `p` in one load the compiler cannot repeat or split (inline assembly is opaque
/// to it): the value stored in a copy and the value folded into the CRC are the same bytes even
/// while another thread rewrites the source. With an intrinsic load the compiler may read the
/// block again as a memory operand of the fold, and a copy then disagreed with its CRC (the
/// digest test that rewrites the source failed at once on an AVX-512 machine).
///
/// # Safety
/// `p..p + 64` must be readable; AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_once(p: *const u8) -> __m512i {
    let v: __m512i;
    // SAFETY: the caller guarantees 64 readable bytes at `p`; vmovdqu64 takes any alignment
    // and touches no other memory, stack or flags.
    unsafe {
        core::arch::asm!(
            "vmovdqu64 {v}, [{p}]",
            v = out(zmm_reg) v,
            p = in(reg) p,
            options(nostack, preserves_flags, readonly, pure)
        )
    };
    v
}

/// Folds the whole 64-byte blocks of `data` (at least `MIN_LEN` bytes) starting from raw
/// register `reg`; returns the raw register after them and how many bytes that was. With an
/// output pointer (valid for `data.len()` bytes, not overlapping `data`), every block read is
/// also stored there, so the copy costs one store per 64 bytes.
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
unsafe fn fold(reg: u32, data: &[u8], out: Option<*mut u8>) -> (u32, usize) {
    assert!(data.len() >= MIN_LEN);
    let src = data.as_ptr();
    let steps = data.len() / STEP;
    let blocks = data.len() / 64;
    // Block `b` is bytes 64*b..64*b+64; only b < blocks is ever named, so every access is
    // inside `data` (and inside the output, which the caller made as long).
    macro_rules! block {
        ($b:expr) => {{
            let b: usize = $b;
            debug_assert!(b < blocks);
            // SAFETY: b < blocks = data.len() / 64, so the 64 bytes are inside `data`.
            let v = unsafe { load_once(src.add(64 * b)) };
            if let Some(o) = out {
                // SAFETY: the output is valid for data.len() bytes and does not overlap it.
                unsafe { _mm512_storeu_si512(o.add(64 * b).cast(), v) };
            }
            v
        }};
    }
    // The incoming register is XORed into the first 32 bits, as `crc32` would.
    let mut acc: [__m512i; ACC] = core::array::from_fn(|i| block!(i));
    acc[0] = _mm512_xor_si512(
        acc[0],
        _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, i64::from(reg)),
    );
    let k_step = broadcast(K_STEP);
    for step in 1..steps {
        for line in 0..ACC {
            // A prefetch never faults; `wrapping_add` keeps the address defined past the end.
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(64 * (ACC * step + line) + PF).cast());
        }
        for (i, a) in acc.iter_mut().enumerate() {
            *a = fold512(*a, k_step, block!(ACC * step + i));
        }
    }
    let k512 = broadcast(K_512);
    let mut one = acc[0];
    for a in &acc[1..] {
        one = fold512(one, k512, *a);
    }
    for b in ACC * steps..blocks {
        one = fold512(one, k512, block!(b));
    }
    let x = _mm_xor_si128(
        _mm_xor_si128(
            fold128(_mm512_castsi512_si128(one), K_384),
            fold128(_mm512_extracti32x4_epi32(one, 1), K_256),
        ),
        _mm_xor_si128(
            fold128(_mm512_extracti32x4_epi32(one, 2), K_128),
            _mm512_extracti32x4_epi32(one, 3),
        ),
    );
    (reduce128(x), 64 * blocks)
}

/// The raw register after `data`, from raw register `reg`. `data.len() >= MIN_LEN`.
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
pub(super) unsafe fn update(reg: u32, data: &[u8]) -> u32 {
    // SAFETY: the caller checked the features; `fold` only reads `data`.
    let (reg, done) = unsafe { fold(reg, data, None) };
    // SAFETY: the same features include SSE4.2.
    unsafe { super::x86::update_1way(reg, &data[done..]) }
}

/// Copies `src` into `dst` (every byte written) and returns the raw register after `src`.
/// `dst.len() == src.len() >= MIN_LEN`.
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2,sse4.1")]
pub(super) unsafe fn copy_update(reg: u32, dst: &mut [MaybeUninit<u8>], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len());
    let out = dst.as_mut_ptr().cast::<u8>();
    // SAFETY: the caller checked the features; `out` is valid for src.len() bytes (dst has
    // that length) and does not overlap `src` (dst is borrowed exclusively). `fold` stores
    // exactly the whole 64-byte blocks it reads: dst[..done].
    let (reg, done) = unsafe { fold(reg, src, Some(out)) };
    let tail = &mut dst[done..];
    // SAFETY: the same features include SSE4.2.
    unsafe { super::x86::copy_update_1way(reg, tail, &src[done..]) }
}
