//! Target-side tracking of one WRITE's data: immediate data, the unsolicited Data-Out
//! sequence (InitialR2T=No, up to FirstBurstLength), and solicited bursts requested by R2T
//! (up to MaxOutstandingR2T at once, MaxBurstLength each). Every Data-Out is checked for
//! its TTT, DataSN, offset and length before its payload may be placed.
//!
//! At ErrorRecoveryLevel 1 ([`WriteTransfer::with_recovery`]) a lost Data-Out does not fail
//! the command (RFC 7143 §7.1.4.1): a payload that failed its data digest
//! ([`WriteTransfer::payload_lost`]), or the bytes skipped by a DataSN gap (an earlier
//! Data-Out dropped for a header digest error), become holes that the next
//! [`WriteTransfer::next_r2ts`] asks for again with recovery R2Ts.

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
    #[error("Data-Out payload failed its data digest (ErrorRecoveryLevel 0: no recovery)")]
    DigestWithoutRecovery,
}

/// A DataSN ahead of the expected one by less than this is a gap (Data-Out lost in between);
/// further ahead it is an error, as without recovery.
const MAX_DATA_SN_GAP: u32 = 1 << 16;

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
    /// The R2TSN of the R2T that asked for it (None: the unsolicited sequence) and where
    /// that R2T's range began.
    r2t_sn: Option<u32>,
    start: u32,
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
    /// ERL ≥ 1: lost Data-Out is recovered instead of failing the command.
    recovery: bool,
    /// Ranges (offset, length) lost and not yet asked for again.
    holes: Vec<(u32, u32)>,
    /// Recovery R2Ts sent.
    recovery_r2ts: u32,
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
                r2t_sn: None,
                start: immediate_len,
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
            recovery: false,
            holes: Vec::new(),
            recovery_r2ts: 0,
        })
    }

    /// Within-command recovery (ErrorRecoveryLevel ≥ 1): lost Data-Out becomes holes that
    /// recovery R2Ts ask for again, instead of an error.
    pub fn with_recovery(mut self) -> Self {
        self.recovery = true;
        self
    }

    /// The Data-Out just accepted by [`WriteTransfer::on_data_out`] lost its payload (it
    /// failed its data digest; ERL ≥ 1): its range is asked for again. Without recovery it
    /// is an error.
    pub fn payload_lost(&mut self, offset: u32, len: u32) -> Result<(), WriteError> {
        if !self.recovery {
            return Err(WriteError::DigestWithoutRecovery);
        }
        self.received -= len;
        self.holes.push((offset, len));
        Ok(())
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
        // At ERL ≥ 1 a DataSN gap with the offset ahead by as much means Data-Out was
        // dropped (header digest error): what it carried is a hole.
        let gap = self.recovery
            && data_sn.wrapping_sub(seq.data_sn) < MAX_DATA_SN_GAP
            && data_sn != seq.data_sn
            && offset > seq.next;
        let skipped = if gap {
            let hole = (seq.next, offset - seq.next);
            seq.data_sn = data_sn;
            seq.next = offset;
            Some(hole)
        } else {
            None
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
        self.holes.extend(skipped);
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
        let room = |w: &Self| (w.bursts.len() as u32) < w.limits.max_outstanding_r2t.max(1);
        // Recovery R2Ts first: each asks for one hole again, with a new TTT and R2TSN.
        while room(self) {
            let Some((offset, len)) = self.holes.pop() else {
                break;
            };
            self.recovery_r2ts += 1;
            out.push(self.issue_r2t(offset, len, alloc_ttt()));
        }
        while room(self) && self.next_unrequested < self.expected_len {
            let len = (self.expected_len - self.next_unrequested)
                .min(self.limits.max_burst_length.max(512));
            let offset = self.next_unrequested;
            self.next_unrequested += len;
            out.push(self.issue_r2t(offset, len, alloc_ttt()));
        }
        out
    }

    /// An R2T for `len` bytes at `offset` with the next R2TSN; its sequence is outstanding.
    fn issue_r2t(&mut self, offset: u32, len: u32, ttt: u32) -> R2tRequest {
        let r2t_sn = self.r2t_sn;
        self.r2t_sn = self.r2t_sn.wrapping_add(1);
        self.bursts.push(Sequence {
            ttt,
            next: offset,
            end: offset + len,
            data_sn: 0,
            r2t_sn: Some(r2t_sn),
            start: offset,
        });
        R2tRequest {
            ttt,
            r2t_sn,
            offset,
            len,
        }
    }

    /// All expected bytes have arrived.
    pub fn is_complete(&self) -> bool {
        self.received == self.expected_len
            && self.unsolicited.is_none()
            && self.bursts.is_empty()
            && self.holes.is_empty()
    }

    /// No Data-Out came for a sequence reception timeout (ERL ≥ 1): the final Data-Out of
    /// a sequence was lost (a header digest error) or the rest of it is. What each
    /// outstanding sequence still lacks becomes a hole, asked for again by recovery R2T;
    /// their old TTTs are no longer accepted. Returns whether anything was outstanding.
    pub fn sequence_timeout(&mut self) -> bool {
        if !self.recovery {
            return false;
        }
        let before = self.holes.len();
        let open = self
            .unsolicited
            .take()
            .into_iter()
            .chain(self.bursts.drain(..));
        self.holes.extend(
            open.filter(|s| s.next < s.end)
                .map(|s| (s.next, s.end - s.next)),
        );
        self.holes.len() > before
    }

    /// The outstanding R2Ts an R2T SNACK asks for again (R2TSN `beg_run`, `run_length` of
    /// them, 0: all from `beg_run`), as they were sent; Err when any of them is not
    /// outstanding (never sent, or its data all arrived).
    pub fn r2ts_to_resend(
        &self,
        beg_run: u32,
        run_length: u32,
    ) -> Result<Vec<R2tRequest>, crate::erl1::SnackRefused> {
        let outstanding: Vec<R2tRequest> = self
            .bursts
            .iter()
            .filter_map(|b| {
                b.r2t_sn.map(|r2t_sn| R2tRequest {
                    ttt: b.ttt,
                    r2t_sn,
                    offset: b.start,
                    len: b.end - b.start,
                })
            })
            .collect();
        let first = outstanding
            .iter()
            .map(|r| r.r2t_sn)
            .min()
            .unwrap_or(self.r2t_sn);
        let run = crate::erl1::snack_run(beg_run, run_length, first, self.r2t_sn)?;
        run.map(|sn| {
            outstanding.iter().find(|r| r.r2t_sn == sn).copied().ok_or(
                crate::erl1::SnackRefused::OutsideRetained {
                    beg_run,
                    run_length,
                    first,
                    next: self.r2t_sn,
                },
            )
        })
        .collect()
    }

    /// Recovery R2Ts sent so far (holes asked for again).
    pub fn recovery_r2t_count(&self) -> u32 {
        self.recovery_r2ts
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

    /// Where data not yet asked for by R2T begins: before the first R2T, the end of the
    /// immediate and unsolicited data, which is all the initiator may send unasked (at most
    /// FirstBurstLength).
    pub fn unrequested_from(&self) -> u32 {
        self.next_unrequested
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

    #[test]
    fn a_digest_error_is_asked_for_again_at_erl1() {
        // 64 KiB solicited in one burst of 8 KiB Data-Outs; the third fails its digest.
        let mut w = WriteTransfer::new(65536, 0, true, limits(true))
            .unwrap()
            .with_recovery();
        let r = w.next_r2ts(|| 1);
        assert_eq!(r.len(), 1);
        for sn in 0..8u32 {
            let (off, last) = (sn * 8192, sn == 7);
            w.on_data_out(1, sn, off, 8192, last).unwrap();
            if sn == 2 {
                w.payload_lost(off, 8192).unwrap();
            }
        }
        assert!(!w.is_complete(), "a hole remains");
        let again = w.next_r2ts(|| 2);
        assert_eq!(
            again,
            vec![R2tRequest {
                ttt: 2,
                r2t_sn: 1,
                offset: 16384,
                len: 8192
            }]
        );
        assert_eq!(w.r2ts_to_resend(1, 1), Ok(again.clone()), "R2T SNACK");
        assert!(w.r2ts_to_resend(0, 1).is_err(), "R2TSN 0's data all came");
        assert!(w.r2ts_to_resend(2, 0).is_err(), "R2TSN 2 never sent");
        w.on_data_out(2, 0, 16384, 8192, true).unwrap();
        assert!(w.is_complete());
        assert_eq!((w.r2t_count(), w.recovery_r2t_count()), (2, 1));
    }

    #[test]
    fn a_datasn_gap_is_a_hole_at_erl1_and_an_error_at_erl0() {
        let run = |recovery: bool| {
            let w = WriteTransfer::new(32768, 0, true, limits(true)).unwrap();
            let mut w = if recovery { w.with_recovery() } else { w };
            w.next_r2ts(|| 1);
            w.on_data_out(1, 0, 0, 8192, false).unwrap();
            // DataSN 1 (8192..16384) and 2 were dropped for header digest errors.
            let r = w.on_data_out(1, 3, 24576, 8192, true);
            (w, r)
        };
        let (_, r) = run(false);
        assert_eq!(
            r,
            Err(WriteError::DataSn {
                got: 3,
                expected: 1
            })
        );
        let (mut w, r) = run(true);
        r.unwrap();
        let again = w.next_r2ts(|| 9);
        assert_eq!((again[0].offset, again[0].len), (8192, 16384));
        w.on_data_out(9, 0, 8192, 8192, false).unwrap();
        w.on_data_out(9, 1, 16384, 8192, true).unwrap();
        assert!(w.is_complete());
        let mut w = WriteTransfer::new(512, 0, true, limits(true)).unwrap();
        w.next_r2ts(|| 1);
        w.on_data_out(1, 0, 0, 512, true).unwrap();
        assert_eq!(
            w.payload_lost(0, 512),
            Err(WriteError::DigestWithoutRecovery),
            "no recovery at ERL 0"
        );
    }

    #[test]
    fn a_sequence_that_stops_arriving_is_asked_for_again_after_the_timeout() {
        let mut w = WriteTransfer::new(32768, 0, true, limits(true))
            .unwrap()
            .with_recovery();
        w.next_r2ts(|| 1);
        w.on_data_out(1, 0, 0, 8192, false).unwrap();
        // The rest of the burst (and its final Data-Out) never comes.
        assert!(w.sequence_timeout());
        let again = w.next_r2ts(|| 2);
        assert_eq!(
            (again[0].ttt, again[0].offset, again[0].len),
            (2, 8192, 24576)
        );
        assert!(
            w.on_data_out(1, 1, 8192, 8192, false).is_err(),
            "the old TTT is gone"
        );
        w.on_data_out(2, 0, 8192, 8192, false).unwrap();
        w.on_data_out(2, 1, 16384, 8192, false).unwrap();
        w.on_data_out(2, 2, 24576, 8192, true).unwrap();
        assert!(w.is_complete());
        let mut plain = WriteTransfer::new(512, 0, true, limits(true)).unwrap();
        plain.next_r2ts(|| 1);
        assert!(!plain.sequence_timeout(), "no recovery at ERL 0");
    }

    proptest! {
        /// Any Data-Out may lose its payload; the recovery R2Ts fetch each hole and the
        /// write completes with every byte received exactly once.
        #[test]
        fn lost_payloads_are_recovered(
            len in 1u32..400_000, seg in 512u32..70000, mb in 512u32..200000,
            mor in 1u32..4, lose in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let l = WriteLimits { first_burst_length: mb, max_burst_length: mb, initial_r2t: true,
                immediate_data: false, max_outstanding_r2t: mor, max_recv_data_segment_length: seg };
            let mut w = WriteTransfer::new(len, 0, true, l).unwrap().with_recovery();
            let mut have = vec![0u8; len as usize];
            let (mut ttt, mut n) = (0, 0usize);
            let mut rounds = 0;
            while !w.is_complete() {
                rounds += 1;
                prop_assert!(rounds < 10_000);
                let r2ts = w.next_r2ts(|| { ttt += 1; ttt });
                prop_assert!(!r2ts.is_empty());
                for r in r2ts {
                    let (mut off, mut sn) = (r.offset, 0);
                    while off < r.offset + r.len {
                        let k = (r.offset + r.len - off).min(seg);
                        let fin = off + k == r.offset + r.len;
                        n += 1;
                        w.on_data_out(r.ttt, sn, off, k, fin).unwrap();
                        if lose[n % lose.len()] && rounds < 50 {
                            w.payload_lost(off, k).unwrap();
                        } else {
                            for b in &mut have[off as usize..(off + k) as usize] { *b += 1; }
                        }
                        off += k; sn += 1;
                    }
                }
            }
            prop_assert_eq!(w.received(), len);
            prop_assert!(have.iter().all(|b| *b == 1));
        }

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
