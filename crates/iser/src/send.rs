//! One iSCSI PDU per RDMA Send: the iSER header, the BHS, the AHS, the data segment, padded
//! to 4 bytes (Linux pads; a Send without the padding is accepted too). Digests are never
//! used. A Send whose declared lengths disagree with its size is refused: isert drops a
//! connection whose Send is shorter than 76 + DataSegmentLength, and so does ironsan.

use bytes::Bytes;
use iscsi_wire::{Bhs, Pdu, BHS_LEN};

use crate::{IserError, IserHeader, IserOpcode, ISER_HEADERS_LEN, ISER_HEADER_LEN};

/// A received Send: its iSER header and the PDU it carries (AHS and data share the Send's
/// bytes).
#[derive(Debug, Clone)]
pub struct IserSend {
    pub header: IserHeader,
    pub pdu: Pdu,
    /// The BHS as received (a Reject echoes it).
    pub raw_bhs: [u8; BHS_LEN],
}

/// Parses a received Send of `bytes`, accepting at most `max_data` bytes of data segment.
pub fn parse_send(bytes: &Bytes, max_data: u32) -> Result<IserSend, IserError> {
    let header = IserHeader::decode(bytes)?;
    if header.opcode != IserOpcode::Control {
        return Err(IserError::Hello);
    }
    if bytes.len() < ISER_HEADERS_LEN {
        return Err(IserError::Short {
            got: bytes.len(),
            need: ISER_HEADERS_LEN,
        });
    }
    let raw_bhs: [u8; BHS_LEN] = bytes[ISER_HEADER_LEN..ISER_HEADERS_LEN]
        .try_into()
        .expect("48 bytes");
    let decoded = Bhs::decode(&raw_bhs).map_err(|e| IserError::Bhs(e.to_string()))?;
    if decoded.data_len > max_data {
        return Err(IserError::TooMuchData {
            len: decoded.data_len,
            max: max_data,
        });
    }
    let ahs_end = ISER_HEADERS_LEN + decoded.ahs_len;
    let data_end = ahs_end + decoded.data_len as usize;
    if bytes.len() < data_end {
        return Err(IserError::Short {
            got: bytes.len(),
            need: data_end,
        });
    }
    let padded = data_end.next_multiple_of(4);
    if bytes.len() > padded {
        return Err(IserError::Long {
            got: bytes.len(),
            need: padded,
        });
    }
    Ok(IserSend {
        header,
        pdu: Pdu {
            bhs: decoded.bhs,
            ahs: bytes.slice(ISER_HEADERS_LEN..ahs_end),
            data: bytes.slice(ahs_end..data_end),
        },
        raw_bhs,
    })
}

/// Bytes of the Send carrying `pdu` (padded to 4).
pub fn send_len(pdu: &Pdu) -> usize {
    (ISER_HEADERS_LEN + pdu.ahs.len() + pdu.data.len()).next_multiple_of(4)
}

/// Lays out `pdu` behind `header` as one Send in `out` (at least [`send_len`] bytes);
/// returns the length used.
pub fn encode_send(header: &IserHeader, pdu: &Pdu, out: &mut [u8]) -> usize {
    let len = send_len(pdu);
    let out = &mut out[..len];
    out[..ISER_HEADER_LEN].copy_from_slice(&header.encode());
    out[ISER_HEADER_LEN..ISER_HEADERS_LEN].copy_from_slice(&pdu.encode_bhs());
    let ahs_end = ISER_HEADERS_LEN + pdu.ahs.len();
    out[ISER_HEADERS_LEN..ahs_end].copy_from_slice(&pdu.ahs);
    let data_end = ahs_end + pdu.data.len();
    out[ahs_end..data_end].copy_from_slice(&pdu.data);
    out[data_end..].fill(0);
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_wire::{NopOut, ScsiCommand};
    use proptest::prelude::*;

    fn command_send(data: &[u8]) -> Vec<u8> {
        let bhs = Bhs::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: 1,
            lun: 0,
            itt: 9,
            expected_data_len: 4096,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: [0x2a; 16],
        });
        let pdu = Pdu::new(bhs, Bytes::copy_from_slice(data));
        let header = IserHeader {
            write: Some((0x77, 0x1000_0000 + data.len() as u64)),
            ..IserHeader::CONTROL
        };
        let mut out = vec![0xAA; send_len(&pdu)];
        let n = encode_send(&header, &pdu, &mut out);
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn a_command_with_immediate_data_round_trips_padded_to_four() {
        let send = command_send(&[5u8; 459]);
        assert_eq!(send.len(), 28 + 48 + 460, "padded to 4 as Linux does");
        assert_eq!(send[0], 0x18);
        let got = parse_send(&Bytes::from(send.clone()), 8192).unwrap();
        assert_eq!(got.header.write, Some((0x77, 0x1000_0000 + 459)));
        assert_eq!(got.pdu.data.len(), 459);
        assert!(matches!(got.pdu.bhs, Bhs::ScsiCommand(ref c) if c.itt == 9));
        assert_eq!(&got.raw_bhs[..], &send[28..76]);
        // Without the padding it is accepted too.
        assert!(parse_send(&Bytes::from(send[..send.len() - 1].to_vec()), 8192).is_ok());
    }

    #[test]
    fn lengths_that_disagree_with_the_send_are_refused() {
        let send = command_send(&[5u8; 100]);
        let short = Bytes::from(send[..150].to_vec());
        assert_eq!(
            parse_send(&short, 8192).unwrap_err(),
            IserError::Short {
                got: 150,
                need: 176
            }
        );
        let mut long = send.clone();
        long.extend_from_slice(&[0; 8]);
        assert!(matches!(
            parse_send(&Bytes::from(long), 8192),
            Err(IserError::Long { .. })
        ));
        assert_eq!(
            parse_send(&Bytes::from(send), 64).unwrap_err(),
            IserError::TooMuchData { len: 100, max: 64 }
        );
        assert!(matches!(
            parse_send(&Bytes::from(vec![0x10; 40]), 8192),
            Err(IserError::Short { got: 40, need: 76 })
        ));
        let mut hello = vec![0u8; 76];
        hello[0] = 0x20;
        assert_eq!(
            parse_send(&Bytes::from(hello), 8192).unwrap_err(),
            IserError::Hello
        );
    }

    #[test]
    fn a_control_pdu_without_data_is_76_bytes() {
        let pdu = Pdu::new(Bhs::NopOut(NopOut::default()), Bytes::new());
        assert_eq!(send_len(&pdu), 76);
    }

    proptest! {
        #[test]
        fn random_sends_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_send(&Bytes::from(bytes), 256);
        }

        #[test]
        fn random_sends_with_a_control_header_never_panic(
            mut bytes in proptest::collection::vec(any::<u8>(), 76..400),
            flags in 0u8..16,
        ) {
            bytes[0] = 0x10 | flags;
            if let Ok(s) = parse_send(&Bytes::from(bytes.clone()), 256) {
                prop_assert!(76 + s.pdu.ahs.len() + s.pdu.data.len() <= bytes.len());
            }
        }
    }
}
