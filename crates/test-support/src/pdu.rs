//! iSCSI PDUs laid out byte by byte from RFC 7143's layouts (not with the project's codec),
//! so that what tests and fuzz targets send checks the target against the standard rather
//! than against our own encoder.

use std::collections::HashMap;

/// The big-endian u32 at the start of `b`.
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

/// Writes `v` big-endian at byte `at` of a BHS.
pub fn put32(b: &mut [u8; 48], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// A BHS with opcode, flags byte, data segment length, ITT; the rest zero.
pub fn bhs(opcode: u8, flags: u8, data_len: usize, itt: u32) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[0] = opcode;
    b[1] = flags;
    b[5..8].copy_from_slice(&(data_len as u32).to_be_bytes()[1..]);
    b[16..20].copy_from_slice(&itt.to_be_bytes());
    b
}

/// `key=value` pairs, each ended by a NUL, as a text or login data segment carries them.
pub fn key_values(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// The keys of a text or login data segment.
pub fn parse_keys(data: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(data)
        .split('\0')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// CRC32C by the reference byte-table implementation, not the hardware path the target uses.
pub fn crc32c(bytes: &[u8]) -> u32 {
    digest::sarwate::append(0, bytes)
}

/// The CDB of READ(10) of `blocks` at `lba`.
pub fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// The CDB of WRITE(10) of `blocks` at `lba`.
pub fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

/// Bytes that differ per position and per seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}
