//! CRC32C (Castagnoli) as MPA uses it: initial value all ones, reflected, final complement, sent
//! little-endian in the FPDU's 4-byte CRC field (as Linux siw does).
//!
//! This is a small local table implementation kept private to the codec until the project's
//! `digest` crate (hardware CRC, slicing-by-8) is available to depend on.

const POLY_REFLECTED: u32 = 0x82F6_3B78;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ POLY_REFLECTED
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Streaming CRC32C.
#[derive(Clone, Copy, Debug)]
pub struct Crc32c(u32);

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    pub fn new() -> Self {
        Crc32c(!0)
    }
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        let mut c = self.0;
        for &b in data {
            c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
        }
        self.0 = c;
        self
    }
    /// The finished CRC value (complemented).
    pub fn finalize(&self) -> u32 {
        !self.0
    }
    /// The 4 bytes MPA puts on the wire for this CRC.
    pub fn wire_bytes(&self) -> [u8; 4] {
        self.finalize().to_le_bytes()
    }
}

/// One-shot CRC32C.
pub fn crc32c(data: &[u8]) -> u32 {
    Crc32c::new().update(data).finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 B.4 test vectors.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn streaming_equals_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut c = Crc32c::new();
        c.update(&data[..333]).update(&data[333..]);
        assert_eq!(c.finalize(), crc32c(&data));
    }
}
