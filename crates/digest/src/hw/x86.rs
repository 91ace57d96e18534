//! x86-64: SSE4.2 `crc32` in three streams, joined with PCLMULQDQ.
//!
//! These are `unsafe fn`s only because of `#[target_feature]`: callers must have checked the
//! features. All memory access goes through safe slices.

use core::arch::x86_64::{
    _mm_clmulepi64_si128, _mm_crc32_u64, _mm_crc32_u8, _mm_cvtsi128_si64, _mm_cvtsi32_si128,
};

use crate::gf2::{multmodp, xpow};

/// Largest block per stream, in bytes; longer buffers are done as several three-block rounds.
const MAX_STREAM: usize = 8192;
/// Below this length the combine step costs more than the parallelism saves.
const MIN_3WAY: usize = 192;

/// `SHIFT_K[w] = x^(64*w - 33) mod P`. A carry-less product of a register with it, reduced by
/// `crc32` of the 64-bit product (which multiplies by x^33), moves the register past `w` 8-byte
/// words: `reg * x^(64*w)`.
static SHIFT_K: [u32; 2 * MAX_STREAM / 8 + 1] = {
    let mut k = [0u32; 2 * MAX_STREAM / 8 + 1];
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
unsafe fn shift_words(reg: u32, words: usize) -> u32 {
    let k = _mm_cvtsi32_si128(SHIFT_K[words] as i32);
    let product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(reg as i32), k, 0x00);
    _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
}

#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8-byte chunk"))
}

/// Per-stream block length for `remaining` bytes: a multiple of 8, at most `MAX_STREAM`.
#[inline(always)]
fn block_len(remaining: usize) -> usize {
    (remaining / 24 * 8).min(MAX_STREAM)
}

/// One stream over the raw register.
#[target_feature(enable = "sse4.2")]
pub(super) unsafe fn update_1way(reg: u32, data: &[u8]) -> u32 {
    let mut c = u64::from(reg);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, word(w));
    }
    let mut r = c as u32;
    for &b in words.remainder() {
        r = _mm_crc32_u8(r, b);
    }
    r
}

/// Three streams over the raw register.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn update_3way(mut reg: u32, mut data: &[u8]) -> u32 {
    while data.len() >= MIN_3WAY {
        let len = block_len(data.len());
        let (a, rest) = data.split_at(len);
        let (b, rest) = rest.split_at(len);
        let (c, rest) = rest.split_at(len);
        let (mut ca, mut cb, mut cc) = (u64::from(reg), 0u64, 0u64);
        for ((wa, wb), wc) in a
            .chunks_exact(8)
            .zip(b.chunks_exact(8))
            .zip(c.chunks_exact(8))
        {
            ca = _mm_crc32_u64(ca, word(wa));
            cb = _mm_crc32_u64(cb, word(wb));
            cc = _mm_crc32_u64(cc, word(wc));
        }
        // reg(a||b||c) = reg(a)*x^(8*2len) + reg0(b)*x^(8*len) + reg0(c)
        let words = len / 8;
        reg = shift_words(ca as u32, 2 * words) ^ shift_words(cb as u32, words) ^ cc as u32;
        data = rest;
    }
    update_1way(reg, data)
}

/// One stream, copying each word to `dst` as it is read. `dst.len() == src.len()`.
#[target_feature(enable = "sse4.2")]
unsafe fn copy_update_1way(reg: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    let mut c = u64::from(reg);
    let mut src_words = src.chunks_exact(8);
    let mut dst_words = dst.chunks_exact_mut(8);
    for (d, s) in (&mut dst_words).zip(&mut src_words) {
        let w = word(s);
        d.copy_from_slice(&w.to_le_bytes());
        c = _mm_crc32_u64(c, w);
    }
    let tail = src_words.remainder();
    dst_words.into_remainder().copy_from_slice(tail);
    let mut r = c as u32;
    for &b in tail {
        r = _mm_crc32_u8(r, b);
    }
    r
}

/// Three streams, copying each word to `dst` as it is read. `dst.len() == src.len()`.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn copy_update_3way(mut reg: u32, mut dst: &mut [u8], mut src: &[u8]) -> u32 {
    debug_assert_eq!(dst.len(), src.len());
    while src.len() >= MIN_3WAY {
        let len = block_len(src.len());
        let (sa, rest) = src.split_at(len);
        let (sb, rest) = rest.split_at(len);
        let (sc, rest) = rest.split_at(len);
        let (da, drest) = core::mem::take(&mut dst).split_at_mut(len);
        let (db, drest) = drest.split_at_mut(len);
        let (dc, drest) = drest.split_at_mut(len);
        let (mut ca, mut cb, mut cc) = (u64::from(reg), 0u64, 0u64);
        let streams = da
            .chunks_exact_mut(8)
            .zip(db.chunks_exact_mut(8))
            .zip(dc.chunks_exact_mut(8))
            .zip(
                sa.chunks_exact(8)
                    .zip(sb.chunks_exact(8))
                    .zip(sc.chunks_exact(8)),
            );
        for (((xa, xb), xc), ((wa, wb), wc)) in streams {
            let (va, vb, vc) = (word(wa), word(wb), word(wc));
            xa.copy_from_slice(&va.to_le_bytes());
            xb.copy_from_slice(&vb.to_le_bytes());
            xc.copy_from_slice(&vc.to_le_bytes());
            ca = _mm_crc32_u64(ca, va);
            cb = _mm_crc32_u64(cb, vb);
            cc = _mm_crc32_u64(cc, vc);
        }
        let words = len / 8;
        reg = shift_words(ca as u32, 2 * words) ^ shift_words(cb as u32, words) ^ cc as u32;
        src = rest;
        dst = drest;
    }
    copy_update_1way(reg, dst, src)
}
