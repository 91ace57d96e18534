//! CRC32C (Castagnoli) as MPA uses it: initial value all ones, reflected, final complement, sent
//! little-endian in the FPDU's 4-byte CRC field (as Linux siw does). The arithmetic is the
//! project's `digest` engine; this module only gives it the shape the FPDU code wants (chained
//! updates, wire bytes) and the fused copy for the paths that copy payload anyway.

pub use digest::Shift;

/// Streaming CRC32C.
#[derive(Clone, Copy, Debug, Default)]
pub struct Crc32c(digest::Crc32c);

impl Crc32c {
    pub fn new() -> Self {
        Crc32c(digest::Crc32c::new())
    }
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        self.0.update(data);
        self
    }
    /// Copies `src` into `dst` (same length) and adds `src` to the CRC in the same pass.
    pub fn update_copy(&mut self, dst: &mut [u8], src: &[u8]) -> &mut Self {
        self.0.update_copy(dst, src);
        self
    }
    /// Appends `src` to `buf` and adds it to the CRC in the same pass (no zeroing first).
    pub fn update_append(&mut self, buf: &mut Vec<u8>, src: &[u8]) -> &mut Self {
        self.0.update_append(buf, src);
        self
    }
    /// Adds a block of `shift.len()` bytes by its own CRC32C, without reading it.
    pub fn update_block_crc(&mut self, block_crc: u32, shift: &Shift) -> &mut Self {
        self.0.update_block_crc(block_crc, shift);
        self
    }
    /// The finished CRC value.
    pub fn finalize(&self) -> u32 {
        self.0.finalize()
    }
    /// The 4 bytes MPA puts on the wire for this CRC.
    pub fn wire_bytes(&self) -> [u8; 4] {
        digest::to_wire(self.finalize())
    }
}

/// One-shot CRC32C.
pub fn crc32c(data: &[u8]) -> u32 {
    digest::crc32c(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 B.4 test vectors.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(
            Crc32c::new().update(b"123456789").wire_bytes(),
            [0x83, 0x92, 0x06, 0xE3]
        );
    }

    proptest! {
        #[test]
        fn streaming_and_fused_copy_equal_one_shot(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
            cut in 0usize..3000,
        ) {
            let cut = cut.min(data.len());
            let mut c = Crc32c::new();
            let mut copy = vec![0u8; data.len() - cut];
            c.update(&data[..cut]).update_copy(&mut copy, &data[cut..]);
            prop_assert_eq!(c.finalize(), crc32c(&data));
            prop_assert_eq!(&copy[..], &data[cut..]);
        }

        #[test]
        fn blocks_fed_by_their_crcs_equal_one_shot(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            head in 0usize..300,
        ) {
            const BLOCK: usize = 64;
            let shift = Shift::bytes(BLOCK);
            let head = head.min(data.len());
            let blocks = (data.len() - head) / BLOCK;
            let tail = head + blocks * BLOCK;
            let mut c = Crc32c::new();
            c.update(&data[..head]);
            for b in data[head..tail].chunks(BLOCK) {
                c.update_block_crc(crc32c(b), &shift);
            }
            c.update(&data[tail..]);
            prop_assert_eq!(c.finalize(), crc32c(&data));
        }
    }
}
