//! Segmentation of read data into Data-In PDUs: each at most the initiator's
//! MaxRecvDataSegmentLength, grouped into sequences of at most MaxBurstLength whose last
//! PDU carries the F bit, with DataSN counting across the whole task.

/// One Data-In PDU's share of the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSegment {
    pub offset: u32,
    pub len: u32,
    pub data_sn: u32,
    /// Last PDU of a burst (or of the data): F bit.
    pub final_: bool,
    /// Last PDU of the whole transfer.
    pub last: bool,
}

/// Iterator over the Data-In segments of `total` bytes.
pub fn data_in_segments(
    total: u32,
    max_segment: u32,
    max_burst: u32,
) -> impl Iterator<Item = DataSegment> {
    let max_segment = max_segment.max(512);
    let max_burst = max_burst.max(512);
    let mut offset = 0u32;
    let mut burst_left = max_burst;
    let mut data_sn = 0u32;
    std::iter::from_fn(move || {
        if offset >= total {
            return None;
        }
        let len = (total - offset).min(max_segment).min(burst_left);
        let last = offset + len == total;
        burst_left -= len;
        let final_ = last || burst_left == 0;
        if burst_left == 0 {
            burst_left = max_burst;
        }
        let seg = DataSegment {
            offset,
            len,
            data_sn,
            final_,
            last,
        };
        offset += len;
        data_sn += 1;
        Some(seg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bursts_end_with_f() {
        let s: Vec<_> = data_in_segments(20000, 8192, 10000).collect();
        let shape: Vec<_> = s.iter().map(|d| (d.offset, d.len, d.final_)).collect();
        assert_eq!(
            shape,
            vec![
                (0, 8192, false),
                (8192, 1808, true),
                (10000, 8192, false),
                (18192, 1808, true)
            ]
        );
        assert!(s.last().unwrap().last);
        assert_eq!(data_in_segments(0, 8192, 8192).count(), 0);
    }

    proptest! {
        #[test]
        fn segments_tile_the_data(total in 0u32..5_000_000, seg in 512u32..300_000, burst in 512u32..1_000_000) {
            let mut next = 0;
            let mut in_burst = 0;
            for (i, d) in data_in_segments(total, seg, burst).enumerate() {
                prop_assert_eq!(d.offset, next);
                prop_assert_eq!(d.data_sn, i as u32);
                prop_assert!(d.len > 0 && d.len <= seg);
                in_burst += d.len;
                prop_assert!(in_burst <= burst);
                if d.final_ { in_burst = 0; }
                next += d.len;
                prop_assert_eq!(d.last, next == total);
            }
            prop_assert_eq!(next, total);
        }
    }
}
