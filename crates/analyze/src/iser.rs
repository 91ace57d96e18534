//! iSER over iWARP, sans-IO: one direction of a TCP stream carrying MPA (start frame, then
//! FPDUs), DDP and RDMAP, reassembled into RDMA Send messages; each Send holds a 28-byte
//! iSER header and one iSCSI PDU, which becomes a [`FramedPdu`]. RDMA Writes, Read Requests
//! and Read Responses are counted (they carry the SCSI data) but are not iSCSI PDUs.

use std::collections::HashMap;

use iscsi_wire::MAX_DATA_SEGMENT;
use iser::IserError;
use iwarp::ddp::{DdpHeader, Opcode as RdmapOpcode, QN_SEND};
use serde::Serialize;

use crate::iscsi::{DigestCheck, Dir, FramedPdu};
use crate::tcp::Chunk;

/// iSER header length (RFC 7145 layout, as Linux uses it).
pub use iser::ISER_HEADER_LEN;
const MPA_HEADER_LEN: usize = 20;

/// What an RDMA operation did to a command's buffer, named by the initiator's STag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaKind {
    /// Read data written into the buffer (an RDMA Write segment to the Read STag).
    Write,
    /// Write data asked for from the buffer (an RDMA Read Request of the Write STag).
    ReadRequest,
    /// Write data coming back (an RDMA Read Response segment, going to the target; its STag
    /// is the target's sink STag that the Read Request named).
    ReadResponse,
}

/// One RDMA operation (or segment of one) that moves a command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaXfer {
    pub ts_ns: u64,
    /// Stream offset of its FPDU (orders it among the PDUs of one capture time).
    pub stream_offset: u64,
    pub stag: u32,
    pub bytes: u64,
    pub kind: RdmaKind,
    /// A Read Request: the target's sink STag, which its Read Responses carry.
    pub sink_stag: Option<u32>,
}

/// RDMA traffic that is not an iSCSI PDU.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RdmaStats {
    pub fpdus: u64,
    pub rdma_writes: u64,
    pub rdma_write_bytes: u64,
    pub read_requests: u64,
    pub read_responses: u64,
    pub read_response_bytes: u64,
    pub terminates: u64,
    pub malformed: u64,
    /// Incomplete Send messages given up to keep the bytes held for reassembly bounded
    /// (their last segment never came: a capture that lost it, or hostile input).
    pub sends_dropped: u64,
}

/// Bytes of incomplete Send messages held at once; past it the oldest are given up.
const MAX_REASSEMBLY_BYTES: usize = 64 << 20;

/// A Send message being reassembled from DDP segments.
#[derive(Debug, Default)]
struct Message {
    data: Vec<u8>,
    first_ts_ns: u64,
    offset: u64,
}

#[derive(Debug)]
pub struct IserDecoder {
    dir: Dir,
    buf: Vec<u8>,
    used: usize,
    buf_offset: u64,
    start_frame_done: bool,
    messages: HashMap<u32, Message>,
    /// The bytes `messages` hold.
    held: usize,
    broken: bool,
    pub stats: RdmaStats,
    /// RDMA operations on command buffers seen since the caller last drained this.
    pub xfers: Vec<RdmaXfer>,
}

impl IserDecoder {
    pub fn new(dir: Dir) -> IserDecoder {
        IserDecoder {
            dir,
            buf: Vec::new(),
            used: 0,
            buf_offset: 0,
            start_frame_done: false,
            messages: HashMap::new(),
            held: 0,
            broken: false,
            stats: RdmaStats::default(),
            xfers: Vec::new(),
        }
    }

    pub fn direction(&self) -> Dir {
        self.dir
    }

    pub fn push(&mut self, chunk: &Chunk) -> Vec<FramedPdu> {
        let mut out = Vec::new();
        if self.broken
            || chunk.gap_before > 0
            || chunk.offset != self.buf_offset + self.buf.len() as u64
        {
            // FPDU boundaries cannot be found again without markers: stop decoding.
            self.broken = true;
            return out;
        }
        self.buf.extend_from_slice(&chunk.data);
        if !self.start_frame_done {
            let b = &self.buf[self.used..];
            if b.len() < MPA_HEADER_LEN {
                return out;
            }
            let total = MPA_HEADER_LEN + u16::from_be_bytes([b[18], b[19]]) as usize;
            if b.len() < total {
                return out;
            }
            self.used += total;
            self.start_frame_done = true;
        }
        // Each round consumes one FPDU or returns.
        loop {
            let b = &self.buf[self.used..];
            if b.len() < 2 {
                break;
            }
            let ulpdu = u16::from_be_bytes([b[0], b[1]]) as usize;
            let pad = iwarp::fpdu::pad_len(ulpdu);
            let total = 2 + ulpdu + pad + 4;
            if b.len() < total {
                break;
            }
            let at = self.buf_offset + self.used as u64;
            let ulp = b[2..2 + ulpdu].to_vec();
            self.used += total;
            self.stats.fpdus += 1;
            if let Some(p) = self.segment(&ulp, at, chunk.ts_ns, chunk.frame) {
                out.push(p);
            }
        }
        if self.used > (1 << 20) {
            self.buf.drain(..self.used);
            self.buf_offset += self.used as u64;
            self.used = 0;
        }
        out
    }

    fn segment(&mut self, ulp: &[u8], at: u64, ts_ns: u64, frame: u64) -> Option<FramedPdu> {
        let Ok(h) = DdpHeader::decode(ulp) else {
            self.stats.malformed += 1;
            return None;
        };
        let payload = &ulp[h.len()..];
        match h {
            DdpHeader::Tagged(t) => {
                let bytes = payload.len() as u64;
                let kind = if t.opcode == RdmapOpcode::RdmaWrite {
                    self.stats.rdma_writes += u64::from(t.last);
                    self.stats.rdma_write_bytes += bytes;
                    RdmaKind::Write
                } else {
                    self.stats.read_responses += u64::from(t.last);
                    self.stats.read_response_bytes += bytes;
                    RdmaKind::ReadResponse
                };
                self.xfers.push(RdmaXfer {
                    ts_ns,
                    stream_offset: at,
                    stag: t.stag,
                    bytes,
                    kind,
                    sink_stag: None,
                });
                None
            }
            DdpHeader::Untagged(u) => {
                if u.opcode == RdmapOpcode::ReadRequest {
                    self.stats.read_requests += 1;
                    if let Ok(r) = iwarp::rdmap::ReadRequest::decode(payload) {
                        self.xfers.push(RdmaXfer {
                            ts_ns,
                            stream_offset: at,
                            stag: r.src_stag,
                            bytes: u64::from(r.size),
                            kind: RdmaKind::ReadRequest,
                            sink_stag: Some(r.sink_stag),
                        });
                    }
                    return None;
                }
                if u.opcode == RdmapOpcode::Terminate {
                    self.stats.terminates += 1;
                    return None;
                }
                if u.qn != QN_SEND {
                    return None;
                }
                let m = self.messages.entry(u.msn).or_insert_with(|| Message {
                    first_ts_ns: ts_ns,
                    offset: at,
                    ..Message::default()
                });
                let mo = u.mo as usize;
                if mo > (1 << 24) {
                    self.stats.malformed += 1;
                    return None;
                }
                if m.data.len() < mo + payload.len() {
                    self.held += mo + payload.len() - m.data.len();
                    m.data.resize(mo + payload.len(), 0);
                }
                m.data[mo..mo + payload.len()].copy_from_slice(payload);
                if !u.last {
                    self.bound_reassembly(u.msn);
                    return None;
                }
                let m = self.messages.remove(&u.msn)?;
                self.held -= m.data.len();
                self.iscsi_in_send(m, ts_ns, frame)
            }
        }
    }

    /// Gives up the oldest incomplete Sends (first seen earliest) other than `keep` while
    /// more than [`MAX_REASSEMBLY_BYTES`] are held.
    fn bound_reassembly(&mut self, keep: u32) {
        while self.held > MAX_REASSEMBLY_BYTES {
            let oldest = self
                .messages
                .iter()
                .filter(|(msn, _)| **msn != keep)
                .min_by_key(|(_, m)| m.offset)
                .map(|(msn, _)| *msn);
            let Some(msn) = oldest else { return };
            let m = self.messages.remove(&msn).expect("present");
            self.held -= m.data.len();
            self.stats.sends_dropped += 1;
        }
    }

    fn iscsi_in_send(&mut self, m: Message, ts_ns: u64, frame: u64) -> Option<FramedPdu> {
        let wire_len = m.data.len() as u64;
        let send = match iser::parse_send(&bytes::Bytes::from(m.data), MAX_DATA_SEGMENT) {
            Ok(send) => send,
            // Hello/HelloReply (or a header of no known opcode) carry no iSCSI PDU.
            Err(IserError::Hello | IserError::BadFlags(_)) => return None,
            Err(_) => {
                self.stats.malformed += 1;
                return None;
            }
        };
        Some(FramedPdu {
            offset: m.offset,
            first_ts_ns: m.first_ts_ns,
            ts_ns,
            frame,
            wire_len,
            bhs: send.pdu.bhs,
            ahs: send.pdu.ahs.to_vec(),
            data: send.pdu.data.to_vec(),
            header_digest: DigestCheck::Absent,
            data_digest: DigestCheck::Absent,
            iser: Some(send.header),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use iscsi_wire::{encode_pdu, Bhs, NopOut, Pdu};
    use iwarp::ddp::{TaggedHeader, UntaggedHeader};

    fn fpdu(header: DdpHeader, payload: &[u8]) -> Vec<u8> {
        iwarp::fpdu::encode(&header.to_bytes(), payload, true)
    }

    #[test]
    fn incomplete_sends_hold_bounded_memory() {
        // 40 Send messages of 16 MiB, none ever finished: only about 64 MiB is held.
        let mut stream = b"MPA ID Req Frame".to_vec();
        stream.extend_from_slice(&[0x40, 1, 0, 0]);
        let mut d = IserDecoder::new(Dir::ToTarget);
        let mut offset = 0;
        for msn in 0..40u32 {
            let seg = fpdu(
                DdpHeader::Untagged(UntaggedHeader {
                    last: false,
                    opcode: RdmapOpcode::Send,
                    inv_stag: 0,
                    qn: 0,
                    msn,
                    mo: (1 << 24) - 4,
                }),
                &[7; 4],
            );
            stream.extend(seg);
            let data = std::mem::take(&mut stream);
            let n = data.len() as u64;
            d.push(&Chunk {
                offset,
                data,
                ts_ns: 1,
                frame: 1,
                gap_before: 0,
            });
            offset += n;
            assert!(d.held <= MAX_REASSEMBLY_BYTES + (1 << 24), "{}", d.held);
        }
        assert!(d.stats.sends_dropped >= 35, "{:?}", d.stats);
        assert_eq!(
            d.held,
            d.messages.values().map(|m| m.data.len()).sum::<usize>()
        );
    }

    #[test]
    fn send_split_over_two_segments_gives_one_pdu() {
        let nop = Bhs::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt: 9,
            ttt: 0xffff_ffff,
            cmd_sn: 1,
            exp_stat_sn: 1,
        });
        let mut msg = vec![0x10u8];
        msg.resize(ISER_HEADER_LEN, 0);
        msg.extend(encode_pdu(&Pdu::new(nop, Bytes::new()), None, None));
        let mut stream = b"MPA ID Req Frame".to_vec();
        stream.extend_from_slice(&[0x40, 1, 0, 0]);
        let send = |last, mo: usize, part: &[u8]| {
            fpdu(
                DdpHeader::Untagged(UntaggedHeader {
                    last,
                    opcode: RdmapOpcode::Send,
                    inv_stag: 0,
                    qn: 0,
                    msn: 1,
                    mo: mo as u32,
                }),
                part,
            )
        };
        stream.extend(send(false, 0, &msg[..40]));
        let write_at = stream.len() as u64;
        stream.extend(fpdu(
            DdpHeader::Tagged(TaggedHeader {
                last: true,
                opcode: RdmapOpcode::RdmaWrite,
                stag: 5,
                to: 0,
            }),
            &[1, 2, 3],
        ));
        stream.extend(send(true, 40, &msg[40..]));
        let mut d = IserDecoder::new(Dir::ToTarget);
        let out = d.push(&Chunk {
            offset: 0,
            data: stream,
            ts_ns: 1,
            frame: 1,
            gap_before: 0,
        });
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].bhs.itt(), 9);
        assert_eq!(d.stats.rdma_writes, 1);
        assert_eq!(d.stats.rdma_write_bytes, 3);
        assert_eq!(
            d.xfers,
            vec![RdmaXfer {
                ts_ns: 1,
                stream_offset: write_at,
                stag: 5,
                bytes: 3,
                kind: RdmaKind::Write,
                sink_stag: None,
            }]
        );
        assert_eq!(out[0].iser, Some(iser::IserHeader::CONTROL));
    }
}
