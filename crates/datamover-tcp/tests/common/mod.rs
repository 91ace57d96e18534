//! What the TCP datamover's tests share: the initiator end's view of the wire, with every
//! digest checked by an independent CRC32C.

// Each test file uses a part of this module.
#![allow(dead_code)]

use datamover::FfpConfig;
use iscsi_session::WriteLimits;
use iscsi_wire::{decode_pdu, Digests, Pdu, WireError};

/// The reference byte-table CRC32C, not the hardware path the datamover uses.
pub fn reference_crc32c(bytes: &[u8]) -> u32 {
    digest::sarwate::append(0, bytes)
}

/// The PDU at the front of `buf` and the bytes it took, every digest present checked with
/// [`reference_crc32c`]; `None` while more bytes are needed. Panics on what does not decode.
pub fn decode_checked(buf: &[u8], digests: Digests) -> Option<(Pdu, usize)> {
    match decode_pdu(buf, digests, 1 << 24) {
        Ok(d) => {
            let wire = &buf[..d.consumed];
            if let Some(h) = d.header_digest {
                assert_eq!(h, reference_crc32c(&wire[..48]), "header digest");
            }
            if let Some(dd) = d.data_digest {
                let end = d.consumed - 4;
                let start = end - d.pdu.data.len().next_multiple_of(4);
                assert_eq!(dd, reference_crc32c(&wire[start..end]), "data digest");
            }
            Some((d.pdu, d.consumed))
        }
        Err(WireError::Truncated { .. }) => None,
        Err(e) => panic!("undecodable PDU from the datamover: {e}"),
    }
}

/// The parameters the tests' datamovers run with: 4 KiB Data-In segments in 16 KiB bursts,
/// 8 KiB received segments and first burst, two R2Ts outstanding.
pub fn config(digests: Digests, initial_r2t: bool, next_stat_sn: u32) -> FfpConfig {
    FfpConfig {
        digests,
        max_recv_data_segment_length: 8192,
        max_send_data_segment_length: 4096,
        max_burst_length: 16384,
        write_limits: WriteLimits {
            first_burst_length: 8192,
            max_burst_length: 16384,
            initial_r2t,
            immediate_data: true,
            max_outstanding_r2t: 2,
            max_recv_data_segment_length: 8192,
        },
        status: datamover::status_numbering(next_stat_sn),
        max_write_len: 1 << 20,
    }
}
