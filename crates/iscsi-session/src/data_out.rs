//! Initiator side: the Data-Out PDUs of one sequence (unsolicited after the command, or
//! answering one R2T), each at most the target's MaxRecvDataSegmentLength, DataSN from 0,
//! the F bit on the last, payloads sharing the caller's buffer.

use bytes::Bytes;
use iscsi_wire::{Bhs, DataOut, Pdu};

/// Which task a sequence belongs to and how it is cut.
#[derive(Debug, Clone, Copy)]
pub struct DataOutSequence {
    pub itt: u32,
    /// The LUN field as sent in the command.
    pub lun: u64,
    /// The R2T's Target Transfer Tag (0xffffffff for unsolicited data).
    pub ttt: u32,
    pub exp_stat_sn: u32,
    /// The target's MaxRecvDataSegmentLength.
    pub max_segment: u32,
}

impl DataOutSequence {
    /// The Data-Out PDUs carrying bytes `from..to` of `data` (`to` within `data`).
    pub fn pdus(self, data: &Bytes, from: u32, to: u32) -> impl Iterator<Item = Pdu> + '_ {
        crate::data_in_segments(to.saturating_sub(from), self.max_segment, u32::MAX).map(move |s| {
            let offset = from + s.offset;
            Pdu {
                bhs: Bhs::DataOut(DataOut {
                    final_: s.last,
                    lun: self.lun,
                    itt: self.itt,
                    ttt: self.ttt,
                    exp_stat_sn: self.exp_stat_sn,
                    data_sn: s.data_sn,
                    buffer_offset: offset,
                }),
                ahs: Bytes::new(),
                data: data.slice(offset as usize..(offset + s.len) as usize),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_is_cut_at_the_segment_length_with_f_on_the_last() {
        let data = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let seq = DataOutSequence {
            itt: 7,
            lun: 0,
            ttt: 9,
            exp_stat_sn: 3,
            max_segment: 4096,
        };
        let pdus: Vec<Pdu> = seq.pdus(&data, 1000, 10_000).collect();
        assert_eq!(pdus.len(), 3);
        let mut next = 1000;
        for (i, p) in pdus.iter().enumerate() {
            let Bhs::DataOut(d) = &p.bhs else { panic!() };
            assert_eq!(d.data_sn, i as u32);
            assert_eq!(d.buffer_offset, next);
            assert_eq!(d.final_, i == 2);
            assert_eq!((d.itt, d.ttt, d.exp_stat_sn), (7, 9, 3));
            assert_eq!(
                &p.data[..],
                &data[next as usize..next as usize + p.data.len()]
            );
            next += p.data.len() as u32;
        }
        assert_eq!(next, 10_000);
        assert_eq!(seq.pdus(&data, 5, 5).count(), 0);
    }
}
