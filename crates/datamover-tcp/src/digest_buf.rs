//! Read buffers the iSCSI/TCP target datamover lends when it sends data digests: the
//! backend's copy into them computes the CRC32C of every Data-In payload in the same pass
//! (never-written ranges by arithmetic), so sending only appends the padding. Bytes the
//! kernel already copied (file and block backends) are taken over and get one CRC pass.

use bytes::{Bytes, BytesMut};
use datamover::FfpConfig;
use digest::{SegmentCrcs, SegmentedCopy};
use std::sync::Arc;
use storage::{BufNote, ReadBuf, ReadBufSource};

/// Lends [`DigestReadBuf`]s cut at this connection's Data-In payload length.
#[derive(Debug)]
pub struct DigestBuffers {
    seg_len: u32,
}

impl DigestBuffers {
    /// Some when the connection sends data digests and cuts Data-In at a fixed length: at
    /// MaxSendDataSegmentLength within each MaxBurstLength burst, fixed pieces exactly when
    /// the burst is a whole number of segments.
    pub fn for_connection(cfg: &FfpConfig) -> Option<DigestBuffers> {
        let seg = cfg.max_send_data_segment_length;
        (cfg.digests.data && seg > 0 && cfg.max_burst_length.is_multiple_of(seg))
            .then_some(DigestBuffers { seg_len: seg })
    }
}

impl ReadBufSource for DigestBuffers {
    fn lend(&self, len: usize) -> Box<dyn ReadBuf> {
        Box::new(DigestReadBuf {
            buf: BytesMut::with_capacity(len),
            taken: None,
            copier: SegmentedCopy::new(self.seg_len),
            seg_len: self.seg_len,
        })
    }
}

/// A read buffer whose filling computes the CRC of every `seg_len` piece; its note is
/// [`BufNote::SegmentCrcs`].
pub struct DigestReadBuf {
    buf: BytesMut,
    /// Bytes taken over whole (the kernel's copy), before anything else was put.
    taken: Option<Bytes>,
    copier: SegmentedCopy,
    seg_len: u32,
}

impl DigestReadBuf {
    /// Bytes taken over are copied after all when more follows (rare: one read, one call).
    fn materialize(&mut self) {
        if let Some(t) = self.taken.take() {
            self.copier.extend(&mut self.buf, &t);
        }
    }
}

impl ReadBuf for DigestReadBuf {
    fn put(&mut self, src: &[u8]) {
        self.materialize();
        self.copier.extend(&mut self.buf, src);
    }

    fn put_zeros(&mut self, n: usize) {
        self.materialize();
        self.copier.extend_zeros(&mut self.buf, n);
    }

    fn put_bytes(&mut self, data: Bytes) {
        if self.buf.is_empty() && self.taken.is_none() {
            self.taken = Some(data);
        } else {
            self.put(&data);
        }
    }

    fn len(&self) -> usize {
        self.buf.len() + self.taken.as_ref().map_or(0, Bytes::len)
    }

    fn finish(self: Box<Self>) -> (Bytes, Option<BufNote>) {
        let (data, crcs) = match self.taken {
            Some(t) if self.buf.is_empty() => {
                let crcs = SegmentCrcs::of(&t, self.seg_len);
                (t, crcs)
            }
            _ => {
                let mut me = *self;
                me.materialize();
                (me.buf.freeze(), me.copier.finish())
            }
        };
        (data, Some(BufNote::SegmentCrcs(Arc::new(crcs))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lender(seg: u32) -> DigestBuffers {
        DigestBuffers { seg_len: seg }
    }

    fn crcs_note(crcs: SegmentCrcs) -> Option<BufNote> {
        Some(BufNote::SegmentCrcs(Arc::new(crcs)))
    }

    #[test]
    fn crcs_of_what_was_put_equal_a_separate_pass() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        // Copied pieces and zero runs, in any mix; and bytes taken over whole.
        let mut b = lender(4096).lend(src.len() + 5000);
        b.put(&src[..1234]);
        b.put_zeros(5000);
        b.put(&src[1234..]);
        let mut want = src[..1234].to_vec();
        want.extend_from_slice(&[0; 5000]);
        want.extend_from_slice(&src[1234..]);
        let (data, note) = b.finish();
        assert_eq!(&data[..], &want[..]);
        assert_eq!(note, crcs_note(SegmentCrcs::of(&want, 4096)));

        let mut b = lender(1000).lend(src.len());
        b.put_bytes(Bytes::from(src.clone()));
        assert_eq!(b.len(), src.len());
        let (data, note) = b.finish();
        assert_eq!(&data[..], &src[..]);
        assert_eq!(note, crcs_note(SegmentCrcs::of(&src, 1000)));

        let mut b = lender(1000).lend(src.len() + 10);
        b.put_bytes(Bytes::from(src.clone()));
        b.put(&[1; 10]);
        let (data, note) = b.finish();
        assert_eq!(data.len(), src.len() + 10);
        assert_eq!(note, crcs_note(SegmentCrcs::of(&data, 1000)));
    }
}
