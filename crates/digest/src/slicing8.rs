//! Slicing-by-8: eight 256-entry tables let one step consume eight bytes with eight independent
//! lookups. The portable path, used wherever the CPU has no CRC32C instruction.

use crate::sarwate;

/// `TABLES[k][b]`: byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = {
    let mut tables = [[0u32; 256]; 8];
    tables[0] = sarwate::TABLE;
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev >> 8) ^ sarwate::TABLE[(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
};

/// One eight-byte step: `word` is the next eight input bytes read little-endian.
#[inline(always)]
fn step(reg: u32, word: u64) -> u32 {
    let t = &TABLES;
    let lo = reg ^ word as u32;
    let hi = (word >> 32) as u32;
    t[7][(lo & 0xff) as usize]
        ^ t[6][((lo >> 8) & 0xff) as usize]
        ^ t[5][((lo >> 16) & 0xff) as usize]
        ^ t[4][(lo >> 24) as usize]
        ^ t[3][(hi & 0xff) as usize]
        ^ t[2][((hi >> 8) & 0xff) as usize]
        ^ t[1][((hi >> 16) & 0xff) as usize]
        ^ t[0][(hi >> 24) as usize]
}

/// Advances the raw (not inverted) register over `data`.
pub(crate) fn update(mut reg: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        reg = step(reg, u64::from_le_bytes(w.try_into().expect("8-byte chunk")));
    }
    sarwate::update(reg, words.remainder())
}

/// The CRC32C of `previous || data`, given `crc` = the CRC32C of `previous` (0 for none).
pub fn append(crc: u32, data: &[u8]) -> u32 {
    !update(!crc, data)
}

/// Copies `src` into `dst` eight bytes at a time while computing `append(crc, src)` from the same
/// loads. Panics if the lengths differ.
pub fn copy_append(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_append: dst and src lengths differ"
    );
    let mut reg = !crc;
    let mut src_words = src.chunks_exact(8);
    let mut dst_words = dst.chunks_exact_mut(8);
    for (d, s) in (&mut dst_words).zip(&mut src_words) {
        let word = u64::from_le_bytes(s.try_into().expect("8-byte chunk"));
        d.copy_from_slice(&word.to_le_bytes());
        reg = step(reg, word);
    }
    let tail = src_words.remainder();
    dst_words.into_remainder().copy_from_slice(tail);
    !sarwate::update(reg, tail)
}
