//! x86-64: SSE4.2 `crc32` in several interleaved streams, joined with PCLMULQDQ.
//!
//! One `crc32` has a latency of 3 cycles but a throughput of one (or, on recent cores, two) per
//! cycle, so a buffer is cut into `N` equal blocks whose CRCs run as independent dependency
//! chains; the registers are then joined by multiplying each by `x^(8 * bytes after it)`.
//!
//! These are `unsafe fn`s because of `#[target_feature]` (callers must have checked the CPU) and
//! because the inner loops read and write through raw pointers whose bounds are argued at each
//! use.

use core::arch::x86_64::{
    __m128i, _mm_clmulepi64_si128, _mm_crc32_u64, _mm_crc32_u8, _mm_cvtsi128_si64,
    _mm_cvtsi32_si128, _mm_extract_epi64, _mm_prefetch, _mm_storeu_si128, _MM_HINT_T0,
};

use core::mem::MaybeUninit;

use crate::gf2::{multmodp, xpow};

/// The most streams any caller may ask for.
const MAX_STREAMS: usize = 8;
/// Largest block per stream, in bytes; longer buffers are done as several rounds.
const MAX_STREAM: usize = 4096;
/// Smallest block per stream: below this the join costs more than the parallelism saves.
const MIN_STREAM: usize = 32;

/// `SHIFT_K[w] = x^(64*w - 33) mod P`. A carry-less product of a register with it, reduced by
/// `crc32` of the 64-bit product (which multiplies by x^33), moves the register past `w` 8-byte
/// words: `reg * x^(64*w)`.
static SHIFT_K: [u32; (MAX_STREAMS - 1) * MAX_STREAM / 8 + 1] = {
    let mut k = [0u32; (MAX_STREAMS - 1) * MAX_STREAM / 8 + 1];
    let x64 = xpow(64);
    k[1] = xpow(31);
    let mut w = 2;
    while w < k.len() {
        k[w] = multmodp(k[w - 1], x64);
        w += 1;
    }
    k
};

#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn shift_words(reg: u32, words: usize) -> u32 {
    let k = _mm_cvtsi32_si128(SHIFT_K[words] as i32);
    let product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(reg as i32), k, 0x00);
    _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
}

/// Joins `N` stream registers of `words` 8-byte words each; stream 0 carried the incoming
/// register, the others started from zero.
#[inline]
#[target_feature(enable = "sse4.2,pclmulqdq")]
unsafe fn join<const N: usize>(crc: &[u64; N], words: usize) -> u32 {
    let mut reg = crc[N - 1] as u32;
    for (s, &c) in crc[..N - 1].iter().enumerate() {
        reg ^= shift_words(c as u32, (N - 1 - s) * words);
    }
    reg
}

/// Reads 8 bytes at `p` as the little-endian word `crc32` consumes.
///
/// Callers guarantee `p..p+8` lies inside one live slice.
#[inline(always)]
pub(super) unsafe fn load_word(p: *const u8) -> u64 {
    u64::from_le(p.cast::<u64>().read_unaligned())
}

/// 16 bytes at `p` in one load the compiler cannot repeat or split (inline assembly is
/// opaque to it), so every use of the value sees the same bytes.
///
/// # Safety
/// `p..p + 16` must be readable; SSE2 (every x86_64).
#[inline(always)]
unsafe fn load_once(p: *const u8) -> __m128i {
    let v: __m128i;
    // SAFETY: the caller guarantees 16 readable bytes at `p`; movdqu takes any alignment and
    // touches no other memory, stack or flags.
    unsafe {
        core::arch::asm!(
            "movdqu {v}, [{p}]",
            v = out(xmm_reg) v,
            p = in(reg) p,
            options(nostack, preserves_flags, readonly, pure)
        )
    };
    v
}

/// How far ahead of each stream's reads its cache lines are prefetched, in bytes.
const PREFETCH_AHEAD: usize = 1024;

/// Asks for the cache line `PREFETCH_AHEAD` bytes past position `i` of every stream. Data
/// coming from DRAM is otherwise fetched too late: the hardware prefetchers follow the `N`
/// interleaved streams less eagerly than one `memcpy`, and the CRC stalls on memory.
#[inline(always)]
unsafe fn prefetch_streams<const N: usize>(base: *const u8, len: usize, i: usize) {
    for s in 0..N {
        // A prefetch never faults, and `wrapping_add` keeps the address computation defined
        // when it points past the buffer (near its end).
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(s * len + i + PREFETCH_AHEAD).cast());
    }
}

/// One stream over the raw register.
#[target_feature(enable = "sse4.2")]
pub(super) unsafe fn update_1way(reg: u32, data: &[u8]) -> u32 {
    let mut c = u64::from(reg);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, u64::from_le_bytes(w.try_into().expect("8-byte chunk")));
    }
    let mut r = c as u32;
    for &b in words.remainder() {
        r = _mm_crc32_u8(r, b);
    }
    r
}

/// `N` streams over the raw register (`2 <= N <= MAX_STREAMS`).
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn update_nway<const N: usize>(mut reg: u32, mut data: &[u8]) -> u32 {
    assert!((2..=MAX_STREAMS).contains(&N));
    while data.len() >= N * MIN_STREAM {
        let len = (data.len() / (8 * N) * 8).min(MAX_STREAM);
        let base = data.as_ptr();
        let mut crc = [0u64; N];
        crc[0] = u64::from(reg);
        let mut i = 0;
        while i < len {
            if i % 64 == 0 {
                prefetch_streams::<N>(base, len, i);
            }
            for (s, c) in crc.iter_mut().enumerate() {
                // SAFETY: i + 8 <= len and s < N, so the 8 bytes end at most at N*len <=
                // data.len(): inside `data`.
                *c = _mm_crc32_u64(*c, load_word(base.add(s * len + i)));
            }
            i += 8;
        }
        reg = join::<N>(&crc, len / 8);
        data = &data[N * len..];
    }
    update_1way(reg, data)
}

/// One stream, copying each word to `dst` as it is read; every byte of `dst` is written, so
/// it may start uninitialized. `dst.len() == src.len()`.
#[target_feature(enable = "sse4.2")]
pub(super) unsafe fn copy_update_1way(reg: u32, dst: &mut [MaybeUninit<u8>], src: &[u8]) -> u32 {
    let mut c = u64::from(reg);
    let mut src_words = src.chunks_exact(8);
    let mut dst_words = dst.chunks_exact_mut(8);
    for (d, s) in (&mut dst_words).zip(&mut src_words) {
        let w = u64::from_le_bytes(s.try_into().expect("8-byte chunk"));
        for (x, y) in d.iter_mut().zip(w.to_le_bytes()) {
            x.write(y);
        }
        c = _mm_crc32_u64(c, w);
    }
    let tail = src_words.remainder();
    let mut r = c as u32;
    for (d, &b) in dst_words.into_remainder().iter_mut().zip(tail) {
        d.write(b);
        r = _mm_crc32_u8(r, b);
    }
    r
}

/// `N` streams, each copying 16 bytes as two words that go through `crc32` as they are
/// stored; every byte of `dst` is written. `dst.len() == src.len()`, `2 <= N <= MAX_STREAMS`.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn copy_update_nway<const N: usize>(
    mut reg: u32,
    mut dst: &mut [MaybeUninit<u8>],
    mut src: &[u8],
) -> u32 {
    assert_eq!(dst.len(), src.len());
    assert!((2..=MAX_STREAMS).contains(&N));
    while src.len() >= N * MIN_STREAM {
        let len = (src.len() / (16 * N) * 16).min(MAX_STREAM);
        let (from, to) = (src.as_ptr(), dst.as_mut_ptr().cast::<u8>());
        let mut crc = [0u64; N];
        crc[0] = u64::from(reg);
        let mut i = 0;
        while i < len {
            if i % 64 == 0 {
                prefetch_streams::<N>(from, len, i);
            }
            for (s, c) in crc.iter_mut().enumerate() {
                let at = s * len + i;
                // SAFETY: i + 16 <= len and s < N, so bytes at..at+16 end at most at N*len <=
                // src.len() == dst.len(): inside both slices, which do not overlap (one is
                // borrowed shared, the other exclusively).
                // Loaded once, then stored and fed to the CRC: a source another thread writes
                // meanwhile (a LUN image under an overlapping WRITE) still gives a copy its
                // CRC covers. The load is opaque to the compiler, which would otherwise load
                // the lanes it extracts from the source a second time.
                let v = load_once(from.add(at));
                _mm_storeu_si128(to.add(at).cast::<__m128i>(), v);
                *c = _mm_crc32_u64(*c, _mm_cvtsi128_si64(v) as u64);
                *c = _mm_crc32_u64(*c, _mm_extract_epi64::<1>(v) as u64);
            }
            i += 16;
        }
        reg = join::<N>(&crc, len / 8);
        src = &src[N * len..];
        dst = &mut core::mem::take(&mut dst)[N * len..];
    }
    copy_update_1way(reg, dst, src)
}
