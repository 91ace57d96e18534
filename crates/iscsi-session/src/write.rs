//! Target-side tracking of one WRITE's data: immediate data, the unsolicited Data-Out
//! sequence (InitialR2T=No, up to FirstBurstLength), and solicited bursts requested by R2T
//! (up to MaxOutstandingR2T at once, MaxBurstLength each). Every Data-Out is checked for
//! its TTT, DataSN, offset and length before its payload may be placed.

use iscsi_wire::RESERVED_TAG;

/// Negotiated limits that shape a write.
#[derive(Debug, Clone, Copy)]
pub struct WriteLimits {
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    /// The target's MaxRecvDataSegmentLength: the largest Data-Out payload it accepts.
    pub max_recv_data_segment_length: u32,
}

/// A Data-Out or command that breaks the rules; at ERL 0 the connection is dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("immediate data of {len} bytes not allowed (limit {limit})")]
    ImmediateData { len: u32, limit: u32 },
    #[error("unsolicited data announced (F=0) but InitialR2T=Yes")]
    UnsolicitedNotAllowed,
    #[error("Data-Out with TTT 0x{0:08x} matches no outstanding R2T")]
    UnknownTtt(u32),
    #[error("Data-Out DataSN {got}, expected {expected}")]
    DataSn { got: u32, expected: u32 },
    #[error("Data-Out at offset {got}, expected {expected}")]
    Offset { got: u32, expected: u32 },
    #[error("Data-Out of {len} bytes at {offset} runs past its sequence end {end}")]
    PastEnd { offset: u32, len: u32, end: u32 },
    #[error("Data-Out of {len} bytes exceeds MaxRecvDataSegmentLength {limit}")]
    SegmentTooLong { len: u32, limit: u32 },
    #[error("final Data-Out ends its sequence at {at}, short of {end}")]
    EndedEarly { at: u32, end: u32 },
}

/// An R2T the runtime should send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2tRequest {
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub len: u32,
}

#[derive(Debug, Clone)]
struct Sequence {
    ttt: u32,
    next: u32,
    end: u32,
    data_sn: u32,
}

/// State of one WRITE's data transfer.
#[derive(Debug, Clone)]
pub struct WriteTransfer {
    expected_len: u32,
    limits: WriteLimits,
    received: u32,
    unsolicited: Option<Sequence>,
    next_unrequested: u32,
    r2t_sn: u32,
    bursts: Vec<Sequence>,
}

impl WriteTransfer {
    /// Start tracking a write of `expected_len` bytes whose command carried
    /// `immediate_len` bytes of data and had the F bit `command_final`.
    pub fn new(
        expected_len: u32,
        immediate_len: u32,
        command_final: bool,
        limits: WriteLimits,
    ) -> Result<Self, WriteError> {
        let first_burst = limits.first_burst_length.min(expected_len);
        if immediate_len > 0 {
            let limit = if limits.immediate_data {
                first_burst.min(limits.max_recv_data_segment_length)
            } else {
                0
            };
            if immediate_len > limit {
                return Err(WriteError::ImmediateData {
                    len: immediate_len,
                    limit,
                });
            }
        }
        let unsolicited = if command_final || immediate_len >= first_burst {
            None
        } else if limits.initial_r2t {
            return Err(WriteError::UnsolicitedNotAllowed);
        } else {
            Some(Sequence {
                ttt: RESERVED_TAG,
                next: immediate_len,
                end: first_burst,
                data_sn: 0,
            })
        };
        // Solicited data starts where the immediate and unsolicited data end.
        let next_unrequested = match &unsolicited {
            Some(seq) => seq.end,
            None => immediate_len,
        };
        Ok(WriteTransfer {
            expected_len,
            limits,
            received: immediate_len,
            unsolicited,
            next_unrequested,
            r2t_sn: 0,
            bursts: Vec::new(),
        })
    }

    /// Check a Data-Out header. On success the payload belongs at `offset` of the
    /// task's buffer; the caller places it and may then ask for more R2Ts.
    pub fn on_data_out(
        &mut self,
        ttt: u32,
        data_sn: u32,
        offset: u32,
        len: u32,
        final_: bool,
    ) -> Result<(), WriteError> {
        if len > self.limits.max_recv_data_segment_length {
            return Err(WriteError::SegmentTooLong {
                len,
                limit: self.limits.max_recv_data_segment_length,
            });
        }
        let (seq, idx) = if ttt == RESERVED_TAG {
            (
                self.unsolicited
                    .as_mut()
                    .ok_or(WriteError::UnknownTtt(ttt))?,
                None,
            )
        } else {
            let i = self
                .bursts
                .iter()
                .position(|b| b.ttt == ttt)
                .ok_or(WriteError::UnknownTtt(ttt))?;
            (&mut self.bursts[i], Some(i))
        };
        if data_sn != seq.data_sn {
            return Err(WriteError::DataSn {
                got: data_sn,
                expected: seq.data_sn,
            });
        }
        if offset != seq.next {
            return Err(WriteError::Offset {
                got: offset,
                expected: seq.next,
            });
        }
        let end = offset as u64 + len as u64;
        if end > seq.end as u64 {
            return Err(WriteError::PastEnd {
                offset,
                len,
                end: seq.end,
            });
        }
        if final_ && end != seq.end as u64 {
            return Err(WriteError::EndedEarly {
                at: end as u32,
                end: seq.end,
            });
        }
        seq.next = end as u32;
        seq.data_sn = seq.data_sn.wrapping_add(1);
        self.received += len;
        if final_ {
            match idx {
                None => self.unsolicited = None,
                Some(i) => {
                    self.bursts.swap_remove(i);
                }
            }
        }
        Ok(())
    }

    /// R2Ts to send now (respecting MaxOutstandingR2T and MaxBurstLength), with TTTs
    /// from `alloc_ttt`.
    pub fn next_r2ts(&mut self, mut alloc_ttt: impl FnMut() -> u32) -> Vec<R2tRequest> {
        let mut out = Vec::new();
        while (self.bursts.len() as u32) < self.limits.max_outstanding_r2t.max(1)
            && self.next_unrequested < self.expected_len
        {
            let len = (self.expected_len - self.next_unrequested)
                .min(self.limits.max_burst_length.max(512));
            let r = R2tRequest {
                ttt: alloc_ttt(),
                r2t_sn: self.r2t_sn,
                offset: self.next_unrequested,
                len,
            };
            self.r2t_sn = self.r2t_sn.wrapping_add(1);
            self.next_unrequested += len;
            self.bursts.push(Sequence {
                ttt: r.ttt,
                next: r.offset,
                end: r.offset + len,
                data_sn: 0,
            });
            out.push(r);
        }
        out
    }

    /// All expected bytes have arrived.
    pub fn is_complete(&self) -> bool {
        self.received == self.expected_len && self.unsolicited.is_none() && self.bursts.is_empty()
    }

    /// Bytes received so far.
    pub fn received(&self) -> u32 {
        self.received
    }

    /// R2Ts sent so far (the ExpDataSN of the final response for a write).
    pub fn r2t_count(&self) -> u32 {
        self.r2t_sn
    }

    /// Whether unsolicited Data-Out is still expected.
    pub fn awaiting_unsolicited(&self) -> bool {
        self.unsolicited.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(initial_r2t: bool) -> WriteLimits {
        WriteLimits {
            first_burst_length: 65536,
            max_burst_length: 262144,
            initial_r2t,
            immediate_data: true,
            max_outstanding_r2t: 2,
            max_recv_data_segment_length: 8192,
        }
    }

    #[test]
    fn immediate_unsolicited_then_solicited() {
        let mut w = WriteTransfer::new(1 << 20, 8192, false, limits(false)).unwrap();
        for (sn, off) in (8192..65536).step_by(8192).enumerate() {
            w.on_data_out(RESERVED_TAG, sn as u32, off, 8192, off + 8192 == 65536)
                .unwrap();
        }
        assert!(!w.awaiting_unsolicited());
        let mut ttt = 100;
        let r2ts = w.next_r2ts(|| {
            ttt += 1;
            ttt
        });
        assert_eq!(r2ts.len(), 2);
        assert_eq!(
            (r2ts[0].offset, r2ts[0].len, r2ts[0].r2t_sn),
            (65536, 262144, 0)
        );
        assert_eq!((r2ts[1].offset, r2ts[1].r2t_sn), (65536 + 262144, 1));
        assert!(w.next_r2ts(|| 0).is_empty(), "two outstanding already");
        assert_eq!(
            w.on_data_out(999, 0, 65536, 8192, false),
            Err(WriteError::UnknownTtt(999))
        );
        assert_eq!(
            w.on_data_out(101, 1, 65536, 8192, false),
            Err(WriteError::DataSn {
                got: 1,
                expected: 0
            })
        );
        assert_eq!(
            w.on_data_out(101, 0, 65537, 8192, false),
            Err(WriteError::Offset {
                got: 65537,
                expected: 65536
            })
        );
        assert!(matches!(
            w.on_data_out(101, 0, 65536, 16384, false),
            Err(WriteError::SegmentTooLong { .. })
        ));
        assert!(matches!(
            w.on_data_out(101, 0, 65536, 8192, true),
            Err(WriteError::EndedEarly { .. })
        ));
        assert!(!w.is_complete());
    }

    #[test]
    fn initial_r2t_rejects_unsolicited() {
        assert_eq!(
            WriteTransfer::new(4096, 0, false, limits(true)).unwrap_err(),
            WriteError::UnsolicitedNotAllowed
        );
        let mut w = WriteTransfer::new(4096, 0, true, limits(true)).unwrap();
        assert_eq!(
            w.on_data_out(RESERVED_TAG, 0, 0, 512, false),
            Err(WriteError::UnknownTtt(RESERVED_TAG))
        );
        let r = w.next_r2ts(|| 7);
        assert_eq!(
            r,
            vec![R2tRequest {
                ttt: 7,
                r2t_sn: 0,
                offset: 0,
                len: 4096
            }]
        );
    }

    #[test]
    fn immediate_data_limits() {
        let mut l = limits(false);
        assert!(matches!(
            WriteTransfer::new(4096, 8192, true, l),
            Err(WriteError::ImmediateData { .. })
        ));
        l.immediate_data = false;
        assert!(matches!(
            WriteTransfer::new(4096, 512, true, l),
            Err(WriteError::ImmediateData { limit: 0, .. })
        ));
        let w = WriteTransfer::new(4096, 4096, true, limits(false)).unwrap();
        assert!(w.is_complete());
    }

    #[test]
    fn libiscsi_datasn_cases_fail() {
        // One 512-byte block solicited by R2T: DataSN 27, 0xffffffff, or a duplicate 0 must fail.
        for bad in [27u32, 0xffff_ffff] {
            let mut w = WriteTransfer::new(1024, 0, true, limits(true)).unwrap();
            w.next_r2ts(|| 1);
            assert!(w.on_data_out(1, bad, 0, 512, false).is_err());
        }
        let mut w = WriteTransfer::new(1024, 0, true, limits(true)).unwrap();
        w.next_r2ts(|| 1);
        w.on_data_out(1, 0, 0, 512, false).unwrap();
        assert!(
            w.on_data_out(1, 0, 512, 512, true).is_err(),
            "duplicate DataSN 0"
        );
        let mut w = WriteTransfer::new(1024, 0, true, limits(true)).unwrap();
        w.next_r2ts(|| 1);
        assert!(
            w.on_data_out(1, 1, 512, 512, true).is_err(),
            "reversed order"
        );
    }

    proptest! {
        #[test]
        fn a_well_behaved_initiator_always_completes(
            len in 1u32..2_000_000, imm_on: bool, initial_r2t: bool, seg in 512u32..70000,
            fb in 512u32..300000, mb in 512u32..600000, mor in 1u32..4,
        ) {
            let fb = fb.min(mb);
            let l = WriteLimits { first_burst_length: fb, max_burst_length: mb, initial_r2t, immediate_data: imm_on,
                max_outstanding_r2t: mor, max_recv_data_segment_length: seg };
            let imm = if imm_on { len.min(fb).min(seg) } else { 0 };
            let unsolicited = !initial_r2t && imm < len.min(fb);
            let mut w = WriteTransfer::new(len, imm, !unsolicited, l).unwrap();
            if unsolicited {
                let end = len.min(fb);
                let (mut off, mut sn) = (imm, 0);
                while off < end {
                    let n = (end - off).min(seg);
                    w.on_data_out(RESERVED_TAG, sn, off, n, off + n == end).unwrap();
                    off += n; sn += 1;
                }
            }
            let mut ttt = 0;
            let mut rounds = 0;
            while !w.is_complete() {
                rounds += 1;
                prop_assert!(rounds < 10_000);
                let r2ts = w.next_r2ts(|| { ttt += 1; ttt });
                prop_assert!(!r2ts.is_empty());
                for r in r2ts {
                    prop_assert!(r.len <= mb.max(512));
                    let (mut off, mut sn) = (r.offset, 0);
                    while off < r.offset + r.len {
                        let n = (r.offset + r.len - off).min(seg);
                        w.on_data_out(r.ttt, sn, off, n, off + n == r.offset + r.len).unwrap();
                        off += n; sn += 1;
                    }
                }
            }
            prop_assert_eq!(w.received(), len);
        }
    }
}
