//! Test captures built PDU by PDU: one iSCSI/TCP connection whose frames carry exactly the
//! PDUs given, at the times given.

use std::net::SocketAddr;

use bytes::Bytes;
use iscsi_wire::{encode_pdu, Bhs, DataIn, DataOut, Pdu, R2t, ScsiCommand, ScsiResponse};

use crate::analysis::{analyze_frames, Analysis, Options};
use crate::capture::Frame;

pub struct Synthetic {
    frames: Vec<Frame>,
    /// Next sequence number towards the target and towards the initiator.
    seq: [u32; 2],
    initiator: SocketAddr,
    target: SocketAddr,
}

impl Default for Synthetic {
    fn default() -> Self {
        Synthetic::new()
    }
}

impl Synthetic {
    pub fn new() -> Synthetic {
        Synthetic {
            frames: Vec::new(),
            seq: [1, 1],
            initiator: "10.0.0.1:40000".parse().expect("literal"),
            target: "10.0.0.2:3260".parse().expect("literal"),
        }
    }

    /// One frame holding `bhs` and `data`, captured at `ts_us`.
    pub fn pdu(&mut self, ts_us: u64, bhs: Bhs, data: &[u8]) -> &mut Synthetic {
        let to_target = matches!(bhs, Bhs::ScsiCommand(_) | Bhs::DataOut(_));
        let bytes = encode_pdu(&Pdu::new(bhs, Bytes::copy_from_slice(data)), None, None);
        let (src, dst, i) = if to_target {
            (self.initiator, self.target, 0)
        } else {
            (self.target, self.initiator, 1)
        };
        let seq = self.seq[i];
        self.seq[i] = seq.wrapping_add(bytes.len() as u32);
        self.frames.push(Frame {
            number: self.frames.len() as u64 + 1,
            ts_ns: ts_us * 1000,
            linktype: 1,
            data: pcap_trace::build_frame(src, dst, seq, 1, 0x18, &bytes),
        });
        self
    }

    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    pub fn analysis(&self) -> Analysis {
        analyze_frames(&self.frames, &Options::default())
    }
}

/// READ(10) or WRITE(10) of `blocks` 512-byte blocks at `lba`.
pub fn rw10(itt: u32, write: bool, lba: u32, blocks: u16, immediate: usize) -> Bhs {
    let mut cdb = [0u8; 16];
    cdb[0] = if write { 0x2a } else { 0x28 };
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_: immediate == blocks as usize * 512 || !write,
        read: !write,
        write,
        attr: 1,
        lun: 0,
        itt,
        expected_data_len: blocks as u32 * 512,
        cmd_sn: itt,
        exp_stat_sn: 1,
        cdb,
    })
}

pub fn data_in(itt: u32, offset: u32, with_status: bool) -> Bhs {
    Bhs::DataIn(DataIn {
        final_: with_status,
        status_present: with_status,
        itt,
        ttt: 0xffff_ffff,
        buffer_offset: offset,
        ..Default::default()
    })
}

pub fn r2t(itt: u32, ttt: u32, offset: u32, len: u32) -> Bhs {
    Bhs::R2t(R2t {
        itt,
        ttt,
        buffer_offset: offset,
        desired_len: len,
        ..Default::default()
    })
}

pub fn data_out(itt: u32, ttt: u32, offset: u32) -> Bhs {
    Bhs::DataOut(DataOut {
        final_: true,
        lun: 0,
        itt,
        ttt,
        exp_stat_sn: 1,
        data_sn: 0,
        buffer_offset: offset,
    })
}

pub fn response(itt: u32) -> Bhs {
    Bhs::ScsiResponse(ScsiResponse {
        itt,
        ..Default::default()
    })
}
