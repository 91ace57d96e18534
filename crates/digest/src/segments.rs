//! Per-segment CRCs of one buffer: the data digests of a Data-In sequence, where every PDU's
//! data segment has its own CRC32C. A producer that copies the data anyway (a RAM backend
//! gathering chunks) computes them during that copy with [`SegmentedCopy`] (never-written
//! ranges by arithmetic, without reading their zeros); the sender then only appends the
//! padding.

use bytes::BytesMut;

use crate::Crc32c;

/// The CRC32C of every `seg_len`-byte piece of a buffer, in order (the last piece may be
/// shorter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentCrcs {
    pub seg_len: u32,
    pub crcs: Vec<u32>,
}

impl SegmentCrcs {
    /// Computes the CRCs of `data` cut into `seg_len` pieces (a separate pass).
    ///
    /// # Panics
    /// If `seg_len` is 0.
    pub fn of(data: &[u8], seg_len: u32) -> SegmentCrcs {
        assert!(seg_len > 0, "segment length 0");
        SegmentCrcs {
            seg_len,
            crcs: data.chunks(seg_len as usize).map(crate::crc32c).collect(),
        }
    }

    /// The CRC of the piece at byte `offset` with `len` bytes of a `total`-byte buffer, if
    /// it is one of the pieces (a cut at another length, even one that only shortens the
    /// last piece, gets `None`).
    pub fn get(&self, offset: u32, len: u32, total: u32) -> Option<u32> {
        if !offset.is_multiple_of(self.seg_len) || offset >= total {
            return None;
        }
        if len != self.seg_len.min(total - offset) {
            return None;
        }
        let i = (offset / self.seg_len) as usize;
        self.crcs.get(i).copied()
    }
}

/// Appends to a destination buffer from several sources, front to back, computing the CRC of
/// each `seg_len` piece of the destination in the same pass as the copy.
#[derive(Debug)]
pub struct SegmentedCopy {
    seg_len: usize,
    /// Bytes of the current piece fed so far.
    in_seg: usize,
    crc: Crc32c,
    crcs: Vec<u32>,
}

impl SegmentedCopy {
    /// # Panics
    /// If `seg_len` is 0.
    pub fn new(seg_len: u32) -> SegmentedCopy {
        assert!(seg_len > 0, "segment length 0");
        SegmentedCopy {
            seg_len: seg_len as usize,
            in_seg: 0,
            crc: Crc32c::new(),
            crcs: Vec::new(),
        }
    }

    /// Appends `src` to `buf` (which holds the destination so far; no zeroing of the new
    /// bytes) and feeds them, in one pass.
    pub fn extend(&mut self, buf: &mut BytesMut, src: &[u8]) {
        let mut at = 0;
        while at < src.len() {
            let n = (self.seg_len - self.in_seg).min(src.len() - at);
            self.crc.update_extend(buf, &src[at..at + n]);
            self.advance(n);
            at += n;
        }
    }

    /// Appends `n` zero bytes to `buf` (a never-written range) and feeds them; their CRC is
    /// computed without reading them.
    pub fn extend_zeros(&mut self, buf: &mut BytesMut, n: usize) {
        buf.resize(buf.len() + n, 0);
        let mut left = n;
        while left > 0 {
            let k = (self.seg_len - self.in_seg).min(left);
            self.crc.update_zeros(k as u64);
            self.advance(k);
            left -= k;
        }
    }

    fn advance(&mut self, n: usize) {
        self.in_seg += n;
        if self.in_seg == self.seg_len {
            self.crcs.push(self.crc.finalize());
            self.crc = Crc32c::new();
            self.in_seg = 0;
        }
    }

    pub fn finish(mut self) -> SegmentCrcs {
        if self.in_seg > 0 {
            self.crcs.push(self.crc.finalize());
        }
        SegmentCrcs {
            seg_len: self.seg_len as u32,
            crcs: self.crcs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Copying in arbitrary source pieces (and zero runs) gives the same bytes and the
        /// same per-segment CRCs as a separate pass over the result.
        #[test]
        fn segmented_copy_matches_a_separate_pass(
            data in proptest::collection::vec(any::<u8>(), 0..5000),
            cuts in proptest::collection::vec(1usize..700, 0..20),
            seg_len in 1u32..1500,
            zero_every in 0usize..4,
        ) {
            let mut expect = data.clone();
            let mut dst = BytesMut::new();
            let mut copier = SegmentedCopy::new(seg_len);
            let mut at = 0;
            for (i, c) in cuts.iter().chain(std::iter::once(&usize::MAX)).enumerate() {
                let n = (*c).min(data.len() - at);
                if zero_every > 0 && i % 4 == zero_every {
                    expect[at..at + n].fill(0);
                    copier.extend_zeros(&mut dst, n);
                } else {
                    copier.extend(&mut dst, &data[at..at + n]);
                }
                at += n;
                if at == data.len() { break; }
            }
            prop_assert_eq!(&dst[..], &expect[..]);
            prop_assert_eq!(copier.finish(), SegmentCrcs::of(&expect, seg_len));
        }
    }

    #[test]
    fn lookup_accepts_only_the_cut_it_was_made_for() {
        let data: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let s = SegmentCrcs::of(&data, 1000);
        assert_eq!(s.get(0, 1000, 2500), Some(crate::crc32c(&data[..1000])));
        assert_eq!(s.get(2000, 500, 2500), Some(crate::crc32c(&data[2000..])));
        assert_eq!(s.get(1000, 500, 2500), None, "a short piece in the middle");
        assert_eq!(s.get(500, 1000, 2500), None, "unaligned");
        assert_eq!(s.get(3000, 10, 2500), None, "past the end");
        assert_eq!(s.get(2000, 250, 2500), None, "the last piece cut shorter");
    }
}
