//! Wire codecs: iSCSI PDU framing (with and without digests), the iSER header and Send
//! layout, MPA Request/Reply, and DDP/RDMAP with Read Requests and Terminates.

use bytes::Bytes;
use iscsi_wire::{Bhs, Digests, FrameLayout, BHS_LEN};

use crate::Input;

/// Largest data segment a connection would accept (the protocol's maximum).
const MAX_DATA: u32 = 16_777_215;

/// Writes correct digests into the PDU at the front of `buf` where there is room, so that
/// the fuzzer reaches the code behind the digest checks.
fn fill_digests(buf: &mut [u8], digests: Digests, max_data: u32) {
    let Some(head) = buf.get(..BHS_LEN) else {
        return;
    };
    let head: [u8; BHS_LEN] = head.try_into().expect("48 bytes");
    let Ok(layout) = FrameLayout::of(&head, digests, max_data) else {
        return;
    };
    let header_end = BHS_LEN + layout.header_rest_len();
    if layout.header_digest_len > 0 && buf.len() >= header_end {
        let crc = digest::crc32c(&buf[..header_end - 4]);
        buf[header_end - 4..header_end].copy_from_slice(&crc.to_le_bytes());
    }
    if layout.data_digest_len > 0 && buf.len() >= layout.total_len() {
        let start = header_end;
        let end = start + layout.data_len as usize + layout.pad_len;
        let crc = digest::crc32c(&buf[start..end]);
        buf[end..end + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// iSCSI/TCP framing as both roles' receive paths do it: the framer
/// (`datamover_tcp::frame::complete_frame`, header digest checked, data digest verified),
/// the BHS decoder, AHS parsing, the login-PDU conversion and the one-shot `decode_pdu`.
///
/// Input: an options byte (bit 0 header digest, bit 1 data digest, bit 2 fill in correct
/// digests, bit 3 a login-phase 8 KiB data limit), then a byte stream of PDUs.
///
/// Checks: `decode_pdu` agrees with the framer on every frame; a decoded BHS encodes to
/// bytes that decode to the same header.
pub fn iscsi_pdu(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let digests = Digests {
        header: flags & 1 != 0,
        data: flags & 2 != 0,
    };
    let max_data = if flags & 8 != 0 { 8192 } else { MAX_DATA };
    let mut buf = inp.rest().to_vec();
    let mut at = 0;
    // Bounded: every round consumes a whole frame (at least 48 bytes).
    for _ in 0..256 {
        let rest = &mut buf[at..];
        if flags & 4 != 0 {
            fill_digests(rest, digests, max_data);
        }
        let frame = match datamover_tcp::frame::complete_frame(rest, digests, max_data) {
            Ok(Some(f)) => f,
            Ok(None) | Err(_) => {
                // The one-shot decoder must not panic on what the framer refused either.
                let _ = iscsi_wire::decode_pdu(rest, digests, max_data);
                return;
            }
        };
        let total = frame.total_len();
        let bytes = Bytes::copy_from_slice(&rest[..total]);
        let digest_ok = frame.verify_data_digest(&bytes).is_ok();
        let once = iscsi_wire::decode_pdu(rest, digests, max_data);
        match Bhs::decode(&frame.head) {
            Ok(d) => {
                let pdu = frame.pdu(d.bhs.clone(), &bytes);
                let once = once.expect("decode_pdu refused a frame the framer took");
                assert_eq!(once.consumed, total, "decode_pdu and the framer disagree");
                assert_eq!(once.pdu, pdu);
                if digest_ok {
                    if let Some((got, _)) = frame.data_digest_parts(&bytes) {
                        assert_eq!(once.data_digest, Some(got));
                    }
                }
                check_bhs_round_trip(&d);
                if let Ok(ahs) = iscsi_wire::parse_ahs(&pdu.ahs) {
                    let _ = iscsi_wire::encode_ahs(&ahs);
                    if let Bhs::ScsiCommand(cmd) = &d.bhs {
                        let _ = iscsi_wire::full_cdb(cmd, &ahs);
                        let _ = iscsi_wire::lun_from_wire(cmd.lun);
                    }
                }
                match &d.bhs {
                    Bhs::LoginRequest(r) => {
                        let req = iscsi_login::LoginRequest::from_pdu(r, &pdu.data);
                        let _ = req.into_pdu();
                    }
                    Bhs::LoginResponse(r) => {
                        let rsp = iscsi_login::LoginResponse::from_pdu(r, &pdu.data);
                        let _ = rsp.into_pdu(1, 2, 3);
                    }
                    _ => {}
                }
                let _ = d.bhs.initiator_exp_stat_sn();
                let _ = d.bhs.advances_stat_sn();
            }
            Err(_) => assert!(once.is_err(), "decode_pdu took a BHS that does not decode"),
        }
        at += total;
    }
}

/// A decoded BHS, encoded again, decodes to the same header and lengths.
fn check_bhs_round_trip(d: &iscsi_wire::DecodedBhs) {
    let enc = d.bhs.encode(d.ahs_len, d.data_len);
    let again = Bhs::decode(&enc).expect("an encoded BHS decodes");
    assert_eq!(again, *d, "BHS round trip");
}

/// iSER: a received Send (`iser::parse_send`: iSER header, BHS, declared lengths against
/// the Send's size), the iSER header alone and the CM private-data word.
///
/// Input: an options byte (bit 0: the login-phase limit of 8 KiB of data instead of
/// Linux's 128 KiB), then the Send. Checks: a parsed Send laid out again
/// (`encode_send`) parses to the same PDU.
pub fn iser(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let max_data = if flags & 1 != 0 {
        iser::LOGIN_DATA_MAX
    } else {
        128 * 1024
    };
    let send = Bytes::copy_from_slice(inp.rest());
    let _ = iser::IserHeader::decode(&send);
    let cm = iser::CmFlags::decode(&send);
    let _ = iser::CmFlags::send_invalidate(cm, iser::CmFlags::ours(true));
    if let Ok(s) = iser::parse_send(&send, max_data) {
        let mut out = vec![0u8; iser::send_len(&s.pdu)];
        let n = iser::encode_send(&s.header, &s.pdu, &mut out);
        let again = iser::parse_send(&Bytes::from(out[..n].to_vec()), max_data)
            .expect("a Send laid out again parses");
        assert_eq!(again.header, s.header);
        assert_eq!(again.pdu, s.pdu);
    }
}

/// MPA connection set-up, both sides: a Request as the responder reads it (frame length,
/// decode, validation, the RNIC listener's length check, the Reply or Reject built for it)
/// and a Reply as the initiator reads it (decode, `process_reply` against our Request).
///
/// Input: two option bytes for our side (revision, CRC, peer-to-peer, IRD/ORD), then
/// the frame.
pub fn mpa(data: &[u8]) {
    use iwarp::mpa::{self, LocalParams, MpaKind};
    use iwarp::MpaFrame;
    let mut inp = Input::new(data);
    let o = inp.u8();
    let ird_ord = inp.u8();
    let local = LocalParams {
        revision: if o & 1 != 0 { 1 } else { 2 },
        crc: o & 2 != 0,
        ird: u16::from(ird_ord & 0x0f),
        ord: u16::from(ird_ord >> 4),
        p2p: o & 4 != 0,
        private_data: if o & 8 != 0 {
            iser::CmFlags::ours(true).encode().to_vec()
        } else {
            Vec::new()
        },
    };
    let frame = inp.rest();
    let _ = MpaFrame::frame_len(frame);
    let _ = rnic::Request::frame_len(frame);
    for limit in [256, mpa::MAX_PRIVATE_DATA] {
        if let Ok((f, used)) = MpaFrame::decode(frame, MpaKind::Request, limit) {
            assert!(used <= frame.len());
            let _ = iser::CmFlags::decode(&f.private_data);
            if let Ok(req) = mpa::parse_request(f) {
                let _ = mpa::build_reject(&req, b"no");
                if let Ok((reply, neg)) = mpa::build_reply(&req, &local) {
                    // Our own Reply must decode, and the initiator that sent this Request
                    // must accept it.
                    let bytes = reply.encode();
                    let (back, _) = MpaFrame::decode(&bytes, MpaKind::Reply, mpa::MAX_PRIVATE_DATA)
                        .expect("our Reply decodes");
                    assert_eq!(back, reply);
                    let _ = neg;
                }
            }
        }
        if let Ok((f, _)) = MpaFrame::decode(frame, MpaKind::Reply, limit) {
            let _ = mpa::process_reply(&local, &f);
        }
    }
    let _ = iwarp::Rfc6581::decode(frame);
    let _ = mpa::build_request(&local).encode();
}

/// DDP/RDMAP as the RNIC receives it: MPA FPDUs (length, padding, CRC), the DDP header of
/// each, an RDMA Read Request's body and a Terminate's.
///
/// Input: an options byte (bit 0: MPA CRC on, bit 1: fill in correct CRCs), then a byte
/// stream of FPDUs. Checks: a decoded DDP header encodes to the same bytes' meaning.
pub fn ddp_rdmap(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let crc = flags & 1 != 0;
    let mut buf = inp.rest().to_vec();
    // The bodies alone, as a Terminate or Read Request arrives after its header.
    let _ = iwarp::Terminate::decode(&buf);
    let _ = iwarp::ReadRequest::decode(&buf);
    let mut at = 0;
    // Bounded: every round consumes a whole FPDU (at least 6 bytes).
    for _ in 0..256 {
        let rest = &mut buf[at..];
        if crc && flags & 2 != 0 && rest.len() >= 2 {
            let ulpdu = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            let layout = iwarp::FpduLayout::new(ulpdu);
            if rest.len() >= layout.total() {
                let body = 2 + ulpdu + layout.pad;
                let c = iwarp::crc::Crc32c::new().update(&rest[..body]).wire_bytes();
                rest[body..body + 4].copy_from_slice(&c);
            }
        }
        let (range, used) = match iwarp::fpdu::decode(rest, crc) {
            Ok(Some(x)) => x,
            Ok(None) | Err(_) => return,
        };
        assert!(used > range.end && used <= rest.len());
        let ulpdu = &rest[range];
        if let Ok(h) = iwarp::DdpHeader::decode(ulpdu) {
            let again = iwarp::DdpHeader::decode(&h.to_bytes()).expect("own header decodes");
            assert_eq!(again, h, "DDP header round trip");
            let payload = &ulpdu[h.len()..];
            match h.opcode() {
                iwarp::Opcode::ReadRequest => {
                    if let Ok(rr) = iwarp::ReadRequest::decode(payload) {
                        assert_eq!(iwarp::ReadRequest::decode(&rr.encode()), Ok(rr));
                    }
                }
                iwarp::Opcode::Terminate => {
                    if let Ok(t) = iwarp::Terminate::decode(payload) {
                        let _ = t.code.to_string();
                        let again =
                            iwarp::Terminate::decode(&t.encode()).expect("own Terminate decodes");
                        assert_eq!(again.code, t.code);
                    }
                }
                _ => {}
            }
        }
        at += used;
    }
}
