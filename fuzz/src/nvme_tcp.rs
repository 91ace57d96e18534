//! NVMe/TCP: the `nvme-tcp` crate's streaming decoder (both roles) with an encode → decode
//! round trip of every PDU it accepts, and the controller queue machine driven by the same
//! bytes, whose every output must decode as a host would decode it.

use nvme_tcp::decoder::{DecodeError, Decoder, DecoderConfig, Role};
use nvme_tcp::pdu::{encode, Encoded, Framing, IcReq, Pdu, PduHeader};
use nvme_tcp::queue::{Action, ControllerQueue, QueueConfig};
use nvme_tcp::sqe::DataDirection;
use nvme_tcp::{Cqe, Status};

use crate::Input;

const MAX_DATA: u32 = 65536;
const MAX_IN_CAPSULE: u32 = 16384;

/// Writes correct header and data digests into every PDU of `buf` whose flags ask for
/// them, so that the fuzzer gets past the digest checks.
fn fill_digests(buf: &mut [u8]) {
    let mut at = 0;
    for _ in 0..4096 {
        let Some(ch) = buf.get(at..at + 8) else {
            return;
        };
        let (flags, hlen, pdo) = (ch[1], usize::from(ch[2]), usize::from(ch[3]));
        let plen = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]) as usize;
        let Some(pdu) = buf.get_mut(at..at.saturating_add(plen)) else {
            return;
        };
        if plen < 8 {
            return;
        }
        if flags & 1 != 0 && hlen + 4 <= plen {
            let crc = digest::crc32c_le_bytes(&pdu[..hlen]);
            pdu[hlen..hlen + 4].copy_from_slice(&crc);
        }
        if flags & 2 != 0 && pdo + 4 <= plen {
            let crc = digest::crc32c_le_bytes(&pdu[pdo..plen - 4]);
            pdu[plen - 4..].copy_from_slice(&crc);
        }
        at += plen;
    }
}

fn decoder(role: Role, framing: Framing) -> Decoder {
    let mut c = DecoderConfig::new(role, MAX_DATA, MAX_IN_CAPSULE);
    c.framing = framing;
    Decoder::new(c)
}

/// Re-encodes `pdu` and decodes it again: it must come back the same.
fn round_trip(pdu: &Pdu, role: Role, framing: Framing) {
    let bytes = encode(&pdu.header, &[&pdu.data], &framing).to_vec();
    let mut input = &bytes[..];
    let again = decoder(role, framing).decode(&mut input);
    assert!(input.is_empty(), "re-encoded PDU not consumed whole");
    assert_eq!(
        again,
        Ok(Some(pdu.clone())),
        "re-encoded PDU decodes differently"
    );
}

fn decode_stream(bytes: &[u8], role: Role, framing: Framing) {
    let mut d = decoder(role, framing);
    let mut input = bytes;
    for _ in 0..=bytes.len() {
        match d.decode(&mut input) {
            Ok(Some(pdu)) => round_trip(&pdu, role, framing),
            Err(DecodeError::DataDigest { pdu }) => round_trip(&pdu, role, framing),
            Ok(None) => return,
            Err(DecodeError::Fatal(e)) => {
                assert!(e.header.len() <= nvme_tcp::TERM_REQ_MAX_DATA);
                return;
            }
        }
    }
}

/// Decodes what the controller sent as the host would: whole, well-formed PDUs.
fn host_decodes(bytes: &[u8], framing: Framing) {
    let mut d = Decoder::new(DecoderConfig {
        framing,
        ..DecoderConfig::new(Role::Host, MAX_DATA, 0)
    });
    let mut input = bytes;
    for _ in 0..=bytes.len() {
        if input.is_empty() {
            return;
        }
        match d.decode(&mut input) {
            Ok(Some(_)) => {}
            other => panic!("the controller sent a PDU the host refuses: {other:?}"),
        }
    }
}

fn sent(pdus: &[Encoded<'_>], framing: Framing) {
    for p in pdus {
        host_decodes(&p.to_vec(), framing);
    }
}

/// Runs the queue machine over `stream` fed in `chunk`-byte pieces, answering every
/// command with an even CID (reads with zeros).
fn drive_queue(stream: &[u8], chunk: usize, flow_control_off: bool) {
    let config = QueueConfig {
        maxh2cdata: 4096,
        max_in_capsule: MAX_IN_CAPSULE,
        max_transfer: MAX_DATA,
        max_r2t_len: 16384,
        c2h_cut: 4096,
        sq_entries: 16,
        ..QueueConfig::default()
    };
    let mut q = ControllerQueue::new(config);
    q.set_sq(16, flow_control_off);
    let zeros = vec![0u8; MAX_DATA as usize];
    for piece in stream.chunks(chunk) {
        for action in q.receive(piece) {
            let framing = q.tx_framing();
            match action {
                Action::Send(b) => host_decodes(&b, framing),
                Action::Execute(cmd) => {
                    let cid = cmd.sqe.cid();
                    if cid & 1 != 0 {
                        continue;
                    }
                    let cqe = Cqe::new(cid, Status::SUCCESS);
                    // A fatal error later in the same input closes the queue, which
                    // then knows no command; until then every executed command is answered.
                    let pdus = if cmd.sqe.direction() == DataDirection::ControllerToHost {
                        let n = (cmd.sqe.sgl().length as usize).min(zeros.len());
                        q.respond_with_data(cqe, &[&zeros[..n]])
                    } else {
                        q.respond(cqe).map(|p| vec![p])
                    };
                    match pdus {
                        Ok(pdus) => sent(&pdus, framing),
                        Err(e) => assert!(!q.is_ready(), "an executed command refused: {e}"),
                    }
                }
                Action::Close(_) => return,
            }
        }
    }
}

/// Input: an options byte (bit 0 header digest, bit 1 data digest, bit 2 fill in correct
/// digests, bit 3 start the queue's stream with an ICReq asking for those digests, bit 4
/// SQ flow control off, bits 7:5 the receiver's data alignment), a byte giving the size of
/// the pieces the queue is fed, then the host's byte stream.
pub fn nvme_tcp_pdu(data: &[u8]) {
    let mut inp = Input::new(data);
    let opts = inp.u8();
    let chunk = usize::from(inp.u8()) + 1;
    let framing = Framing {
        hdgst: opts & 1 != 0,
        ddgst: opts & 2 != 0,
        pda: opts >> 5,
    };
    let mut stream = inp.rest().to_vec();
    if opts & 4 != 0 {
        fill_digests(&mut stream);
    }
    decode_stream(&stream, Role::Controller, framing);
    decode_stream(&stream, Role::Host, framing);
    let mut host = Vec::new();
    if opts & 8 != 0 {
        let ic = IcReq {
            pfv: 0,
            hpda: framing.pda,
            hdgst: framing.hdgst,
            ddgst: framing.ddgst,
            maxr2t: 0,
        };
        host = encode(&PduHeader::IcReq(ic), &[], &Framing::default()).to_vec();
    }
    host.extend_from_slice(&stream);
    drive_queue(&host, chunk, opts & 16 != 0);
}

/// Seed inputs written by hand (no capture has NVMe/TCP yet): a host's session (Connect with
/// its data, Property Get, in-capsule and R2T writes with their H2CData, a read, a flush,
/// a TermReq) under several digest options, and a controller's PDUs for the host decoder.
pub fn seeds() -> Vec<Vec<u8>> {
    use nvme_tcp::pdu::{DataHeader, IcResp, R2t, TermReq};
    use nvme_tcp::sqe::{fabrics, nvm, SglDescriptor, Sqe};
    let mut seeds = Vec::new();
    for opts in [0x0C_u8, 0x0F, 0x1D, 0x2E] {
        let f = Framing {
            hdgst: opts & 1 != 0,
            ddgst: opts & 2 != 0,
            pda: opts >> 5,
        };
        let mut s = vec![opts, 0xFF];
        let mut put = |h: PduHeader, d: &[u8]| s.extend(encode(&h, &[d], &f).to_vec());
        let connect = fabrics::Connect {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 5000,
        };
        let cdata = fabrics::ConnectData {
            hostid: [1; 16],
            cntlid: fabrics::CNTLID_DYNAMIC,
            subnqn: "nqn.2026-11.org.ironsan:lun0".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:0".into(),
        };
        put(PduHeader::CapsuleCmd(connect.to_sqe(0)), &cdata.to_bytes());
        let prop = fabrics::Property {
            offset: fabrics::reg::CAP,
            eight_bytes: true,
            value: 0,
        };
        put(
            PduHeader::CapsuleCmd(prop.to_sqe(fabrics::PROPERTY_GET, 2)),
            &[],
        );
        let mut w = Sqe::rw(nvm::WRITE, 4, 1, 8, 1);
        w.set_sgl(SglDescriptor::in_capsule(512));
        put(PduHeader::CapsuleCmd(w), &[0xA5; 512]);
        let mut w = Sqe::rw(nvm::WRITE, 6, 1, 0, 16);
        w.set_sgl(SglDescriptor::transport(8192));
        put(PduHeader::CapsuleCmd(w), &[]);
        for (at, last) in [(0, false), (4096, true)] {
            let d = DataHeader {
                cid: 6,
                ttag: 0,
                offset: at,
                last,
                success: false,
            };
            put(PduHeader::H2CData(d), &[0x3C; 4096]);
        }
        let mut r = Sqe::rw(nvm::READ, 8, 1, 0, 8);
        r.set_sgl(SglDescriptor::transport(4096));
        put(PduHeader::CapsuleCmd(r), &[]);
        let mut fl = Sqe::new(nvm::FLUSH, 10);
        fl.set_sgl(SglDescriptor::transport(0));
        put(PduHeader::CapsuleCmd(fl), &[]);
        put(PduHeader::H2CTermReq(TermReq { fes: 2, fei: 0 }), &[0; 24]);
        seeds.push(s);
    }
    let f = Framing::default();
    let mut s = vec![0x00, 0x00];
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        hdgst: false,
        ddgst: false,
        maxh2cdata: 131072,
    };
    for (h, d) in [
        (PduHeader::IcResp(resp), &[][..]),
        (
            PduHeader::R2T(R2t {
                cid: 6,
                ttag: 0,
                offset: 0,
                length: 8192,
            }),
            &[],
        ),
        (
            PduHeader::C2HData(DataHeader {
                cid: 8,
                ttag: 0,
                offset: 0,
                last: true,
                success: true,
            }),
            &[7; 512],
        ),
        (PduHeader::CapsuleResp(Cqe::new(6, Status::SUCCESS)), &[]),
        (PduHeader::C2HTermReq(TermReq { fes: 1, fei: 2 }), &[0; 8]),
    ] {
        s.extend(encode(&h, &[d], &f).to_vec());
    }
    seeds.push(s);
    seeds
}
