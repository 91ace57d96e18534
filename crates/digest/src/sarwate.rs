//! Sarwate's byte-at-a-time table algorithm: one 256-entry table lookup per byte. The reference
//! every faster path is checked against, and the baseline of the benchmark.

use crate::gf2::POLY;

/// `TABLE[b]` is the register contribution of byte `b` shifted through eight bit steps.
pub(crate) const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut reg = i as u32;
        let mut bit = 0;
        while bit < 8 {
            reg = if reg & 1 != 0 {
                (reg >> 1) ^ POLY
            } else {
                reg >> 1
            };
            bit += 1;
        }
        table[i] = reg;
        i += 1;
    }
    table
};

/// Advances the raw (not inverted) register over `data`.
#[inline]
pub(crate) fn update(mut reg: u32, data: &[u8]) -> u32 {
    for &b in data {
        reg = (reg >> 8) ^ TABLE[((reg ^ u32::from(b)) & 0xff) as usize];
    }
    reg
}

/// The CRC32C of `previous || data`, given `crc` = the CRC32C of `previous` (0 for none).
pub fn append(crc: u32, data: &[u8]) -> u32 {
    !update(!crc, data)
}

/// Copies `src` into `dst` byte by byte and returns `append(crc, src)`.
/// Panics if the lengths differ.
pub fn copy_append(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy_append: dst and src lengths differ"
    );
    let mut reg = !crc;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s;
        reg = (reg >> 8) ^ TABLE[((reg ^ u32::from(s)) & 0xff) as usize];
    }
    !reg
}
